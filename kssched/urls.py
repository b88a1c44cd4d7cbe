from django.contrib import admin
from django.urls import include, path

from kssched import health, metrics

admin.site.site_header = "ks-scheduler"
admin.site.site_title = "ks-scheduler admin"
admin.site.index_title = "Pipeline history"

urlpatterns = [
    path("", include("extender.urls")),
    path("admin/", admin.site.urls),
    # No trailing slashes and no redirects: probes and scrapers call these as is.
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", metrics.metrics_view, name="metrics"),
]
