"""The read-only history API: keys, per-node counts, the placement ledger and the
outcomes report.

For scripts and dashboards. Every view needs an authenticated user (session or
`Authorization: Token ...`) with the view permission on the history models; nothing
here writes. The extender routes are separate and unauthenticated.
"""

from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

import django_filters
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Model, Q, QuerySet
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import generics, serializers
from rest_framework.authentication import SessionAuthentication, TokenAuthentication
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import PageNumberPagination
from rest_framework.permissions import BasePermission
from rest_framework.renderers import BrowsableAPIRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.reverse import reverse
from rest_framework.views import APIView

from history import outcomes, queries, workspaces
from history.labels import KEY_KINDS, key_kind
from history.models import KeyNode, Placement
from history.permissions import can_view_history
from history.queries import KeyTotal
from history.validation import (
    RANGE_TEXT,
    is_instant_in_range,
    nul_message,
    nul_parameter,
)


class HistoryViewPermission(BasePermission):
    """Authenticated users holding the view permission on the history models."""

    message = "You need the view permission on pipeline history."

    def has_permission(self, request: Request, view: APIView) -> bool:
        return bool(request.user) and can_view_history(request.user)


class HistoryPagination(PageNumberPagination):
    page_size = 100
    page_size_query_param = "page_size"
    max_page_size = 1000


_MT = TypeVar("_MT", bound=Model, covariant=True)


class HistoryAPIView(generics.ListAPIView[_MT]):
    """Base of the history views: auth, permission, renderers, pagination."""

    # Token first: an anonymous request gets 401 with `WWW-Authenticate: Token`.
    authentication_classes = [TokenAuthentication, SessionAuthentication]
    permission_classes = [HistoryViewPermission]
    renderer_classes = [JSONRenderer, BrowsableAPIRenderer]
    pagination_class = HistoryPagination

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        """After authentication and permissions: refuse a NUL character anywhere in
        the path or the query (400) before it reaches a query."""
        super().initial(request, *args, **kwargs)
        name = nul_parameter(kwargs) or nul_parameter(request.query_params)
        if name:
            raise ValidationError({name: [nul_message(name)]})


class KeyTotalSerializer(serializers.Serializer[KeyTotal]):
    key = serializers.CharField()
    kind = serializers.SerializerMethodField(
        help_text="segment (jenkins), prefix (jenkins-java-*) or pipeline "
        "(jenkins-java-maven-app1$)."
    )
    total = serializers.IntegerField(help_text="Sum of the counts over all nodes.")
    nodes = serializers.IntegerField(help_text="Number of nodes with a row.")
    last_placed_at = serializers.DateTimeField(allow_null=True)

    def get_kind(self, row: KeyTotal) -> str:
        return key_kind(row["key"])


class KeyNodeSerializer(serializers.ModelSerializer[KeyNode]):
    class Meta:
        model = KeyNode
        fields = ["key", "node", "count", "last_placed_at", "created", "updated"]


class PlacementSerializer(serializers.ModelSerializer[Placement]):
    active = serializers.SerializerMethodField()

    class Meta:
        model = Placement
        fields = [
            "pod_uid",
            "namespace",
            "name",
            "label",
            "node",
            "bound_at",
            "finished_at",
            "active",
            "warmth",
            "resource_version",
        ]

    def get_active(self, obj: Placement) -> bool:
        return obj.finished_at is None


# django-filter ships no type information: its classes are Any to mypy.
class KeyFilterSet(django_filters.FilterSet):  # type: ignore[misc]
    search = django_filters.CharFilter(
        field_name="key", lookup_expr="icontains", help_text="Part of the key."
    )
    kind = django_filters.ChoiceFilter(
        choices=[(kind, text) for kind, text in KEY_KINDS.items()],
        method="filter_kind",
        help_text="Only keys of this kind.",
    )

    def filter_kind(
        self, queryset: QuerySet[KeyNode, KeyTotal], name: str, value: str
    ) -> QuerySet[KeyNode, KeyTotal]:
        return queryset.filter(queries.keys_of_kind(value))


# Its rows are dicts (`key_totals`, a values() query), not KeyNode instances.
class KeyListView(HistoryAPIView[Any]):
    """Distinct keys with their total count and node count, busiest first."""

    serializer_class = KeyTotalSerializer
    filter_backends = [DjangoFilterBackend]
    filterset_class = KeyFilterSet

    def get_queryset(self) -> QuerySet[KeyNode, KeyTotal]:
        return queries.key_totals()


class KeyNodeListView(HistoryAPIView[KeyNode]):
    """The rows of one key: one per node, highest count first."""

    serializer_class = KeyNodeSerializer

    def get_queryset(self) -> QuerySet[KeyNode]:
        rows = KeyNode.objects.filter(key=self.kwargs["key"]).order_by("-count", "node")
        if not rows.exists():
            raise NotFound(f"No history for key {self.kwargs['key']!r}.")
        return rows


class BoundedIsoDateTimeField(django_filters.fields.IsoDateTimeField):  # type: ignore[misc]
    """An ISO 8601 date-time within the range a query can be built for."""

    def to_python(self, value: str | datetime | None) -> datetime | None:
        moment: datetime | None = super().to_python(value)
        if moment is not None and not is_instant_in_range(moment):
            raise DjangoValidationError(
                f"Enter a date-time {RANGE_TEXT}.", code="out_of_range"
            )
        return moment


class BoundedIsoDateTimeFilter(django_filters.IsoDateTimeFilter):  # type: ignore[misc]
    field_class = BoundedIsoDateTimeField


class PlacementFilterSet(django_filters.FilterSet):  # type: ignore[misc]
    key = django_filters.CharFilter(
        method="filter_key", help_text="A key: label contains it as a whole segment."
    )
    node = django_filters.CharFilter(field_name="node")
    namespace = django_filters.CharFilter(field_name="namespace")
    label = django_filters.CharFilter(field_name="label", help_text="Exact label.")
    since = BoundedIsoDateTimeFilter(
        field_name="bound_at", lookup_expr="gte", help_text="Bound at or after."
    )
    until = BoundedIsoDateTimeFilter(
        field_name="bound_at", lookup_expr="lt", help_text="Bound before."
    )
    active = django_filters.BooleanFilter(
        method="filter_active", help_text="true: still running; false: finished."
    )

    class Meta:
        model = Placement
        fields = ["key", "node", "namespace", "label", "since", "until", "active"]

    def filter_key(
        self, queryset: QuerySet[Placement], name: str, value: str
    ) -> QuerySet[Placement]:
        segment = queries.placements_with_key(key=value)
        return queryset.filter(pk__in=segment.values("pk"))

    def filter_active(
        self, queryset: QuerySet[Placement], name: str, value: bool
    ) -> QuerySet[Placement]:
        return queryset.filter(Q(finished_at__isnull=value))


class PlacementListView(HistoryAPIView[Placement]):
    """The placement ledger, newest first, filtered by key, node, label, date."""

    serializer_class = PlacementSerializer
    queryset = Placement.objects.order_by("-bound_at", "-pk")
    filter_backends = [DjangoFilterBackend]
    filterset_class = PlacementFilterSet


class OutcomeQuerySerializer(serializers.Serializer[dict[str, Any]]):
    label = serializers.CharField(  # type: ignore[assignment]  # the JSON key
        required=False,
        allow_blank=True,
        help_text="A pipeline key or label value (a label covers its children).",
    )
    since = serializers.CharField(
        required=False,
        help_text="ISO 8601 date or date-time; default 30 days ago.",
    )

    def validate_since(self, value: str) -> datetime:
        try:
            return outcomes.parse_instant(value)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from exc


class WarmthFiguresSerializer(serializers.Serializer[dict[str, Any]]):
    runs = serializers.IntegerField(help_text="Succeeded, with both times recorded.")
    failed = serializers.IntegerField(help_text="Failed.")
    startup_p50 = serializers.FloatField(allow_null=True)
    startup_p90 = serializers.FloatField(allow_null=True)
    run_p50 = serializers.FloatField(allow_null=True)
    run_p90 = serializers.FloatField(allow_null=True)


class WarmthClassesSerializer(serializers.Serializer[dict[str, Any]]):
    exact = WarmthFiguresSerializer()
    partial = WarmthFiguresSerializer()  # type: ignore[assignment]  # the JSON key
    cold = WarmthFiguresSerializer()


class PipelineOutcomeSerializer(WarmthClassesSerializer):
    label = serializers.CharField()  # type: ignore[assignment]  # the JSON key
    saved_seconds = serializers.FloatField(allow_null=True)
    saved_reason = serializers.CharField(allow_null=True)


class OutcomeReportSerializer(serializers.Serializer[dict[str, Any]]):
    overall = WarmthClassesSerializer()
    pipelines = PipelineOutcomeSerializer(many=True)
    since = serializers.DateTimeField()
    until = serializers.DateTimeField()


class OutcomeReportView(APIView):
    """Startup and run time by warmth and the time saved, per label and overall."""

    authentication_classes = HistoryAPIView.authentication_classes
    permission_classes = HistoryAPIView.permission_classes
    renderer_classes = HistoryAPIView.renderer_classes
    # The report, given the query's label and since.
    report: Callable[..., dict[str, Any]] = staticmethod(outcomes.outcome_report)

    @extend_schema(
        parameters=[OutcomeQuerySerializer], responses=OutcomeReportSerializer
    )
    def get(self, request: Request) -> Response:
        query = OutcomeQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        return Response(self.report(**query.validated_data))


class DepthFiguresSerializer(WarmthFiguresSerializer):
    depth = serializers.CharField(
        help_text='Other pipelines placed on the node since: "0", "4-7", "16+" or '
        '"before the window".'
    )


class AgeFiguresSerializer(WarmthFiguresSerializer):
    age = serializers.CharField(
        help_text='Time since the pipeline was last placed on the node: "0-10 min", '
        '"1 d-3 d", "7 d+" or "before the window".'
    )


class WorkspaceReportSerializer(serializers.Serializer[dict[str, Any]]):
    depths = DepthFiguresSerializer(many=True)
    ages = AgeFiguresSerializer(many=True)
    partial = WarmthFiguresSerializer()  # type: ignore[assignment]  # the JSON key
    cold = WarmthFiguresSerializer()
    gone_from = serializers.IntegerField(
        allow_null=True,
        help_text="The first depth whose exact placements start like cold ones.",
    )
    gone_reason = serializers.CharField(allow_null=True)
    gone_after = serializers.IntegerField(
        allow_null=True,
        help_text="The first age, in seconds, whose exact placements start like "
        "cold ones.",
    )
    gone_after_reason = serializers.CharField(allow_null=True)
    since = serializers.DateTimeField()
    until = serializers.DateTimeField()


@extend_schema_view(
    get=extend_schema(
        parameters=[OutcomeQuerySerializer], responses=WorkspaceReportSerializer
    )
)
class WorkspaceReportView(OutcomeReportView):
    """Startup of exact placements by depth and by age: how long workspaces last on
    the nodes."""

    report = staticmethod(workspaces.workspace_report)


# A drf-spectacular endpoint: path, path regex, method, view.
_Endpoint = tuple[str, str, str, Callable[..., Any]]


def only_api_paths(endpoints: list[_Endpoint]) -> list[_Endpoint]:
    """drf-spectacular hook: the schema documents the history API only."""
    return [
        endpoint
        for endpoint in endpoints
        if endpoint[0].startswith("/api/") and endpoint[0] != "/api/schema/"
    ]


class ApiRootView(APIView):
    """GET /api/: where the history API's endpoints are."""

    authentication_classes = HistoryAPIView.authentication_classes
    permission_classes = HistoryAPIView.permission_classes
    renderer_classes = HistoryAPIView.renderer_classes

    @extend_schema(exclude=True)  # links only: the schema documents the data routes
    def get(self, request: Request) -> Response:
        keys = reverse("api-keys", request=request)
        return Response(
            {
                "keys": keys,
                "key_nodes": f"{keys}{{key}}/nodes/",
                "placements": reverse("api-placements", request=request),
                "outcomes": reverse("api-outcomes", request=request),
                "workspaces": reverse("api-workspaces", request=request),
                "schema": reverse("api-schema", request=request),
            }
        )
