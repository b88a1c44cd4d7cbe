"""Pipeline label values and their segments (the keys of KeyNode)."""

from __future__ import annotations

from collections.abc import Iterable


def split_pipeline_label(value: str | None) -> list[str]:
    """Return the keys of a pipeline label value, from general to specific.

    `jenkins-java-maven-1` gives `["jenkins", "java", "maven", "1"]`; empty segments
    (`a--b`, a trailing `-`) are ignored. None or "" gives [].
    """
    if not value:
        return []
    return [segment for segment in value.split("-") if segment]


def distinct_keys(keys: Iterable[str]) -> list[str]:
    """`keys` without repeats, first occurrence kept, in order.

    A label that repeats a segment (`a-b-a`) counts once per distinct key: every
    writer, reader and audit of the counts goes through here.
    """
    return list(dict.fromkeys(keys))


# A Kubernetes label value is at most 63 characters of letters, digits, `-`, `_` and
# `.`; a key is what lies between two `-`, so it holds the same characters but `-`.
KEY_MAX_LENGTH = 63
KEY_RULE = (
    "One segment of a pipeline label: letters, digits, '_' and '.', at most "
    f"{KEY_MAX_LENGTH} characters, no '-'. The label jenkins-java-maven-myapp is four "
    "keys: jenkins, java, maven and myapp."
)
_KEY_CHARACTERS = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_."
)


def is_valid_key(key: object) -> bool:
    """True when `key` can be a segment of a pipeline label (see KEY_RULE).

    A row whose key fails this can never match a pod: `split_pipeline_label` never
    returns such a segment.
    """
    return (
        isinstance(key, str)
        and 0 < len(key) <= KEY_MAX_LENGTH
        and _KEY_CHARACTERS.issuperset(key)
    )
