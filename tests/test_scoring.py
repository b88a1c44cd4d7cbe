"""The seed formula: the pure rule, and the scores production gives
(`keyscores.seed_fast`, as prioritize runs it)."""

import pytest

from extender.scoring.keyscores import seed_fast
from extender.scoring.rules import seed_score
from extender.scoring.strategies import SeedStrategy
from history.reader import LabelHistory
from history.reader.memo import KeyMemo
from history.reader.memory import MemoryHistory


@pytest.mark.parametrize(
    ("index", "count", "segments", "expected"),
    [
        (1, 1, 3, 6),  # int(3.33 + 3.33 + 0)
        (2, 1, 3, 10),  # int(6.67 + 3.33 + 0) = 10
        (0, 1, 3, 3),
        (0, 35, 3, 6),  # count // 10 adds 3
        (0, 0, 1, 10),
        (3, 20, 4, 10),  # 10 + 2 would be 12: capped
        (0, 10**12, 2, 10),  # huge counts stay capped
        (1, 9, 4, 5),  # 2.5 + 2.5 + 0
    ],
)
def test_seed_score_formula_and_cap(index, count, segments, expected):
    assert seed_score(index=index, count=count, segments=segments) == expected


def fast(keys, rows, nodes, memo=None):
    """`seed_fast` on a label's rows: key -> node -> count."""
    history = LabelHistory(
        keys=tuple(keys),
        by_key={
            key: {node: (count, float(count), 0.0) for node, count in by_node.items()}
            for key, by_node in rows.items()
        },
        replaced={},
        active={},
        busy={},
        memo=memo,
    )
    return seed_fast(history, nodes)


def test_seed_scores_keep_input_order_and_default_to_one():
    rows = {"b": {"n2": 1}, "c": {"n3": 50, "n2": 3}, "a": {"n3": 900}}
    assert fast(["a", "b", "c"], rows, ["n1", "n2", "n3"]) == [1, 10, 10]
    assert fast(["a", "b", "c"], {"b": {"n2": 1}}, ["n1", "n2"]) == [1, 6]


def test_seed_scores_take_the_most_specific_key_and_count_it_there():
    # n1: general `a` with many runs; n2: the specific `c` once.
    rows = {"a": {"n1": 95, "n2": 95}, "c": {"n2": 1}}
    assert fast(["a", "b", "c"], rows, ["n1", "n2"]) == [
        seed_score(index=0, count=95, segments=3),
        seed_score(index=2, count=1, segments=3),
    ]
    # A segment repeated in a label counts at its most specific position.
    assert fast(["a", "b", "a"], {"a": {"n1": 1}}, ["n1"]) == [10]


def test_seed_scores_without_label_are_zero():
    assert SeedStrategy(reader=MemoryHistory(half_life=1.0)).score(
        label=None, nodes=["n1", "n2"]
    ) == [0, 0]


def test_seed_scores_are_ints_in_range_and_kept_scores_follow_changes():
    keys = ["a", "b", "c", "d"]
    rows = {key: {} for key in keys}
    for i in range(50):
        rows[keys[i % 4]][f"n{i}"] = i * 7
    nodes = [f"n{i}" for i in range(50)] + ["x"]
    scores = fast(keys, rows, nodes)
    assert all(type(score) is int and 0 <= score <= 10 for score in scores)
    # Through a memo: kept per key, then brought up to date for a changed node.
    memo = KeyMemo()
    for key in keys:
        memo.start(key)
    assert fast(keys, rows, nodes, memo.view(keys)) == scores
    before = memo.view(keys)
    rows = {**rows, "d": {**rows["d"], "x": 1}}
    memo.changed("d", ["x"])
    changed = fast(keys, rows, nodes, memo.view(keys))
    assert changed == [*scores[:-1], seed_score(index=3, count=1, segments=4)]
    # A reader still holding the earlier view keeps the earlier answer.
    assert (
        fast(
            keys,
            {**rows, "d": {n: c for n, c in rows["d"].items() if n != "x"}},
            nodes,
            before,
        )
        == scores
    )


@pytest.mark.django_db
def test_seed_explain_agrees_with_score():
    from extender.scoring.strategies import get_strategy
    from history.models import KeyNode

    KeyNode.objects.create(key="a", node="n1", count=25)
    KeyNode.objects.create(key="b", node="n2", count=1)
    strategy = get_strategy("seed")
    nodes = ["n1", "n2", "n3"]
    explanation = strategy.explain(label="a-b", nodes=nodes)
    assert [row["score"] for row in explanation] == strategy.score(
        label="a-b", nodes=nodes
    )
    assert explanation[0] == {
        "node": "n1",
        "matched_segment": "a",
        "segment_index": 0,
        "raw_count": 25,
        "score": 7,
    }
    assert explanation[2]["matched_segment"] is None
