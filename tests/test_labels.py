"""history.labels: a pipeline label's keys."""

import pytest

from history.labels import distinct_keys, is_valid_key, split_pipeline_label


@pytest.mark.parametrize(
    ("value", "keys"),
    [
        ("jenkins-java-maven-1", ["jenkins", "java", "maven", "1"]),
        ("a--b-", ["a", "b"]),
        ("-", []),
        ("", []),
        (None, []),
        ("single", ["single"]),
    ],
)
def test_split_pipeline_label_ignores_empty_segments(value, keys):
    assert split_pipeline_label(value) == keys


def test_distinct_keys_keeps_the_first_of_each_in_order():
    assert distinct_keys(split_pipeline_label("a-b-a-c-b")) == ["a", "b", "c"]
    assert distinct_keys(iter(["x", "x"])) == ["x"]
    assert distinct_keys([]) == []


@pytest.mark.parametrize(
    ("key", "valid"),
    [
        ("team--*", True),
        ("team---*", True),
        ("team--build$", True),
        ("team-build-*", True),
        ("-*", False),
        ("team-$", False),
        ("-team$", False),
    ],
)
def test_path_keys_with_empty_segments_are_valid_keys(key, valid):
    assert is_valid_key(key) is valid
