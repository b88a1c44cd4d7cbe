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

The path is read from the label's text as written: an empty segment (`team--build`)
is a step of the path like any other, so `team--build` has the path keys `team-*`,
`team--*` and `team--build$`, and shares only `team-*` with `team-build`. Distinct
labels have distinct pipeline keys. Segment keys ignore empty segments: both labels
count under the segments `team` and `build`, as the Go tool counts them.

Segments hold no `-`, `*` or `$`, so the two kinds never share a key.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from history.validation import has_nul, nul_message


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
    itself last (`jenkins-java-maven-app1$`); [] for no label.

    One key per step of the label's path (`path_steps`): an empty segment is a
    step, so `team--build` gives `team-*`, `team--*` and `team--build$`, none of
    which but `team-*` is a key of `team-build`."""
    steps = path_steps(label)
    if not steps:
        return []
    return [*_prefixes(steps, len(steps) - 1), _pipeline(steps)]


def path_steps(label: str | None) -> list[str]:
    """The steps of `label`'s path: its text split at every `-`, empty segments
    kept, except at either end (`-a-` reads as `a`; no valid label value starts or
    ends with `-`). [] when the label has no segment."""
    if not split_pipeline_label(label):
        return []
    return (label or "").strip("-").split("-")


def placement_keys(label: str | None) -> list[str]:
    """Every key one placement of `label` counts under, each once: its distinct
    segments, every prefix of its path including the whole label (`...-app1-*`,
    which longer labels read), and the pipeline key. The one home of what a
    placement writes: the ledger, the caches that follow it, the audit and the
    simulator's store all go through here.

    A label that is not a valid Kubernetes label value (`label_value_problem`)
    counts under none of its path keys and only its valid segments: no new
    placement has one (every writer skips it), but the ledger may hold rows
    recorded before the rule, whose segment rows stay."""
    steps = path_steps(label)
    if not steps:
        return []
    if not is_valid_label_value(label or ""):
        return [
            s for s in distinct_keys(split_pipeline_label(label)) if is_valid_segment(s)
        ]
    return [
        *distinct_keys(split_pipeline_label(label)),
        *_prefixes(steps, len(steps)),
        _pipeline(steps),
    ]


def _prefixes(steps: list[str], longest: int) -> list[str]:
    """`a-*`, `a-b-*`, ... for the first 1 to `longest` steps."""
    return ["-".join(steps[:length]) + PREFIX_MARK for length in range(1, longest + 1)]


def _pipeline(steps: list[str]) -> str:
    return "-".join(steps) + PIPELINE_MARK


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
            # A path keeps its empty segments (`team--*` is the path `team-`,
            # `team--build$`), but starts with a segment, and a pipeline also
            # ends with one.
            steps = key[: -len(mark)].split("-")
            return (
                0 < len(key) - len(mark) <= KEY_MAX_LENGTH
                and is_valid_segment(steps[0])
                and (mark == PREFIX_MARK or is_valid_segment(steps[-1]))
                and all(step == "" or is_valid_segment(step) for step in steps)
            )
    return is_valid_segment(key)


# A Kubernetes label value: at most 63 characters, alphanumeric at both ends, with
# `-`, `_` and `.` between (apimachinery's IsValidLabelValue). The API server admits
# no other value, so anything else did not come from a real pod.
LABEL_VALUE_MAX_LENGTH = 63
_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


def is_valid_label_value(value: str) -> bool:
    """True when `value` is a label value the Kubernetes API server accepts.

    The length is checked first, so a value of any size is judged in constant time.
    """
    return len(value) <= LABEL_VALUE_MAX_LENGTH and bool(_LABEL_VALUE.fullmatch(value))


def label_value_problem(label: str, value: object) -> str | None:
    """Why `value` cannot be the value of the pod label `label`, or None.

    The one check of a pipeline label value, for the extender (a 400), the
    webhook (a warning), the watcher, the ledger's replays and the import (a
    skipped, counted row): a string, no NUL character, and a value the API server
    admits (at most 63 characters, checked first, so a value of any size is judged
    at once). Nothing is looked up for a refused value.
    """
    if not isinstance(value, str):
        return f"Pod label {label!r} must be a string"
    if has_nul(value):
        return nul_message(f"Pod label {label!r}")
    if not is_valid_label_value(value):
        shown = value if len(value) <= 80 else f"{value[:40]}...{value[-20:]}"
        return (
            f"Pod label {label!r} is not a valid Kubernetes label value "
            f"({len(value)} characters, {shown!r}): at most "
            f"{LABEL_VALUE_MAX_LENGTH} characters, alphanumeric at both ends, "
            "'-', '_' and '.' between"
        )
    return None


# Labels named in the log once each; beyond this many, invalid labels are only
# counted, so a stream or a ledger full of bad labels cannot fill memory with names.
INVALID_LABELS_NAMED = 1000


class InvalidLabels:
    """Label values a pass skipped because they are not valid Kubernetes label
    values (`label_value_problem`): every one counted in `rows`, each distinct value
    named once (`is_first`), at most `INVALID_LABELS_NAMED` of them."""

    def __init__(self, named: int = INVALID_LABELS_NAMED) -> None:
        self.rows = 0
        self.named: set[str] = set()
        self.limit = named

    def is_first(self, label: str) -> bool:
        """Count one skipped `label`; True when it is to be named (logged) now."""
        self.rows += 1
        if label in self.named or len(self.named) >= self.limit:
            return False
        self.named.add(label)
        return True
