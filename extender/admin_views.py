"""The admin's pipeline page: why a pipeline's pods land where they do.

For a key (`maven`) or a full label value (`jenkins-java-maven-1`) it shows the counts
the scores are built from as a server-side SVG bar chart (no scripts, no CDN), the
scores every known node would get now, and the recent placements from the ledger.
It lives in `extender` because it asks the scoring strategy to explain itself;
kssched/urls.py mounts it inside the admin (login and staff required).
"""

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.template.response import TemplateResponse

from extender.scoring.strategies import get_strategy
from history import labels, queries
from history.admin import refuse_nul_parameters
from history.models import KeyNode, NodeRecord, Placement

VIEW_PERMISSIONS = ("history.view_keynode", "history.view_placement")
# One bar per node with history, busiest first; a pipeline rarely warms more nodes.
MAX_BARS = 60
MAX_SCORE_ROWS = 500
RECENT_PLACEMENTS = 25
# Shown beside the score when the strategy explains them (the warm strategy does).
DETAIL_COLUMNS = (
    ("decayed_weight", "recency weight"),
    ("active_pods", "active pods"),
    ("penalty", "penalty"),
    ("policy", "policy"),
)

BAR_HEIGHT = 22
BAR_GAP = 6
LABEL_WIDTH = 220
PLOT_WIDTH = 520
VALUE_WIDTH = 110
# Darker is more specific: index 0 is the most general segment.
SEGMENT_COLOURS = ("#9ecae1", "#6baed6", "#4292c6", "#2171b5", "#08519c", "#08306b")


def known_nodes() -> list[str]:
    """Every node ks-scheduler has seen: from the Node watch and from the counts."""
    names = set(NodeRecord.objects.values_list("name", flat=True))
    names.update(KeyNode.objects.values_list("node", flat=True).distinct())
    return sorted(names)


def chart_bars(explanation: list[dict], segments: int) -> list[dict]:
    """Bar geometry for the nodes whose score comes from history, busiest first."""
    warm = [row for row in explanation if row["raw_count"] > 0]
    warm.sort(key=lambda row: (-row["raw_count"], row["node"]))
    warm = warm[:MAX_BARS]
    top = max((row["raw_count"] for row in warm), default=0) or 1
    bars = []
    for position, row in enumerate(warm):
        index = row.get("segment_index") or 0
        # The most specific segment always gets the darkest colour.
        shade = len(SEGMENT_COLOURS) - segments + index
        width = max(2, round(PLOT_WIDTH * row["raw_count"] / top))
        bars.append(
            {
                "node": row["node"],
                "count": row["raw_count"],
                "segment": row["matched_segment"],
                "score": row["score"],
                "y": position * (BAR_HEIGHT + BAR_GAP),
                "width": width,
                "value_x": LABEL_WIDTH + width + 6,
                "colour": SEGMENT_COLOURS[min(max(shade, 0), len(SEGMENT_COLOURS) - 1)],
            }
        )
    return bars


def detail_text(value) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def recent_placements(value: str, keys: list[str]):
    """A key matches as a whole segment; a label matches itself and its children."""
    if len(keys) == 1:
        placements = queries.placements_with_key(key=keys[0])
    else:
        placements = Placement.objects.filter(label=value) | Placement.objects.filter(
            label__startswith=f"{value}-"
        )
    return placements.order_by("-bound_at", "-pk")


def pipeline_view(request):
    """GET /admin/pipeline/?q=<key or label>."""
    if not request.user.has_perms(VIEW_PERMISSIONS):
        raise PermissionDenied
    refused = refuse_nul_parameters(request)
    if refused is not None:
        return refused
    value = request.GET.get("q", "").strip()
    keys = labels.split_pipeline_label(value)
    context = {
        **admin.site.each_context(request),
        "title": f"Pipeline {value}" if value else "Pipelines",
        "q": value,
        "keys": keys,
        "has_history": KeyNode.objects.exists() or Placement.objects.exists(),
        "busiest_keys": queries.key_totals()[:15],
    }
    if keys:
        strategy = get_strategy()
        explanation = strategy.explain(label=value, nodes=known_nodes())
        bars = chart_bars(explanation, len(keys))
        ranked = sorted(explanation, key=lambda row: (-row["score"], row["node"]))
        details = [
            (name, title)
            for name, title in DETAIL_COLUMNS
            if explanation and name in explanation[0]
        ]
        for row in explanation:
            row["details"] = [detail_text(row[name]) for name, _ in details]
        placements = recent_placements(value, keys)
        context.update(
            {
                "strategy": strategy.name,
                "segments": queries.key_totals().filter(key__in=keys),
                "bars": bars,
                "chart": {
                    "label_width": LABEL_WIDTH,
                    "label_x": LABEL_WIDTH - 8,
                    "bar_height": BAR_HEIGHT,
                    "text_y": BAR_HEIGHT - 6,
                    "width": LABEL_WIDTH + PLOT_WIDTH + VALUE_WIDTH,
                    "height": max(len(bars), 1) * (BAR_HEIGHT + BAR_GAP),
                },
                "scores": ranked[:MAX_SCORE_ROWS],
                "detail_titles": [title for _, title in details],
                "scores_hidden": max(0, len(ranked) - MAX_SCORE_ROWS),
                "placements": placements[:RECENT_PLACEMENTS],
                "placement_total": placements.count(),
                "active_total": placements.filter(finished_at__isnull=True).count(),
            }
        )
    return TemplateResponse(request, "admin/pipeline.html", context)
