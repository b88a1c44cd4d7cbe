"""The watcher skips pipeline labels that are not valid Kubernetes label values, as
the extender and the webhook refuse them: through the real `watch_pods --once`
against the test API server (which, unlike the real one, passes any label on)."""

import logging

import pytest

from history.labels import InvalidLabels
from history.models import KeyNode, Placement
from history.watcher import metrics
from tests.fakeapi import make_pod
from tests.helpers import watch_once

pytestmark = pytest.mark.django_db(transaction=True)

INVALID = ["jenkins-java$", "jenkins-*", "jénkins-java", "a" * 64, "-jenkins"]


def test_invalid_label_values_are_skipped_logged_once_and_counted(
    server, tmp_path, caplog
):
    for label in INVALID:
        for node in ("n1", "n2"):
            server.add_pod(make_pod(f"p-{len(label)}-{node}", label=label, node=node))
    server.add_pod(make_pod("good", label="jenkins-java", node="n1"))
    before = metrics.PODS_INVALID_LABEL._value.get()

    with caplog.at_level(logging.WARNING, logger="history.watcher"):
        watch_once(server, tmp_path)

    assert list(Placement.objects.values_list("label", flat=True)) == ["jenkins-java"]
    assert sorted(KeyNode.objects.values_list("key", flat=True)) == [
        "java",
        "jenkins",
        "jenkins-*",
        "jenkins-java$",
        "jenkins-java-*",
    ]
    assert metrics.PODS_INVALID_LABEL._value.get() - before == 2 * len(INVALID)
    skipped = [
        r.getMessage() for r in caplog.records if "Skipping pod" in r.getMessage()
    ]
    assert len(skipped) == len(INVALID)
    assert all("not a valid Kubernetes label value" in line for line in skipped)


def test_the_labels_named_in_the_log_are_bounded():
    seen = InvalidLabels(named=2)
    assert [seen.is_first(label) for label in ["a$", "a$", "b$", "c$", "c$"]] == [
        True,
        False,
        True,
        False,
        False,
    ]
    assert seen.rows == 5
    assert seen.named == {"a$", "b$"}
