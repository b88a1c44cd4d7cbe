"""history.watcher.nodes and state.record_node_seen: node identity and replacement."""

import pytest

from history.models import NodeRecord
from history.watcher import state
from history.watcher.loop import Stream
from history.watcher.nodes import NodeHandler
from tests.fakeapi import (
    make_node,
)
from tests.watch_streams import (
    options,
    run_until,
)

pytestmark = pytest.mark.django_db(transaction=True)


def test_node_stream_notices_a_replaced_node(api, server):
    server.add_node(make_node("n1", uid="uid-1"))
    server.add_node(make_node("n2", uid="uid-2"))
    nodes = Stream(api, NodeHandler(), options=options())
    nodes.start()
    nodes.relist()
    server.replace_node("n1")
    server.modify("nodes", "n2", {"status": {"phase": "Running"}}, None)
    assert run_until(nodes, lambda: NodeRecord.objects.filter(replacements=1).exists())
    n1 = NodeRecord.objects.get(name="n1")
    assert n1.uid != "uid-1" and n1.history_since is not None
    n2 = NodeRecord.objects.get(name="n2")
    assert (n2.uid, n2.replacements, n2.history_since) == ("uid-2", 0, None)


def test_record_node_seen_outcomes():
    assert state.record_node_seen(name="x", uid="1") == "new"
    assert state.record_node_seen(name="x", uid="1") == "same"
    assert state.record_node_seen(name="x", uid="2") == "replaced"
    record = NodeRecord.objects.get(name="x")
    assert (record.uid, record.replacements) == ("2", 1)
