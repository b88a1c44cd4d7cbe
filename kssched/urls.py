from django.contrib import admin
from django.urls import include, path

admin.site.site_header = "ks-scheduler"
admin.site.site_title = "ks-scheduler admin"
admin.site.index_title = "Pipeline history"

urlpatterns = [
    path("", include("extender.urls")),
    path("admin/", admin.site.urls),
]
