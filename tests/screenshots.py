"""Committed screenshots are rewritten only when the picture changed.

The admin shows clock times ("12:03 p.m.", "12 s ago"), so two runs never give the same
bytes. A new screenshot replaces the stored one when their sizes differ or when more
pixels differ than a clock ticking over can account for. Standard library only.
"""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

# About two lines of changed text at 1280 px (a temporary path, "12 s ago" become
# "13 s ago"); a layout or style change moves far more.
TOLERATED_PIXELS = 8000
CHANNELS = {0: 1, 2: 3, 4: 2, 6: 4}  # PNG colour type -> samples per pixel


def png_rows(data: bytes) -> tuple[int, int, int, list[bytes]]:
    """(width, height, samples per pixel, filtered rows) of an 8-bit PNG.

    The rows are the decompressed image data, each with its filter byte: equal
    pictures encoded by the same encoder give equal rows, and a local change gives
    local differences, which is all the comparison needs (no unfiltering).
    """
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    position, idat = 8, []
    width = height = channels = 0
    while position < len(data):
        (length,) = struct.unpack(">I", data[position : position + 4])
        kind = data[position + 4 : position + 8]
        body = data[position + 8 : position + 8 + length]
        position += 12 + length
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(
                ">IIBBBBB", body
            )
            if depth != 8 or interlace or colour not in CHANNELS:
                raise ValueError("only 8-bit, non-interlaced, non-palette PNGs")
            channels = CHANNELS[colour]
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    raw = zlib.decompress(b"".join(idat))
    stride = width * channels + 1
    rows = [raw[y * stride : (y + 1) * stride] for y in range(height)]
    return width, height, channels, rows


def differing_pixels(old: bytes, new: bytes) -> int | None:
    """About how many pixels differ; None when the sizes or formats differ.

    A row whose filter changed counts whole; otherwise its differing samples count,
    divided by the samples per pixel.
    """
    old_w, old_h, old_c, old_rows = png_rows(old)
    new_w, new_h, new_c, new_rows = png_rows(new)
    if (old_w, old_h, old_c) != (new_w, new_h, new_c):
        return None
    count = 0
    for a, b in zip(old_rows, new_rows, strict=True):
        if a == b:
            continue
        if a[0] != b[0]:
            count += old_w
        else:
            samples = sum(1 for x, y in zip(a, b, strict=True) if x != y)
            count += -(-samples // old_c)
    return count


def save_if_changed(path: Path, png: bytes, tolerated: int = TOLERATED_PIXELS) -> bool:
    """Write `png` to `path` unless the stored picture is the same; True if written."""
    if path.exists():
        old = path.read_bytes()
        if old == png:
            return False
        changed = differing_pixels(old, png)
        if changed is not None and changed <= tolerated:
            return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(png)
    return True


# What each committed picture shows, written beside them by `make screenshots`.
COMMITTED = Path(__file__).resolve().parent.parent / "docs" / "screenshots"
SHOWN_FILE = "shown.json"


def shown_record(directory: Path) -> dict[str, list[str]]:
    path = directory / SHOWN_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def check_shown(directory: Path, name: str, shown: list[str]) -> None:
    """Hold the picture `name` to what the page shows now (its columns and panels).

    Writing into the committed folder (`make screenshots`) records it; any other run
    compares it with the committed record, so a page that gained or lost a column
    or panel since its picture was taken fails until the picture is taken again.
    """
    if directory.resolve() == COMMITTED.resolve():
        record = shown_record(directory)
        record[name] = shown
        text = json.dumps(dict(sorted(record.items())), indent=1, ensure_ascii=False)
        (directory / SHOWN_FILE).write_text(text + "\n")
        return
    committed = shown_record(COMMITTED).get(name)
    if committed is None:
        raise AssertionError(f"docs/screenshots/{name} has no record: make screenshots")
    if committed != shown:
        new = [item for item in shown if item not in committed]
        gone = [item for item in committed if item not in shown]
        raise AssertionError(
            f"docs/screenshots/{name} is stale: the page now shows {new} and no longer "
            f"{gone}; run make screenshots"
        )
