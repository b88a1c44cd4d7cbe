"""Pipeline label values and their segments (the keys of KeyNode)."""

from __future__ import annotations


def split_pipeline_label(value: str | None) -> list[str]:
    """Return the keys of a pipeline label value, from general to specific.

    `jenkins-java-maven-1` gives `["jenkins", "java", "maven", "1"]`; empty segments
    (`a--b`, a trailing `-`) are ignored. None or "" gives [].
    """
    if not value:
        return []
    return [segment for segment in value.split("-") if segment]
