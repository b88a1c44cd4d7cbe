"""What the book of warmth's worth costs for many pipelines (issue 32).

    python -m tools.bench.worth [--pipelines 10000] [--prefixes 50]

Fills a `history.worth.WorthBook` with `--pipelines` pipelines under
`--prefixes` label prefixes, every ring full (SAMPLES startups and runs of each
warmth class), as after a month of runs. Reports the memory the book holds with
every estimate worked out (tracemalloc, a run of its own), the time `settle`
takes from cold (a process's first read) and after 100 pipelines got a new
outcome (a refresh: both after a reply, off the request path), what one
estimate costs the first time after a refresh and once kept (what scoring
pays per call), and how many pipelines sit at each weight band.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import tracemalloc
from collections.abc import Callable

from history.worth import WorthBook
from history.worth_samples import SAMPLES, WARMTHS


def fill(book: WorthBook, pipelines: int, prefixes: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    labels = []
    for n in range(pipelines):
        label = f"team{n % prefixes}-lang{n % 7}-p{n}"
        labels.append(label)
        # A third gain a lot, a third a little, a third nothing.
        extra = (120.0, 10.0, 0.0)[n % 3]
        for warmth in WARMTHS:
            cost = {"exact": 0.0, "partial": extra / 2, "cold": extra}[warmth]
            for _ in range(SAMPLES):
                startup = 5 * rng.lognormvariate(0, 0.3) + cost
                book.add(label, warmth, startup, rng.expovariate(1 / 600))
    return labels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pipelines", type=int, default=10_000)
    parser.add_argument("--prefixes", type=int, default=50)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    tracemalloc.start()
    held_book = WorthBook()
    fill(held_book, args.pipelines, args.prefixes, args.seed)
    held_book.settle()
    held_book.bands()  # every estimate kept
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del held_book

    book = WorthBook()
    labels = fill(book, args.pipelines, args.prefixes, args.seed)
    cold = _timed(book.settle)
    rng = random.Random(args.seed)
    for label in rng.sample(labels, 100):
        book.add(label, "exact", 5.0, 600.0)
    refresh = _timed(book.settle)
    asked = rng.choices(labels, k=20_000)
    first = [_timed(book.estimate, label) for label in dict.fromkeys(asked)]
    kept = [_timed(book.estimate, label) for label in asked]
    print(f"pipelines            {len(book.pipelines)}")
    print(f"memory held          {held / 2**20:.1f} MiB ({held // len(labels)} B each)")
    print(f"settle, first read   {cold:.3f} s")
    print(f"settle, 100 changed  {refresh:.3f} s")
    print(f"estimate, first use  {_percentiles(first)}")
    print(f"estimate, kept       {_percentiles(kept)}")
    print(f"weight bands         {book.bands()}")


def _timed(work: Callable[..., object], *args: object) -> float:
    began = time.perf_counter()
    work(*args)
    return time.perf_counter() - began


def _percentiles(seconds: list[float]) -> str:
    ordered = sorted(seconds)
    p99 = ordered[int(0.99 * len(ordered))]
    return f"p50 {statistics.median(ordered) * 1e6:.2f} us, p99 {p99 * 1e6:.2f} us"


if __name__ == "__main__":
    main()
