"""extender.wire: what the extender reads from a request body."""

import pytest

from extender.wire import ExtenderArgsError, parse_extender_args


@pytest.mark.parametrize(
    ("body", "count"),
    [
        ({"Pod": {}, "NodeNames": ["a", "b"]}, 2),
        ({"Pod": {}, "Nodes": {"items": [{}, {}, {}]}}, 3),
        ({"Pod": {}, "Nodes": {"items": None}}, 0),
        ({"Pod": {}, "Nodes": None, "NodeNames": None}, 0),
        # In cache mode the names are what the scheduler reads back.
        ({"Pod": {}, "Nodes": {"items": [{}]}, "NodeNames": ["a", "b"]}, 2),
    ],
)
def test_candidate_count_reads_whichever_list_was_sent(body, count):
    assert parse_extender_args(body).candidate_count() == count


def test_the_pod_label_is_checked_after_its_shape():
    args = parse_extender_args({"Pod": {"metadata": {"labels": {"l": "a--b"}}}})
    assert args.pod_label("l") == "a--b"
    assert args.pod_label("other") is None
    for pod, message in [
        ({"metadata": []}, "Pod.metadata must be an object"),
        ({"metadata": {"labels": {"l": "bad value"}}}, "not a valid Kubernetes label"),
    ]:
        with pytest.raises(ExtenderArgsError, match=message):
            parse_extender_args({"Pod": pod}).pod_label("l")
