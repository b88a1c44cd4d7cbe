"""List filters of the history admin: by key, by kind of key, by node (the busiest
values), by count range and by pod state."""

from typing import Any

from django.contrib import admin
from django.db.models import Count, Q, QuerySet
from django.http import HttpRequest

from history import queries
from history.labels import KEY_KINDS
from history.models import KeyNode, Placement

# Filters list the busiest values only: a cluster may have thousands of nodes.
FILTER_CHOICES = 20


class BusiestValuesFilter(admin.SimpleListFilter):
    """Filter by a value, offering the busiest ones (and the one selected)."""

    def busiest(self) -> list[str]:
        raise NotImplementedError

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]
    ) -> list[tuple[str, str]]:
        values = self.busiest()
        selected = self.value()
        if selected and selected not in values:
            values.append(selected)
        return [(value, value) for value in values]


class KeyFilter(BusiestValuesFilter):
    title = "key"
    parameter_name = "key"

    def busiest(self) -> list[str]:
        totals = queries.key_totals()[:FILTER_CHOICES]
        return [row["key"] for row in totals]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        key = self.value()
        if not key:
            return queryset
        if queryset.model is Placement:
            segment = queries.placements_with_key(key=key)
            return queryset.filter(pk__in=segment.values("pk"))
        return queryset.filter(key=key)


class KindFilter(admin.SimpleListFilter):
    """Segments (the Go tool's model, what `seed` reads), label prefixes
    (`jenkins-java-*`) or pipelines (`jenkins-java-maven-app1$`), in SQL."""

    title = "kind of key"
    parameter_name = "kind"

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]
    ) -> list[tuple[str, str]]:
        return [(kind, text.split(":")[0]) for kind, text in KEY_KINDS.items()]

    def queryset(
        self, request: HttpRequest, queryset: QuerySet[KeyNode]
    ) -> QuerySet[KeyNode]:
        kind = self.value()
        if kind in KEY_KINDS:
            return queryset.filter(queries.keys_of_kind(kind))
        return queryset


class NodeFilter(BusiestValuesFilter):
    title = "node"
    parameter_name = "node"

    def busiest(self) -> list[str]:
        rows = (
            Placement.objects.values("node")
            .annotate(n=Count("pk"))
            .order_by("-n", "node")[:FILTER_CHOICES]
        )
        nodes = [row["node"] for row in rows]
        if len(nodes) < FILTER_CHOICES:
            more = KeyNode.objects.exclude(node__in=nodes).values_list(
                "node", flat=True
            )
            nodes += list(
                more.distinct().order_by("node")[: FILTER_CHOICES - len(nodes)]
            )
        return nodes

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value():
            return queryset.filter(node=self.value())
        return queryset


class CountFilter(admin.SimpleListFilter):
    title = "count"
    parameter_name = "count_range"
    ranges = {
        "0": Q(count=0),
        "1-9": Q(count__gte=1, count__lte=9),
        "10-99": Q(count__gte=10, count__lte=99),
        "100+": Q(count__gte=100),
    }

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]
    ) -> list[tuple[str, str]]:
        return [(name, name) for name in self.ranges]

    def queryset(
        self, request: HttpRequest, queryset: QuerySet[KeyNode]
    ) -> QuerySet[KeyNode]:
        selected = self.value()
        if selected is not None and selected in self.ranges:
            return queryset.filter(self.ranges[selected])
        return queryset


class ActiveFilter(admin.SimpleListFilter):
    title = "pod state"
    parameter_name = "active"

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]
    ) -> list[tuple[str, str]]:
        return [("yes", "running (active)"), ("no", "finished")]

    def queryset(
        self, request: HttpRequest, queryset: QuerySet[Placement]
    ) -> QuerySet[Placement]:
        if self.value() == "yes":
            return queryset.filter(finished_at__isnull=True)
        if self.value() == "no":
            return queryset.filter(finished_at__isnull=False)
        return queryset
