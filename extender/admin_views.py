"""The admin's pipeline page: why a pipeline's pods land where they do.

For a key (`maven`), a label-path key (`jenkins-java-*`, shown as the label it
names) or a full label value (`jenkins-java-maven-1`) it shows each warm node's score
and what decides it (the key that made it warm, count, penalty) as a server-side
SVG bar chart (no scripts, no CDN), the scores every known node would get now,
startup and run time by warmth with the time warm placement saved
(`history.outcomes`), what warmth is worth to the pipeline and the weight its pull
gets (`admin_worth`), and the recent placements from the ledger.
It lives in `extender` because it asks the scoring strategy to explain itself;
kssched/urls.py mounts it inside the admin (login and staff required).
"""

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.template.response import TemplateResponse

from extender.admin_worth import worth_block
from extender.scoring.rules import MAX_SCORE
from extender.scoring.strategies import get_strategy
from history import labels, outcomes, queries
from history.admin_base import refuse_nul_parameters
from history.models import KeyNode, NodeRecord, Placement
from history.permissions import can_view_history

# One bar per node with history, busiest first; a pipeline rarely warms more nodes.
MAX_BARS = 60
MAX_SCORE_ROWS = 500
RECENT_PLACEMENTS = 25
# Shown beside the score when the strategy explains them (the warm strategy does).
DETAIL_COLUMNS = (
    ("decayed_weight", "recency weight"),
    ("active_pods", "active pods"),
    ("hotspot_penalty", "penalty: its pods"),
    ("load_penalty", "penalty: node load"),
    ("policy", "policy"),
)

BAR_HEIGHT = 22
BAR_GAP = 6
LABEL_WIDTH = 220
PLOT_WIDTH = 420
VALUE_WIDTH = 300
# A bar's colour is how the node's history matches the pipeline; its score is
# written on it, and the points the penalties took off trail it in light red.
MATCH_COLOURS = {"exact": "#1a7f4b", "partial": "#e08a1e", "other": "#8c8c8c"}
PENALTY_COLOUR = "#f4a6a0"
# What exact and partial mean for the keys the strategy reads: the label path
# (`warm`) or the segments (`seed`).
MATCH_MEANINGS = {
    "path": ("this very pipeline ran there", "a pipeline under a prefix of its label"),
    "segment": ("the most specific segment", "a more general one"),
}


# Startup and run time by warmth: per class, a median bar with a p90 whisker.
OUTCOME_MEASURES = (("startup", "startup", "#fd8d3c"), ("run", "run", "#4292c6"))
OUTCOME_LABEL_WIDTH = 110
OUTCOME_PLOT_WIDTH = 480
OUTCOME_VALUE_WIDTH = 260
OUTCOME_BAR = 16
OUTCOME_GROUP_GAP = 14


def outcome_chart(figures: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """Geometry of the startup/run chart for one report section ({warmth: S}).

    One group per warmth class with a bar per measure: its length is the median,
    a whisker reaches the p90, all on one scale. None when no class has a
    successful run.
    """
    top = max(
        (
            figures[w][f"{m}_p90"] or 0
            for w in outcomes.WARMTHS
            for m, _, _ in OUTCOME_MEASURES
        ),
        default=0,
    )
    if not top:
        return None
    scale = OUTCOME_PLOT_WIDTH / top
    group = len(OUTCOME_MEASURES) * OUTCOME_BAR + OUTCOME_GROUP_GAP
    bars = []
    for index, warmth in enumerate(outcomes.WARMTHS):
        for position, (measure, title, colour) in enumerate(OUTCOME_MEASURES):
            p50 = figures[warmth][f"{measure}_p50"]
            p90 = figures[warmth][f"{measure}_p90"]
            width = round(p50 * scale, 1) if p50 is not None else 0
            whisker = round(OUTCOME_LABEL_WIDTH + (p90 or 0) * scale, 1)
            bars.append(
                {
                    "warmth": warmth,
                    "measure": measure,
                    "title": title,
                    "colour": colour,
                    "p50": outcomes.number_text(p50),
                    "p90": outcomes.number_text(p90),
                    "p50_text": outcomes.duration_text(p50),
                    "p90_text": outcomes.duration_text(p90),
                    "runs": figures[warmth]["runs"],
                    "has_data": p50 is not None,
                    "is_first": position == 0,
                    "y": index * group + position * OUTCOME_BAR,
                    "width": max(width, 1) if p50 is not None else 0,
                    "whisker_x": whisker,
                    "value_x": max(whisker, OUTCOME_LABEL_WIDTH + width) + 6,
                }
            )
    return {
        "bars": bars,
        "label_width": OUTCOME_LABEL_WIDTH,
        "label_x": OUTCOME_LABEL_WIDTH - 8,
        "bar_height": OUTCOME_BAR - 3,
        "whisker_mid": (OUTCOME_BAR - 3) / 2,
        "text_y": OUTCOME_BAR - 5,
        "width": OUTCOME_LABEL_WIDTH + OUTCOME_PLOT_WIDTH + OUTCOME_VALUE_WIDTH,
        "height": len(outcomes.WARMTHS) * group,
        "legend": [(title, colour) for _, title, colour in OUTCOME_MEASURES],
    }


def outcome_cells(figures: dict[str, Any]) -> list[str]:
    """One warmth class as table cells: runs, failed, then p50/p90 in seconds."""
    names = ("startup_p50", "startup_p90", "run_p50", "run_p90")
    return [str(figures["runs"]), str(figures["failed"])] + [
        outcomes.number_text(figures[name]) for name in names
    ]


def saved_headline(report: dict[str, Any]) -> dict[str, Any]:
    """The time saved over the report's pipelines, or why it is not known."""
    total, counted = outcomes.total_saved(report)
    reason = None
    if total is None:
        pipelines = report["pipelines"]
        reason = (
            pipelines[0]["saved_reason"]
            if len(pipelines) == 1
            else f"no pipeline has {outcomes.MIN_RUNS} successful exact and "
            f"{outcomes.MIN_RUNS} cold runs yet"
        )
    return {
        "seconds": total,
        "text": outcomes.duration_text(total),
        "pipelines": counted,
        "reason": reason,
    }


def known_nodes() -> list[str]:
    """Every node ks-scheduler has seen: from the Node watch and from the counts."""
    names = set(NodeRecord.objects.values_list("name", flat=True))
    names.update(KeyNode.objects.values_list("node", flat=True).distinct())
    return sorted(names)


def chart_bars(
    explanation: list[dict[str, Any]], segments: int
) -> list[dict[str, Any]]:
    """Bar geometry for the nodes whose score comes from history, highest score first.

    A bar's length is the node's score (0 to MAX_SCORE, written on the bar); a light
    red part beyond it shows the points the penalties took off the score its history
    gives (`base_score`). Beside it, what decides: the key that made it warm (a
    segment for `seed`, a label-path key for `warm`) and its count, and the penalty.
    """
    warm = [row for row in explanation if row["raw_count"] > 0]
    warm.sort(key=lambda row: (-row["score"], -row["raw_count"], row["node"]))
    warm = warm[:MAX_BARS]
    scale = PLOT_WIDTH / MAX_SCORE
    bars = []
    for position, row in enumerate(warm):
        score = row["score"]
        index = row.get("segment_index")
        match = (
            "exact" if index == segments - 1 else "partial" if index is not None else ""
        )
        penalty = row.get("penalty") or 0
        base = row.get("base_score", score)
        taken = max(0, min(penalty, base - score)) if penalty else 0
        width = max(2, round(score * scale))
        penalty_width = round(taken * scale)
        decides = f"{row['matched_segment']} {row['raw_count']}"
        if penalty:
            decides += f", penalty {penalty}"
        bars.append(
            {
                "node": row["node"],
                "count": row["raw_count"],
                "segment": row["matched_segment"],
                "match": match or "other",
                "score": score,
                "penalty": penalty,
                "decides": decides,
                "y": position * (BAR_HEIGHT + BAR_GAP),
                "width": width,
                "penalty_x": LABEL_WIDTH + width,
                "penalty_width": penalty_width,
                "score_x": LABEL_WIDTH + width - 5,
                "value_x": LABEL_WIDTH + width + penalty_width + 6,
                "colour": MATCH_COLOURS[match or "other"],
            }
        )
    return bars


def detail_text(value: object) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def pipeline_view(request: HttpRequest) -> TemplateResponse:
    """GET /admin/pipeline/?q=<key or label>."""
    if not can_view_history(request.user):
        raise PermissionDenied
    refused = refuse_nul_parameters(request)
    if refused is not None:
        return refused
    # A label-path key (`jenkins-java-*`, `jenkins-java$`) looks up the label it names.
    value = labels.key_label(request.GET.get("q", "").strip())
    keys = labels.split_pipeline_label(value)
    context = {
        **admin.site.each_context(request),
        "title": f"Pipeline {value}" if value else "Pipelines",
        "q": value,
        "keys": keys,
        "has_history": KeyNode.objects.exists() or Placement.objects.exists(),
        "busiest_keys": queries.busiest_keys(15),
    }
    if keys:
        strategy = get_strategy()
        read_keys = strategy.keys_of(value)
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
        placements = queries.placements_of_pipeline(value=value).order_by(
            "-bound_at", "-pk"
        )
        report = outcomes.outcome_report(label=value)
        match_meanings = (
            MATCH_MEANINGS["path"]
            if labels.key_kind(read_keys[-1]) == "pipeline"
            else MATCH_MEANINGS["segment"]
        )
        context.update(
            {
                "outcomes": report,
                "outcome_rows": [
                    (warmth, outcome_cells(report["overall"][warmth]))
                    for warmth in outcomes.WARMTHS
                ],
                "outcome_chart": outcome_chart(report["overall"]),
                "saved": saved_headline(report),
                "outcome_days": outcomes.WINDOW.days,
                "worth": worth_block(value, keys, strategy.name),
                "strategy": strategy.name,
                "read_keys": read_keys,
                "segments": queries.key_totals().filter(key__in=read_keys),
                "bars": bars,
                "chart": {
                    "label_width": LABEL_WIDTH,
                    "label_x": LABEL_WIDTH - 8,
                    "bar_height": BAR_HEIGHT,
                    "text_y": BAR_HEIGHT - 6,
                    "width": LABEL_WIDTH + PLOT_WIDTH + VALUE_WIDTH,
                    "height": max(len(bars), 1) * (BAR_HEIGHT + BAR_GAP),
                    "max_score": MAX_SCORE,
                    "penalty_colour": PENALTY_COLOUR,
                    "legend": [
                        ("exact", MATCH_COLOURS["exact"], match_meanings[0]),
                        ("partial", MATCH_COLOURS["partial"], match_meanings[1]),
                        ("penalty", PENALTY_COLOUR, "points the penalties took off"),
                    ],
                },
                "cold_nodes": sum(1 for row in explanation if not row["raw_count"]),
                "scores": ranked[:MAX_SCORE_ROWS],
                "detail_titles": [title for _, title in details],
                "scores_hidden": max(0, len(ranked) - MAX_SCORE_ROWS),
                "placements": placements[:RECENT_PLACEMENTS],
                "placement_total": placements.count(),
                "active_total": placements.filter(finished_at__isnull=True).count(),
            }
        )
    return TemplateResponse(request, "admin/pipeline.html", context)
