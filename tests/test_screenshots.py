"""Screenshots are rewritten only when the picture changed (tests/screenshots.py)."""

import re
import struct
import zlib

import pytest

from tests.helpers import REPO, default_scoring
from tests.screenshots import (
    COMMITTED,
    TOLERATED_PIXELS,
    check_shown,
    differing_pixels,
    save_if_changed,
    shown_record,
)


def png(width, height, changed=0, filter_type=0):
    """A grey RGB picture with its first `changed` pixels white."""
    rows = []
    for y in range(height):
        row = bytearray(b"\x80" * (width * 3))
        for x in range(width):
            if y * width + x < changed:
                row[x * 3 : x * 3 + 3] = b"\xff\xff\xff"
        rows.append(bytes([filter_type]) + bytes(row))

    def chunk(kind, body):
        crc = zlib.crc32(kind + body)
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"".join(rows)))
        + chunk(b"IEND", b"")
    )


def test_differing_pixels_counts_changed_pixels():
    assert differing_pixels(png(200, 100), png(200, 100)) == 0
    assert differing_pixels(png(200, 100), png(200, 100, changed=37)) == 37
    assert differing_pixels(png(200, 100), png(200, 101)) is None
    # A row encoded with another filter counts whole.
    assert differing_pixels(png(200, 2), png(200, 2, filter_type=2)) == 400


def test_a_new_screenshot_is_written(tmp_path):
    path = tmp_path / "shots" / "index.png"
    assert save_if_changed(path, png(100, 50))
    assert path.read_bytes() == png(100, 50)


def test_the_same_picture_is_not_rewritten(tmp_path):
    path = tmp_path / "index.png"
    path.write_bytes(png(300, 300))
    stored = path.stat().st_mtime_ns
    assert not save_if_changed(path, png(300, 300))
    # A clock ticking over changes a few pixels: still the same picture.
    assert not save_if_changed(path, png(300, 300, changed=100))
    assert path.stat().st_mtime_ns == stored
    assert path.read_bytes() == png(300, 300)


def test_a_changed_picture_is_rewritten(tmp_path):
    path = tmp_path / "index.png"
    path.write_bytes(png(300, 300))
    assert save_if_changed(path, png(300, 300, changed=TOLERATED_PIXELS + 1))
    assert path.read_bytes() == png(300, 300, changed=TOLERATED_PIXELS + 1)
    assert save_if_changed(path, png(300, 301))


def test_every_committed_picture_has_a_record_of_what_it_shows():
    pictures = {path.name for path in COMMITTED.glob("*.png")}
    assert pictures
    assert set(shown_record(COMMITTED)) == pictures


def test_every_picture_the_docs_show_is_committed():
    docs = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    shown = set()
    for doc in docs:
        shown |= set(re.findall(r"docs/screenshots/([\w.-]+\.png)", doc.read_text()))
        shown |= set(re.findall(r"\(screenshots/([\w.-]+\.png)\)", doc.read_text()))
    assert shown
    assert shown <= {path.name for path in COMMITTED.glob("*.png")}


def test_a_page_that_changed_since_its_picture_fails(tmp_path):
    (name,) = sorted(shown_record(COMMITTED))[:1]
    recorded = shown_record(COMMITTED)[name]
    check_shown(tmp_path, name, recorded)  # the same page: fine
    with pytest.raises(AssertionError, match="stale.*Weight later"):
        check_shown(tmp_path, name, [*recorded, "th: Weight later"])
    with pytest.raises(AssertionError, match="no record"):
        check_shown(tmp_path, "never-taken.png", recorded)


def test_the_readme_hero_shows_the_default_strategy():
    """README's first picture is the pipeline page as a new install shows it: its
    record (taken with the page, tests/test_browser.py) names the default strategy."""
    readme = (REPO / "README.md").read_text()
    hero = re.search(r"!\[[^\]]*\]\(docs/screenshots/([\w.-]+\.png)\)", readme)
    assert hero and hero.group(1) == "pipeline.png"
    assert f"code: {default_scoring()}" in shown_record(COMMITTED)["pipeline.png"]
