from django.urls import path

from extender import views, webhook

# No trailing slashes: kube-scheduler joins urlPrefix and verb with a single "/", and
# a redirect would turn its POST into a GET.
urlpatterns = [
    path(
        "scheduler/predicates/alwaystrue",
        views.AlwaysTruePredicateView.as_view(),
        name="predicates-alwaystrue",
    ),
    path(
        "scheduler/priorities/pipeline",
        views.PipelinePriorityView.as_view(),
        name="priorities-pipeline",
    ),
    path("scheduler/explain", views.ExplainView.as_view(), name="explain"),
    path("version", views.VersionView.as_view(), name="version"),
    # Webhook mode: called by the API server over TLS, from outside the pod.
    path("webhook/mutate", webhook.WebhookMutateView.as_view(), name="webhook-mutate"),
]
