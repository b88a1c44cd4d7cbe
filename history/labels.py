"""Pipeline label values and the keys of KeyNode they count under.

A placement of `jenkins-java-maven-app1` counts under two kinds of key:

- its **segments**, `jenkins`, `java`, `maven`, `app1`: the Go tool's model, which
  `seed` scores (and `import_history` brings);
- its **label path**: the prefixes `jenkins-*`, `jenkins-java-*`,
  `jenkins-java-maven-*` and `jenkins-java-maven-app1-*` ("a pipeline under this
  path ran here", the label itself included), and the label itself,
  `jenkins-java-maven-app1$` ("this very pipeline ran here"). `warm` and the
  warmth of the ledger read these: a shared last segment with another prefix is
  not warmth.

Segments hold no `-`, `*` or `$`, so the two kinds never share a key.
"""

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


PREFIX_MARK = "-*"
PIPELINE_MARK = "$"


def path_keys(label: str | None) -> list[str]:
    """The label-path keys `warm` and warmth read for `label`, general to specific:
    one per proper prefix (`jenkins-*`, `jenkins-java-*`, ...) and the pipeline
    itself last (`jenkins-java-maven-app1$`). As many as the label's segments, so a
    key's position in the label is the same in both kinds; [] for no label."""
    segments = split_pipeline_label(label)
    if not segments:
        return []
    return [*_prefixes(segments, len(segments) - 1), _pipeline(segments)]


def placement_keys(label: str | None) -> list[str]:
    """Every key one placement of `label` counts under, each once: its distinct
    segments, every prefix of its path including the whole label (`...-app1-*`,
    which longer labels read), and the pipeline key. The one home of what a
    placement writes: the ledger, the caches that follow it, the audit and the
    simulator's store all go through here."""
    segments = split_pipeline_label(label)
    if not segments:
        return []
    return [
        *distinct_keys(segments),
        *_prefixes(segments, len(segments)),
        _pipeline(segments),
    ]


def _prefixes(segments: list[str], longest: int) -> list[str]:
    """`a-*`, `a-b-*`, ... for the first 1 to `longest` segments."""
    return [
        "-".join(segments[:length]) + PREFIX_MARK for length in range(1, longest + 1)
    ]


def _pipeline(segments: list[str]) -> str:
    return "-".join(segments) + PIPELINE_MARK


# The kinds of key, each as "title: what it says about a node", for the admin and
# the API.
KEY_KINDS = {
    "segment": "segment: one part of a label (jenkins, app1), the Go tool's model, "
    "which seed reads",
    "prefix": "label prefix: a pipeline under it ran here (jenkins-java-*)",
    "pipeline": "pipeline: this very pipeline ran here (jenkins-java-maven-app1$)",
}


def key_kind(key: str) -> str:
    """Which kind of key `key` is: "pipeline", "prefix" or "segment" (`KEY_KINDS`)."""
    if key.endswith(PIPELINE_MARK):
        return "pipeline"
    if key.endswith(PREFIX_MARK):
        return "prefix"
    return "segment"


def key_label(key: str) -> str:
    """The label (or label prefix) a label-path key names: `jenkins-java` for
    `jenkins-java-*` and for `jenkins-java$`; a segment is returned as it is."""
    for mark in (PIPELINE_MARK, PREFIX_MARK):
        if key.endswith(mark):
            return key[: -len(mark)]
    return key


# A Kubernetes label value is at most 63 characters of letters, digits, `-`, `_` and
# `.`; a key is what lies between two `-`, so it holds the same characters but `-`.
KEY_MAX_LENGTH = 63
KEY_RULE = (
    "One segment of a pipeline label (letters, digits, '_' and '.', at most "
    f"{KEY_MAX_LENGTH} characters, no '-'), a path prefix ending in '-*' "
    "(jenkins-java-*: a pipeline under jenkins-java ran here) or a pipeline ending "
    "in '$' (jenkins-java-maven-myapp$: this very pipeline ran here). The label "
    "jenkins-java-maven-myapp counts under its segments jenkins, java, maven and "
    "myapp, its prefixes jenkins-* to jenkins-java-maven-myapp-*, and "
    "jenkins-java-maven-myapp$."
)
_KEY_CHARACTERS = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_."
)


def is_valid_segment(key: object) -> bool:
    """True when `key` can be a segment of a pipeline label."""
    return (
        isinstance(key, str)
        and 0 < len(key) <= KEY_MAX_LENGTH
        and _KEY_CHARACTERS.issuperset(key)
    )


def is_valid_key(key: object) -> bool:
    """True when `key` is a key some placement counts under (see KEY_RULE).

    A row whose key fails this can never match a pod: `placement_keys` never
    returns such a key.
    """
    if not isinstance(key, str):
        return False
    for mark in (PREFIX_MARK, PIPELINE_MARK):
        if key.endswith(mark):
            path = key[: -len(mark)]
            return 0 < len(path) <= KEY_MAX_LENGTH and all(
                is_valid_segment(segment) for segment in path.split("-")
            )
    return is_valid_segment(key)
