"""Routes of the read-only history API, mounted at /api/ by kssched/urls.py."""

from django.urls import path
from drf_spectacular.views import SpectacularAPIView
from rest_framework.authentication import SessionAuthentication, TokenAuthentication

from history import api

urlpatterns = [
    path("", api.ApiRootView.as_view(), name="api-root"),
    path("keys/", api.KeyListView.as_view(), name="api-keys"),
    path("keys/<str:key>/nodes/", api.KeyNodeListView.as_view(), name="api-key-nodes"),
    path("placements/", api.PlacementListView.as_view(), name="api-placements"),
    path("outcomes/", api.OutcomeReportView.as_view(), name="api-outcomes"),
    path(
        "outcomes/workspaces/",
        api.WorkspaceReportView.as_view(),
        name="api-workspaces",
    ),
    path(
        "schema/",
        SpectacularAPIView.as_view(
            authentication_classes=[TokenAuthentication, SessionAuthentication],
            # The schema describes the data: same permission as the data.
            permission_classes=[api.HistoryViewPermission],
        ),
        name="api-schema",
    ),
]
