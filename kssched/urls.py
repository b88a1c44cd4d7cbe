from django.contrib import admin
from django.urls import include, path
from django.views.generic import TemplateView

from extender.admin_views import pipeline_view
from kssched import health, metrics
from kssched.login import AdminLoginForm

admin.site.site_header = "ks-scheduler"
admin.site.site_title = "ks-scheduler admin"
admin.site.index_title = "Pipeline history"
# There is no public site to "view"; the index is the admin's home.
admin.site.site_url = None
# The app list in a side column leaves a change list too little room at 1280 px.
admin.site.enable_nav_sidebar = False
# Refuses usernames no account can have before they are authenticated (and recorded
# by django-axes).
admin.site.login_form = AdminLoginForm

urlpatterns = [
    # A newcomer's first stop: what this port serves, with links (no login, no query).
    path("", TemplateView.as_view(template_name="home.html"), name="home"),
    path("", include("extender.urls")),
    # Inside the admin (login and staff required); before admin/ so its catch-all
    # does not answer first.
    path(
        "admin/pipeline/",
        admin.site.admin_view(pipeline_view),
        name="admin-pipeline",
    ),
    path("admin/", admin.site.urls),
    # No trailing slashes and no redirects: probes and scrapers call these as is.
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", metrics.metrics_view, name="metrics"),
    path("api/", include("history.api_urls")),
]
