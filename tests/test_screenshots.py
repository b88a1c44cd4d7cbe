"""Screenshots are rewritten only when the picture changed (tests/screenshots.py)."""

import struct
import zlib

from tests.screenshots import TOLERATED_PIXELS, differing_pixels, save_if_changed


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
