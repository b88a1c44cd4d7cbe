"""best_matches on SQLite answers from a per-thread cache: it must always agree with
the query it replaces, whoever writes (this connection, another one) and however."""

import random
import threading

import pytest
from django.db import connection, transaction

from extender.strategies import SeedStrategy
from history import services
from history.models import KeyNode

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        "connection.vendor != 'sqlite'", reason="the cache serves SQLite only"
    ),
]

NODES = [f"node-{i}" for i in range(40)]
LABELS = ["ci-java-maven-p1", "ci-go-p2", "ci-java-p1", "x-ci-x", "ci"]


def queried(keys, nodes=NODES):
    """The answer of the plain query (best_matches skips the cache in a transaction)."""
    with transaction.atomic():
        return services.best_matches(keys=keys, nodes=nodes)


def cached(keys, nodes=NODES):
    assert not connection.in_atomic_block
    return services.best_matches(keys=keys, nodes=nodes)


def assert_agree():
    for label in LABELS:
        keys = services.split_pipeline_label(label)
        assert cached(keys) == queried(keys), label
        assert cached(keys, NODES[5:9]) == queried(keys, NODES[5:9]), label
        # Seed scores kept between calls match scores computed from the query.
        kept = SeedStrategy().score(label=label, nodes=NODES)
        with transaction.atomic():
            fresh = SeedStrategy().score(label=label, nodes=NODES)
        assert kept == fresh, label


def in_other_connection(work):
    """Run `work` in a thread, so on its own database connection."""
    errors = []

    def run():
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


def test_cache_follows_every_kind_of_write():
    rng = random.Random(3)
    for i in range(60):
        services.record_placement(
            pod_uid=f"seed-{i}",
            namespace="ns",
            name=f"p{i}",
            label=rng.choice(LABELS),
            node=rng.choice(NODES),
        )
    assert_agree()

    # Placements from another connection (the watcher's process in production).
    def watcher():
        for i in range(30):
            services.record_placement(
                pod_uid=f"w-{i}",
                namespace="ns",
                name=f"w{i}",
                label=rng.choice(LABELS),
                node=rng.choice(NODES[:10]),
            )

    in_other_connection(watcher)
    assert_agree()

    # Admin edits on this connection: set, create, reset, halve, delete.
    rows = list(KeyNode.objects.order_by("id"))
    services.set_key_node_count(key_node=rows[0], count=0, actor="admin")
    services.set_key_node_count(key_node=rows[1], count=5_000_000, actor="admin")
    assert_agree()
    services.create_key_node(key="maven", node="node-39", count=4, actor="admin")
    services.reset_key_nodes(key_nodes=rows[2:4], actor="admin")
    services.halve_key_nodes(key_nodes=rows[4:8], actor="admin")
    assert_agree()
    services.delete_key_nodes(key_nodes=rows[8:14], actor="admin")
    assert_agree()

    # Admin edits from another connection, then a duplicate placement (no change).
    in_other_connection(
        lambda: services.delete_key_nodes(
            key_nodes=KeyNode.objects.filter(key="ci")[:5], actor="admin"
        )
    )
    assert not services.record_placement(
        pod_uid="seed-0", namespace="ns", name="p0", label="ci", node="node-1"
    )
    assert_agree()


def test_cache_survives_a_reconnect_and_a_rolled_back_write():
    services.record_placement(
        pod_uid="a", namespace="ns", name="a", label="ci-java", node="node-1"
    )
    assert cached(["ci", "java"]) == {"node-1": (1, 1)}
    connection.close()
    services.record_placement(
        pod_uid="b", namespace="ns", name="b", label="ci-java", node="node-2"
    )
    assert cached(["ci", "java"]) == {"node-1": (1, 1), "node-2": (1, 1)}

    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic():
        services.record_placement(
            pod_uid="c", namespace="ns", name="c", label="ci-java", node="node-3"
        )
        raise Rollback
    assert cached(["ci", "java"]) == queried(["ci", "java"])
    assert "node-3" not in cached(["ci", "java"])
