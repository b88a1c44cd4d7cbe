"""What warmth is worth to each pipeline (`history.worth`, `history.worth_samples`):
the estimate, its interval, borrowing strength, the weight rule, and its bounds."""

import random
import tracemalloc

import pytest

from history.worth import MAX_WEIGHT, WorthBook, weight_for
from history.worth_samples import (
    MIN_RUNS,
    SAMPLES,
    WARMTHS,
    difference,
    median_interval,
)


def feed(book, label, warmth, startups, run=100.0):
    for startup in startups:
        book.add(label, warmth, startup, run)


def typical_fleet(book, saving=60.0, pipelines=6, runs=MIN_RUNS):
    """Pipelines `ci-java-t<n>` that save `saving` s: the fleet's unit."""
    for n in range(pipelines):
        feed(book, f"ci-java-t{n}", "exact", [10.0 + i % 3 for i in range(runs)])
        feed(book, f"ci-java-t{n}", "cold", [10 + saving + i % 3 for i in range(runs)])


def test_median_interval_widens_to_the_extremes_for_few_values():
    assert median_interval([5.0, 1.0, 3.0]) == (1.0, 5.0)
    values = list(range(1, 101))
    low, high = median_interval(values)
    # n = 100: ranks 50 -+ 9.8, about 95 %.
    assert (low, high) == (41, 60)


def test_difference_of_medians_and_its_interval():
    found = difference([10.0] * 8, [70.0] * 8)
    assert found is not None
    assert (found.seconds, found.low, found.high) == (60.0, 60.0, 60.0)
    assert found.measurable
    assert difference([], [1.0]) is None
    # Too few runs on one side: not measurable, whatever the interval says.
    assert not difference([10.0] * 3, [70.0] * 3).measurable


def test_a_hung_pod_does_not_move_the_estimate():
    steady, hung = WorthBook(), WorthBook()
    for book in (steady, hung):
        typical_fleet(book)
    exact = [10.0, 11.0, 12.0, 10.0, 11.0, 12.0, 10.0, 11.0]
    feed(steady, "ci-go-app", "exact", exact)
    feed(hung, "ci-go-app", "exact", [*exact[:-1], 900.0])
    for book in (steady, hung):
        feed(book, "ci-go-app", "cold", [130.0 + i for i in range(8)])
    a, b = steady.estimate("ci-go-app"), hung.estimate("ci-go-app")
    assert a.seconds == pytest.approx(b.seconds, abs=1.0)
    assert a.weight == b.weight == MAX_WEIGHT
    # A mean would have moved by more than 100 s.
    assert abs(a.seconds - b.seconds) < 100


def test_no_outcomes_keeps_todays_pull():
    book = WorthBook()
    estimate = book.estimate("ci-java-new")
    assert estimate.weight == 1.0
    assert "no outcomes" in estimate.reason
    # Only exact runs anywhere: nothing to compare, still today's pull.
    feed(book, "ci-java-new", "exact", [10.0, 11.0])
    assert book.estimate("ci-java-new").weight == 1.0


def test_a_uniform_fleet_keeps_weight_one_for_everyone():
    book = WorthBook()
    typical_fleet(book, saving=300.0, pipelines=10)
    assert {book.weight(f"ci-java-t{n}") for n in range(10)} == {1.0}


def test_few_runs_borrow_from_the_prefix_then_own_runs_take_over():
    book = WorthBook()
    # The ci-java-* pipelines save twice what the ci-go-* ones do.
    typical_fleet(book, saving=60.0, pipelines=4)
    for n in range(4):
        label = f"ci-go-t{n}"
        feed(book, label, "exact", [10.0] * MIN_RUNS)
        feed(book, label, "cold", [40.0] * MIN_RUNS)
    # A new ci-java pipeline with one run of each kind that says 3x: it is pulled
    # toward its prefix's worth rather than jumping on two samples.
    feed(book, "ci-java-new", "exact", [10.0])
    feed(book, "ci-java-new", "cold", [10.0 + 3 * 45])
    few = book.estimate("ci-java-new")
    assert few.prior is not None and few.own is not None
    assert few.prior < few.credited < few.own
    assert "borrowing" in few.reason
    # With many runs the pipeline's own figure dominates.
    feed(book, "ci-java-new", "exact", [10.0] * 15)
    feed(book, "ci-java-new", "cold", [10.0 + 3 * 45] * 15)
    many = book.estimate("ci-java-new")
    assert abs(many.credited - many.own) < abs(few.credited - few.own)
    assert "borrowing" not in many.reason


def test_warmth_that_saves_nothing_loses_its_pull_after_min_runs_each():
    book = WorthBook()
    typical_fleet(book)
    rng = random.Random(7)
    weights = []
    for _ in range(MIN_RUNS):
        book.add("ci-java-flat", "exact", 10 + rng.uniform(-2, 2), 100.0)
        book.add("ci-java-flat", "cold", 10 + rng.uniform(-2, 2), 100.0)
        weights.append(book.weight("ci-java-flat"))
    # Borrowing from typical siblings until MIN_RUNS runs of each kind, then off.
    assert weights[-1] == 0.0
    assert all(weight > 0 for weight in weights[: MIN_RUNS - 1])
    assert "nothing measurable" in book.estimate("ci-java-flat").reason


def test_a_pipeline_that_gains_a_lot_is_pulled_harder_up_to_the_bound():
    book = WorthBook()
    typical_fleet(book, saving=30.0)
    feed(book, "ci-java-big", "exact", [10.0 + i for i in range(MIN_RUNS)])
    feed(book, "ci-java-big", "cold", [190.0 + i for i in range(MIN_RUNS)])
    estimate = book.estimate("ci-java-big")
    assert estimate.seconds == pytest.approx(180.0)
    assert estimate.weight == MAX_WEIGHT  # 6x a typical pipeline, bounded at 2


def test_run_time_counts_only_where_it_differs_measurably():
    book = WorthBook()
    typical_fleet(book)
    for i in range(MIN_RUNS):
        book.add("ci-java-run", "exact", 10.0, 100.0 + i)
        book.add("ci-java-run", "cold", 10.0 + 60, 400.0 + i)
    estimate = book.estimate("ci-java-run")
    assert estimate.run is not None and estimate.run.measurable
    assert estimate.seconds == pytest.approx(60.0 + 300.0)
    # Noisy run times that do not differ: startup alone.
    noisy = WorthBook()
    typical_fleet(noisy)
    rng = random.Random(3)
    for _ in range(MIN_RUNS):
        noisy.add("ci-java-run", "exact", 10.0, rng.expovariate(1 / 600))
        noisy.add("ci-java-run", "cold", 70.0, rng.expovariate(1 / 600))
    found = noisy.estimate("ci-java-run")
    assert not found.run.measurable
    assert found.seconds == pytest.approx(60.0)


def test_weight_is_bounded_monotonic_and_stepped():
    values = [weight_for(x / 100) for x in range(-100, 500)]
    assert values == sorted(values)
    assert min(values) == 0.0 and max(values) == MAX_WEIGHT
    assert set(values) <= {0.0, 0.5, 1.0, 1.5, 2.0}
    assert weight_for(None) == 1.0


def test_bands_count_every_pipeline_once():
    book = WorthBook()
    typical_fleet(book, pipelines=3)
    feed(book, "ci-java-flat", "exact", [10.0] * MIN_RUNS)
    feed(book, "ci-java-flat", "cold", [10.0] * MIN_RUNS)
    assert book.bands() == {"off": 1, "weaker": 0, "default": 3, "stronger": 0}


def test_memory_is_bounded_for_ten_thousand_pipelines():
    tracemalloc.start()
    try:
        book = WorthBook()
        rng = random.Random(1)
        for n in range(10_000):
            label = f"team{n % 50}-lang{n % 7}-p{n}"
            for warmth in WARMTHS:
                for _ in range(SAMPLES):
                    book.add(label, warmth, rng.uniform(1, 200), rng.uniform(1, 900))
        book.settle()
        used, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(book.pipelines) == 10_000
    # docs/scoring.md gives the measured figure; this is its bound.
    assert used < 40 * 2**20, used


def test_the_oldest_pipelines_are_forgotten_beyond_the_limit():
    book = WorthBook(max_pipelines=3)
    for n in range(5):
        book.add(f"ci-java-p{n}", "exact", 10.0, 100.0)
    assert list(book.pipelines) == ["ci-java-p2", "ci-java-p3", "ci-java-p4"]
    assert book.children[""] == {"ci-java-p2", "ci-java-p3", "ci-java-p4"}


def test_asking_about_unknown_labels_keeps_nothing():
    book = WorthBook()
    typical_fleet(book, pipelines=2)
    book.settle()
    assert book.weight("ci-java-t0") == book.weight("ci-java-t1") == 1.0
    for n in range(1000):
        assert book.estimate(f"ci-unknown-p{n}").weight == 1.0
    assert len(book._estimates) == 2


def test_median_without_leaves_one_value_out():
    from history.worth import median_without

    assert median_without([1.0, 2.0, 3.0, 10.0], 10.0) == (2.0, 3)
    assert median_without([1.0, 2.0, 3.0, 10.0], 1.0) == (3.0, 3)
    assert median_without([1.0, 2.0, 3.0], None) == (2.0, 3)
    assert median_without([5.0], 5.0) == (None, 0)
    assert median_without([], None) == (None, 0)


def test_a_lone_pipeline_does_not_count_its_own_runs_twice():
    book = WorthBook()
    # One pipeline, one comparison, saving nothing: its prefixes and the fleet have
    # no other pipeline, so it is shrunk toward today's pull, not toward itself.
    book.add("jenkins-java-maven-api", "exact", 1.0, 10.0)
    book.add("jenkins-java-maven-api", "cold", 1.0, 10.0)
    estimate = book.estimate("jenkins-java-maven-api")
    assert estimate.own == 0.0 and estimate.prior == 1.0
    assert estimate.credited == pytest.approx(0.75)
    assert estimate.weight == 1.0
