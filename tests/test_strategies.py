"""The `warm` strategy: every scoring rule, pure and through the database."""

import random
from datetime import UTC, datetime, timedelta

import pytest

from extender.scoring.keyscores import warm_fast
from extender.scoring.rules import (
    NO_POLICY,
    WarmRules,
    resolve_policy,
    warm_band,
    warm_explain,
    with_worth,
)
from extender.scoring.strategies import SeedStrategy, WarmStrategy, get_strategy
from history.ledger import record_placement
from history.models import KeyNode, KeyPolicy, NodePolicy, NodeRecord
from history.reader import LabelHistory, Policies
from history.reader.memo import KeyMemo
from history.recency import accumulate_decayed, decayed_weight
from history.watcher.state import record_node_seen
from tests.helpers import default_scoring, ran

RULES = WarmRules()
DAY = 86400.0
T0 = datetime(2026, 1, 1, tzinfo=UTC)


NOW = 1.7e9
HALF_LIFE = 7 * DAY


def fast_scores(keys, history, active, policy, nodes, rules, busy=None):
    """The scores production's prioritize path gives (`keyscores.warm_fast`) for
    node-major rows of (key, count, weight at NOW), held equal to the `score` that
    `warm_explain` (the explain path) gives for the same rows."""
    by_key = {key: {} for key in keys}
    for node, rows in history.items():
        for key, count, weight in rows:
            by_key.setdefault(key, {})[node] = (count, weight, NOW)
    label_history = LabelHistory(
        keys=tuple(keys),
        by_key=by_key,
        replaced={},
        active=active,
        busy=busy or {},
        memo=KeyMemo().view(list(keys)),
    )
    fast = warm_fast(
        label_history, nodes, now=NOW, half_life=HALF_LIFE, rules=rules, policy=policy
    )
    explained = warm_explain(
        keys=keys,
        history=history,
        active=active,
        policy=policy,
        nodes=nodes,
        rules=rules,
        busy=busy,
    )
    assert fast == [row["score"] for row in explained]
    return fast


def scores(keys, history, active=None, policy=NO_POLICY, nodes=None):
    nodes = nodes or sorted(set(history) | set(active or {}) | {"cold"})
    return dict(
        zip(
            nodes,
            fast_scores(
                keys,
                history,
                active or {},
                NO_POLICY if policy is None else policy,
                nodes,
                RULES,
            ),
            strict=True,
        )
    )


# --- pure rules ---------------------------------------------------------------------


@pytest.mark.parametrize("segments", range(1, 10))
def test_bands_are_disjoint_and_ordered_from_general_to_specific(segments):
    bands = [warm_band(index=i, segments=segments) for i in range(segments)]
    assert bands[0][0] == 2 and bands[-1][1] == 10
    for (low, high), (next_low, _) in zip(bands, bands[1:], strict=False):
        assert low <= high < next_low


def test_specific_segment_beats_heavily_used_general_one():
    keys = ["ci", "java", "app"]
    result = scores(
        keys,
        {"general": [("ci", 5000, 5000.0)], "specific": [("app", 1, 0.2)]},
    )
    assert result["specific"] > result["general"] > result["cold"] == 1


def test_most_specific_row_of_a_node_decides():
    keys = ["ci", "java", "app"]
    result = scores(keys, {"n": [("ci", 9, 9.0), ("app", 1, 1.0), ("java", 3, 3.0)]})
    explained = warm_explain(
        keys=keys,
        history={"n": [("ci", 9, 9.0), ("app", 1, 1.0)]},
        active={},
        policy=NO_POLICY,
        nodes=["n"],
        rules=RULES,
    )[0]
    assert explained["matched_segment"] == "app"
    assert result["n"] == explained["score"] >= warm_band(index=2, segments=3)[0]


def test_weight_halves_every_half_life():
    assert decayed_weight(weight=8.0, at=0.0, now=7 * DAY, half_life=7 * DAY) == 4.0
    assert decayed_weight(weight=8.0, at=0.0, now=14 * DAY, half_life=7 * DAY) == 2.0
    # Never grows when "now" is before the reference instant.
    assert decayed_weight(weight=8.0, at=10.0, now=0.0, half_life=DAY) == 8.0
    weight, at = accumulate_decayed(
        weight=1.0, at=0.0, add=1.0, add_at=7 * DAY, half_life=7 * DAY
    )
    assert (weight, at) == (1.5, 7 * DAY)


def test_stale_history_scores_lower_then_is_forgotten():
    keys = ["ci", "app"]
    fresh = scores(keys, {"n": [("app", 4, 4.0)]})["n"]
    faded = scores(keys, {"n": [("app", 4, 0.4)]})["n"]
    forgotten = scores(keys, {"n": [("app", 4, RULES.min_weight / 2)]})["n"]
    assert fresh > faded > forgotten == 1


def test_general_segment_takes_over_when_specific_is_forgotten():
    keys = ["ci", "app"]
    result = scores(keys, {"n": [("ci", 50, 30.0), ("app", 2, 0.01)]})
    assert result["n"] == scores(keys, {"n": [("ci", 50, 30.0)]})["n"] > 1


def test_saturation_gives_diminishing_returns():
    keys = ["ci", "java", "maven", "app"]
    few, many, huge = (
        scores(keys, {"n": [("app", n, float(n))]})["n"] for n in (10, 500, 10**9)
    )
    one = scores(keys, {"n": [("app", 1, 1.0)]})["n"]
    assert one < few
    assert few <= many == huge == 10


def test_weight_never_exceeds_raw_count():
    keys = ["ci", "app"]
    assert scores(keys, {"n": [("app", 0, 5.0)]})["n"] == 1


def test_active_pods_of_the_label_spread_a_fan_out_over_warm_nodes():
    keys = ["ci", "java", "app"]
    history = {f"warm{i}": [("app", 20, 20.0)] for i in range(3)}
    history["partial"] = [("java", 50, 50.0)]
    active: dict[str, int] = {}
    chosen = []
    for _ in range(3):
        result = scores(keys, history, active)
        best = max(sorted(result), key=lambda node: result[node])
        chosen.append(best)
        active[best] = active.get(best, 0) + 1
    assert sorted(chosen) == ["warm0", "warm1", "warm2"]
    # However busy, an exact-warm node stays ahead of partially warm and cold ones.
    busy = scores(keys, history, {"warm0": 50})
    low, _ = warm_band(index=2, segments=3)
    assert busy["warm0"] == low < busy["warm1"]
    assert busy["warm0"] > busy["partial"] > busy["cold"]


def test_load_above_the_mean_costs_points_down_to_cold():
    keys = ["ci", "app"]
    history = {"hot": [("app", 9, 9.0)], "warm": [("app", 9, 9.0)]}
    nodes = ["hot", "warm", "idle"]
    calm = scores(keys, history, nodes=nodes)
    assert calm["hot"] == calm["warm"] == 10 and calm["idle"] == 1

    def loaded(busy):
        return dict(
            zip(
                nodes,
                fast_scores(keys, history, {}, NO_POLICY, nodes, RULES, busy),
                strict=True,
            )
        )

    # Mean 1: "hot" runs 3, beyond the mean plus slack by 2 - slack.
    result = loaded({"hot": 3})
    excess = 3 - 1 * (1 + RULES.load_slack)
    assert result["hot"] == 10 - round(excess * RULES.load_penalty) < 10
    assert result["warm"] == 10 and result["idle"] == 1
    # Far above the mean a warm node drops to the cold score, never below.
    assert loaded({"hot": 300})["hot"] == 1
    # Without the rule (load_penalty 0) load does not matter.
    off = WarmRules(load_penalty=0)
    assert fast_scores(keys, history, {}, NO_POLICY, nodes, off, {"hot": 300}) == [
        10,
        10,
        1,
    ]


def test_pod_without_label_scores_zero():
    assert scores([], {"n": [("app", 3, 3.0)]}) == {"cold": 0, "n": 0}


@pytest.mark.parametrize(
    ("key_policies", "node_policies", "expected"),
    [
        ({"ci": (False, 1.0)}, {}, {"cold": 0, "warm": 0, "other": 0}),
        # The more specific segment re-enables what the general one opted out.
        ({"ci": (False, 1.0), "app": (True, 1.0)}, {}, {"cold": 1, "other": 1}),
        ({}, {"app": {"other": "pin"}}, {"other": 10}),
        ({}, {"app": {"warm": "ban"}}, {"warm": 0, "cold": 1}),
        # The most specific rule for a node wins.
        ({}, {"ci": {"warm": "ban"}, "app": {"warm": "pin"}}, {"warm": 10}),
        ({"app": (True, 0.0)}, {}, {"warm": 1, "cold": 1}),
        ({"app": (True, 0.5)}, {}, {"warm": 5, "cold": 1}),
        ({"app": (True, 10.0)}, {"app": {}}, {"warm": 10}),
    ],
)
def test_policies(key_policies, node_policies, expected):
    keys = ["ci", "app"]
    policy = resolve_policy(
        keys=keys, policies=Policies(keys=key_policies, nodes=node_policies)
    )
    history = {"warm": [("app", 100, 3.0)]}
    nodes = ["cold", "warm", "other"]
    result = scores(keys, history, policy=policy, nodes=nodes)
    assert scores(keys, history, nodes=nodes)["warm"] == 9
    for node, score in expected.items():
        assert result[node] == score


def test_scores_are_ints_in_range_and_explain_agrees():
    keys = ["a", "b", "c", "d"]
    history = {
        f"n{i}": [(keys[i % 4], i, i / 3), (keys[(i * 7 + 1) % 4], i * 5, i * 1.5)]
        for i in range(60)
    }
    active = {f"n{i}": i % 5 for i in range(0, 60, 3)}
    nodes = [f"n{i}" for i in range(70)]
    policy = resolve_policy(
        keys=keys,
        policies=Policies(keys={"b": (True, 1.7)}, nodes={"c": {"n5": "ban"}}),
    )
    fast = fast_scores(keys, history, active, policy, nodes, RULES)
    explained = warm_explain(
        keys=keys,
        history=history,
        active=active,
        policy=policy,
        nodes=nodes,
        rules=RULES,
    )
    assert fast == [row["score"] for row in explained]
    assert all(type(s) is int and 0 <= s <= 10 for s in fast)
    assert [row["node"] for row in explained] == nodes


# --- through the database -----------------------------------------------------------


def stored(key, node):
    return KeyNode.objects.values_list("count", "decayed_weight", "decayed_at").get(
        key=key, node=node
    )


@pytest.mark.django_db
def test_upsert_keeps_decayed_state_and_counts(settings):
    settings.KSSCHED_HALF_LIFE_DAYS = 7
    ran("a", node="n1", now=T0)
    ran("a", node="n1", now=T0 + timedelta(days=7))
    count, weight, at = stored("a", "n1")
    assert count == 2
    assert weight == pytest.approx(1.5)
    assert at == (T0 + timedelta(days=7)).timestamp()
    # A late event (older than the stored instant) is carried forward, not back.
    ran("a", node="n1", now=T0)
    count, weight, at = stored("a", "n1")
    assert (count, at) == (3, (T0 + timedelta(days=7)).timestamp())
    assert weight == pytest.approx(2.0)
    # A gap of thousands of half-lives does not underflow.
    ran("a", node="n1", now=T0 + timedelta(days=70000))
    assert stored("a", "n1")[1] == pytest.approx(1.0)


@pytest.mark.django_db
def test_live_scores_halve_with_age(settings):
    settings.KSSCHED_HALF_LIFE_DAYS = 7
    for _ in range(4):
        ran("ci-app", node="n1", now=T0)
    strategy = WarmStrategy()
    rows = strategy.explain(label="ci-app", nodes=["n1"], now=T0.timestamp())
    assert rows[0]["decayed_weight"] == pytest.approx(4.0)
    later = T0.timestamp() + 7 * DAY
    rows = strategy.explain(label="ci-app", nodes=["n1"], now=later)
    assert rows[0]["decayed_weight"] == pytest.approx(2.0)
    assert rows[0]["raw_count"] == 4
    years = T0.timestamp() + 400 * DAY
    assert strategy.score(label="ci-app", nodes=["n1"], now=years) == [1]


@pytest.mark.django_db
def test_hand_made_rows_weigh_their_count():
    KeyNode.objects.create(key="ci-app$", node="n1", count=3)
    row = WarmStrategy().explain(label="ci-app", nodes=["n1"])[0]
    assert (row["matched_segment"], row["decayed_weight"]) == ("ci-app$", 3.0)


@pytest.mark.django_db
def test_history_before_a_node_replacement_is_ignored():
    ran("ci-app", node="n1", now=T0)
    ran("ci-app", node="n2", now=T0)
    record_node_seen(name="n1", uid="uid-1", now=T0 - timedelta(days=1))
    strategy = WarmStrategy()
    now = (T0 + timedelta(days=1)).timestamp()
    # First sighting keeps history.
    assert strategy.score(label="ci-app", nodes=["n1", "n2"], now=now)[0] > 1
    record_node_seen(name="n1", uid="uid-2", now=T0 + timedelta(hours=1))
    replaced, kept = strategy.score(label="ci-app", nodes=["n1", "n2"], now=now)
    assert replaced == 1 < kept
    # New history after the replacement counts again.
    ran("ci", node="n1", now=T0 + timedelta(hours=2))
    row = strategy.explain(label="ci-app", nodes=["n1"], now=now)[0]
    assert row["matched_segment"] == "ci-*"
    assert NodeRecord.objects.get(name="n1").replacements == 1


@pytest.mark.django_db
def test_live_active_pods_and_policies():
    for i in range(3):
        ran("ci-app", node=f"n{i}", now=T0)
    record_placement(pod_uid="u1", namespace="ci", name="p1", label="ci-app", node="n0")
    strategy = WarmStrategy()
    now = T0.timestamp()
    before = strategy.score(label="ci-app", nodes=["n0", "n1", "n2", "x"], now=now)
    assert before[0] < before[1] == before[2]
    assert before[3] == 1
    KeyPolicy.objects.create(key="app", weight=1.0)
    NodePolicy.objects.create(key="app", node="x", action="pin")
    NodePolicy.objects.create(key="ci", node="n1", action="ban")
    pinned = strategy.score(label="ci-app", nodes=["n0", "n1", "n2", "x"], now=now)
    assert pinned == [before[0], 0, before[2], 10]
    KeyPolicy.objects.filter(key="app").update(enabled=False)
    assert strategy.score(label="ci-app", nodes=["n0", "x"], now=now) == [0, 0]


@pytest.mark.django_db
def test_warm_queries_are_bounded(django_assert_max_num_queries):
    nodes = [f"node-{i}" for i in range(3000)]
    for node in nodes[::10]:
        ran("ci-java-app", node=node, now=T0)
    with django_assert_max_num_queries(5):
        result = WarmStrategy().score(
            label="ci-java-app", nodes=nodes, now=T0.timestamp()
        )
    assert len(result) == 3000 and result[0] > result[1] == 1


def test_get_strategy_knows_both():
    assert isinstance(get_strategy("seed"), SeedStrategy)
    assert isinstance(get_strategy("warm"), WarmStrategy)
    with pytest.raises(ValueError, match="unknown scoring strategy"):
        get_strategy("nope")


def test_warm_is_the_default_outside_the_test_suite():
    assert default_scoring() == "warm"


def test_kept_key_scores_equal_explained_scores_at_every_instant():
    """Scores kept per key answer what warm_explain answers at any instant of their
    window, with rows built to cross min_weight and rounding boundaries inside it."""
    rng = random.Random(11)
    half_life = 7 * DAY
    rules = WarmRules()

    def weigh(rows, now):
        # As recency.weigh: a row made by hand (no recency state) weighs its count.
        return [
            (
                key,
                count,
                decayed_weight(weight=w, at=at, now=now, half_life=half_life)
                if at
                else float(count),
            )
            for key, count, w, at in rows
        ]

    unsettled = gone = 0
    for _ in range(60):
        keys = ["a", "b", "c", "d"][: rng.randint(1, 4)]
        start = 1.7e9 + rng.uniform(0, DAY)
        end = start + rng.choice([60.0, 3024.0, DAY])
        nodes = [f"n{i}" for i in range(40)]
        history = {}
        for node in nodes[:35]:
            rows = []
            for index, key in enumerate(keys):
                kind = rng.random()
                if kind < 0.3:
                    continue
                count = rng.randint(1, 30)
                crossing = start + rng.uniform(0, end - start)
                if kind < 0.5:
                    # Falls to min_weight inside the window.
                    target = rules.min_weight
                elif kind < 0.7:
                    # Its band position crosses a half-integer inside the window.
                    low, high = warm_band(index=index, segments=len(keys))
                    if high == low:
                        continue
                    half = rng.randrange(high - low) + 0.5
                    target = rules.saturation * half / (high - low - half)
                elif kind < 0.8:
                    # Made by hand (no recency state): the same weight at every
                    # instant, its band position often exactly a half-integer.
                    rows.append((key, rng.randint(1, 3), 0.0, 0.0))
                    continue
                else:
                    rows.append((key, count, rng.uniform(0, count), start - 9 * DAY))
                    continue
                weight = target * 2 ** ((crossing - start) / half_life)
                rows.append((key, max(count, int(weight) + 1), weight, start))
            if rows:
                history[node] = rows
        resolved = resolve_policy(
            keys=keys,
            policies=Policies(
                keys={keys[-1]: (True, 1.7)},
                nodes={keys[0]: {"n3": "ban", "n39": "pin"}},
            ),
        )
        # What warmth is worth scales the pull too: a weight below 1 scales the
        # bonus, one above divides the penalties (`rules.with_worth`).
        policy = rng.choice(
            [
                NO_POLICY,
                resolved,
                with_worth(NO_POLICY, 0.0, "learned 0"),
                with_worth(NO_POLICY, 0.5, "learned 0.5"),
                with_worth(NO_POLICY, 1.5, "learned 1.5"),
                with_worth(resolved, 2.0, "learned 2"),
            ]
        )
        active = {node: rng.randint(1, 3) for node in rng.sample(nodes, 5)}
        busy = {node: active.get(node, 0) + rng.randint(0, 2) for node in nodes[::3]}
        # Workspace depths, and a depth from which a workspace counts as gone.
        rules = WarmRules(workspace_depth=rng.choice([0, 1, 2, 4]))
        depths = {node: rng.randint(0, 16) for node in rng.sample(nodes, 12)}
        by_key: dict[str, dict] = {key: {} for key in keys}
        for node, rows in history.items():
            for key, count, weight, at in rows:
                by_key[key][node] = (count, weight, at)
        kept_memo = KeyMemo()
        for key in keys:
            kept_memo.start(key)
        label_history = LabelHistory(
            keys=tuple(keys),
            by_key=by_key,
            replaced={},
            active=active,
            busy=busy,
            memo=kept_memo.view(keys),
            depths=depths,
        )
        for now in [start, end, *(rng.uniform(start, end) for _ in range(15))]:
            exact = {node: weigh(rows, now) for node, rows in history.items()}
            asked = rng.sample(nodes, rng.randint(1, 40))
            kept = warm_fast(
                label_history,
                asked,
                now=now,
                half_life=half_life,
                rules=rules,
                policy=policy,
            )
            explained = warm_explain(
                keys=keys,
                history=exact,
                active=active,
                busy=busy,
                policy=policy,
                nodes=asked,
                rules=rules,
                depths=depths,
            )
            assert kept == [row["score"] for row in explained]
            gone += sum(row["workspace"] is not None for row in explained)
        unsettled += sum(
            len(entry.value.unsettled)
            for by_tag in kept_memo.derived.values()
            for tag, entry in by_tag.items()
            if tag[0] == "warm"
        )
    assert unsettled > 0
    assert gone > 0


def test_kept_key_scores_are_bounded_per_key_across_time_windows():
    """Each new time window builds new kept scores; the old ones are dropped."""
    from history.reader import memo as memo_module

    kept = KeyMemo()
    kept.start("ci")
    history = LabelHistory(
        keys=("ci",),
        by_key={"ci": {"n1": (3, 3.0, 1.7e9)}},
        replaced={},
        active={},
        busy={},
        memo=kept.view(["ci"]),
    )
    half_life = 7 * DAY
    for window in range(3 * memo_module.MAX_TAGS):
        now = 1.7e9 + window * half_life / 200
        warm_fast(
            history, ["n1"], now=now, half_life=half_life, rules=RULES, policy=NO_POLICY
        )
    assert len(kept.derived["ci"]) == memo_module.MAX_TAGS
    assert kept.bytes == sum(entry.value.size for entry in kept.derived["ci"].values())


def test_combined_label_scores_are_bounded_in_bytes(monkeypatch):
    """Labels called again keep their keys' scores combined, within the bound."""
    from history.reader import memo as memo_module

    monkeypatch.setattr(memo_module, "MAX_COMBINED_BYTES", 3 * 50 * 64)
    kept = KeyMemo()
    kept.start("ci")
    rows = {f"n{i}": (3, 3.0, 0.0) for i in range(50)}
    for label in range(10):
        key = f"k{label}"
        kept.start(key)
        history = LabelHistory(
            keys=("ci", key),
            by_key={"ci": rows, key: {"n1": (2, 2.0, 0.0)}},
            replaced={},
            active={},
            busy={},
            memo=kept.view(["ci", key]),
        )
        for _ in range(2):
            scores = warm_fast(
                history,
                ["n0", "n1"],
                now=1.7e9,
                half_life=7 * DAY,
                rules=RULES,
                policy=NO_POLICY,
            )
        assert scores[1] > scores[0]
    assert len(kept.labels) == 3
    assert kept.labels_bytes == sum(entry.size for entry in kept.labels.values())


def test_learned_weights_scale_the_pull_within_the_rules():
    keys = ["ci", "app"]
    history = {"hot": [("app", 9, 9.0)], "warm": [("app", 9, 9.0)]}
    nodes = ["hot", "warm", "idle"]

    def loaded(policy, busy=None, active=None):
        return dict(
            zip(
                nodes,
                fast_scores(keys, history, active or {}, policy, nodes, RULES, busy),
                strict=True,
            )
        )

    today = loaded(NO_POLICY, {"hot": 3})
    # Worth 2: the load penalty is halved, the warm node keeps more of its score.
    harder = loaded(with_worth(NO_POLICY, 2.0, "learned 2"), {"hot": 3})
    excess = 3 - 1 * (1 + RULES.load_slack)
    assert today["hot"] == 10 - round(excess * RULES.load_penalty)
    assert harder["hot"] == 10 - round(excess * RULES.load_penalty / 2) > today["hot"]
    # ... and the anti-hotspot rule too, never past the band's low end.
    pods = {"hot": 2}
    assert (
        loaded(with_worth(NO_POLICY, 2.0, "x"), active=pods)["hot"]
        > loaded(NO_POLICY, active=pods)["hot"]
    )
    # Worth 0.5 halves the bonus above the cold score (1 + round(9 / 2), Python's
    # round half to even); worth 0 leaves the nodes to balance alone.
    assert loaded(with_worth(NO_POLICY, 0.5, "x")) == {"hot": 5, "warm": 5, "idle": 1}
    assert set(loaded(with_worth(NO_POLICY, 0.0, "x")).values()) == {1}


@pytest.mark.parametrize(
    ("worth", "learned", "weight", "pull"),
    [
        ("auto", 0.5, 0.75, 1.0),  # learned times the key's weight 1.5
        ("auto", 2.0, 1.5, 2.0),  # pulled harder: penalties halved
        ("fixed", 0.0, 1.5, 1.0),  # the key's weight alone
        ("off", 2.0, 0.0, 1.0),  # no warm pull at all
    ],
)
def test_a_key_policy_chooses_how_learned_worth_applies(worth, learned, weight, pull):
    policy = resolve_policy(
        keys=["ci", "app"],
        policies=Policies(
            keys={"app": (True, 1.5)}, nodes={"ci": {"n1": "pin"}}, worth={"app": worth}
        ),
    )
    applied = with_worth(policy, learned, "why")
    assert (applied.weight, applied.pull) == (weight, pull)
    # Pins survive every mode.
    assert applied.nodes == {"n1": ("pin", "ci")}


@pytest.mark.django_db
def test_a_key_policys_worth_mode_is_edited_in_the_admin_and_read_by_scoring(client):
    from django.contrib.auth.models import User

    client.force_login(User.objects.create_superuser("root", password=None))
    answer = client.post(
        "/admin/history/keypolicy/add/",
        {"key": "app", "enabled": "on", "weight": "1.5", "worth": "off", "note": ""},
    )
    assert answer.status_code == 302, answer.content[:2000]
    listing = client.get("/admin/history/keypolicy/").content.decode()
    assert "off (no warm pull)" in listing
    history = WarmStrategy().read("ci-app", ["n1"])
    assert history is not None
    assert history[0].policies.worth == {"app": "off"}
    # Off: no warm pull whatever was learned, the key's weight set aside.
    assert with_worth(history[1], 2.0, "learned").weight == 0.0
