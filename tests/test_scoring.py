"""The seed formula, as pure functions."""

import pytest

from extender.scoring.rules import seed_score, seed_scores


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


def test_seed_scores_keep_input_order_and_default_to_one():
    scores = seed_scores(
        segments=3, matches={"n2": (1, 1), "n3": (2, 50)}, nodes=["n1", "n2", "n3"]
    )
    assert scores == [1, 6, 10]


def test_seed_scores_without_label_are_zero():
    assert seed_scores(segments=0, matches={}, nodes=["n1", "n2"]) == [0, 0]


def test_seed_scores_are_ints_in_range():
    matches = {f"n{i}": (i % 4, i * 7) for i in range(50)}
    scores = seed_scores(segments=4, matches=matches, nodes=list(matches) + ["x"])
    assert all(type(score) is int and 0 <= score <= 10 for score in scores)


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
