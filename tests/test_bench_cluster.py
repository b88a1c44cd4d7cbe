"""The cluster bench's history has the shape the watcher writes: every key one
placement counts under (`labels.placement_keys`), with recency."""

import time
from collections import defaultdict

from history.labels import placement_keys
from tools.bench import cluster


def test_the_bench_history_is_what_the_ledger_would_write():
    now = time.time()
    pipelines = 40
    rows = {}
    for key, node, count, weight, at in cluster.history_rows(2000, pipelines, now):
        assert (key, node) not in rows, (key, node)
        assert count > 0 and 0 < weight <= count and 0 < at <= now
        rows[key, node] = (count, weight, at)
    per_pipeline = defaultdict(set)
    for key, node in rows:
        if key.endswith("$"):
            per_pipeline[key[:-1]].add(node)
    assert len(per_pipeline) == pipelines
    label_path = segment = 0
    for label, nodes in per_pipeline.items():
        keys = placement_keys(label)
        assert len(keys) == 9
        for node in nodes:
            # The pipeline's own rows carry the same count and recency.
            own = {rows[key, node] for key in (keys[3], keys[7], keys[8])}
            assert len(own) == 1
            count, _, at = own.pop()
            for key in keys:
                shared = rows[key, node]
                assert shared[0] >= count and shared[2] >= at
    for key, _ in rows:
        if key.endswith(("$", "*")):
            label_path += 1
        else:
            segment += 1
    # Label-path rows beside the segment rows, more of them (about 2.5 to one at
    # the default size, where the shared segments weigh less).
    assert segment < label_path < 3 * segment
    # Recency as recorded: rows of many ages, not a constant.
    ages = {round((now - at) / 86400) for _, _, at in rows.values()}
    assert len(ages) > 5
