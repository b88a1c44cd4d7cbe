"""`make demo`: the real extender and watcher on a simulated cluster fill the admin."""

import http.cookiejar
import re
import sqlite3
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest

from tests.helpers import REPO, free_port

pytestmark = pytest.mark.slow


def admin_session(url: str, username: str, password: str):
    """An opener logged in through the admin's login form."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    opener.open(f"{url}/admin/login/").read()
    token = next(cookie.value for cookie in jar if cookie.name == "csrftoken")
    form = urllib.parse.urlencode(
        {
            "username": username,
            "password": password,
            "csrfmiddlewaretoken": token,
            "next": "/admin/",
        }
    ).encode()
    request = urllib.request.Request(
        f"{url}/admin/login/", data=form, headers={"Referer": f"{url}/admin/login/"}
    )
    opener.open(request).read()
    return opener


def ledger(directory, query):
    with sqlite3.connect(f"file:{directory / 'demo.db'}?mode=ro", uri=True) as db:
        return db.execute(query).fetchall()


def placements_of(directory) -> int:
    return ledger(directory, "SELECT COUNT(*) FROM history_placement")[0][0]


def second_demo(port: int, directory) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tools.demo", "--port", str(port), "--minutes", "1"]
        + ["--dir", str(directory)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def check_a_second_demo_stops_before_touching_the_first(
    directory, port: int, url: str, username: str, password: str
) -> None:
    """While a demo runs, a second one on its directory or its port exits at once
    with one line naming DEMO_PORT and a free port; the first keeps its database
    and its login."""
    database = directory / "demo.db"
    inode, before = database.stat().st_ino, placements_of(directory)
    same = second_demo(port, directory)  # `make demo` twice: same port, same dir
    assert same.returncode == 1
    (line,) = same.stderr.splitlines()
    assert line.startswith(f"make demo: a demo is running on {directory} (pid "), line
    assert "e.g. make demo DEMO_PORT=" in line
    free = int(re.search(r"DEMO_PORT=(\d+)", line).group(1))
    assert free != port
    assert "Login" not in same.stdout
    other_dir = directory / "second"
    taken = second_demo(port, other_dir)  # its own directory, the same port
    assert taken.returncode == 1
    (line,) = taken.stderr.splitlines()
    assert line.startswith(f"make demo: 127.0.0.1:{port} is in use ("), line
    assert "set DEMO_PORT to a free port, e.g. make demo DEMO_PORT=" in line
    assert not (other_dir / "demo.db").exists()
    # The first demo's database is the same file, still growing, and its login works.
    assert database.stat().st_ino == inode
    assert placements_of(directory) >= before
    page = admin_session(url, username, password).open(f"{url}/admin/").read()
    assert b'id="ks-total-placements"' in page


def test_demo_shows_placements_in_the_admin(tmp_path):
    port = free_port()
    demo = subprocess.Popen(
        [sys.executable, "-m", "tools.demo", "--port", str(port), "--minutes", "1"]
        + ["--rate", "3", "--seed", "7", "--dir", str(tmp_path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        banner = ""
        while "Ctrl-C stops" not in banner:
            line = demo.stdout.readline()
            assert line, banner
            banner += line
        url = f"http://127.0.0.1:{port}"
        assert f"Admin:    {url}/admin/" in banner
        username, password = re.search(r"Login:\s+(\S+) / (\S+)", banner).groups()
        opener = admin_session(url, username, password)
        total = 0
        deadline = time.monotonic() + 40
        while total < 20 and time.monotonic() < deadline:
            time.sleep(2)
            page = opener.open(f"{url}/admin/").read().decode()
            total = int(re.search(r'id="ks-total-placements">(\d+)<', page).group(1))
        assert total >= 20
        # The pipeline the banner links to has its chart.
        pipeline = re.search(r"Pipeline: (\S+)", banner).group(1)
        assert pipeline.startswith(f"{url}/admin/pipeline/?q=")
        chart = opener.open(pipeline).read().decode()
        assert 'class="bar"' in chart
        # The demo's times are drawn by warmth class: it says so wherever it shows
        # the time saved (its output, the admin index, the pipeline page).
        assert "so the time saved the demo shows is made up" in banner
        assert 'id="outcomes-simulated"' in chart
        assert "Demo: made-up times." in chart
        index = opener.open(f"{url}/admin/").read().decode()
        assert 'id="ks-simulated-times"' in index
        check_a_second_demo_stops_before_touching_the_first(
            tmp_path, port, url, username, password
        )
        # The pods report their containers' start and end: the ledger gets startup
        # and run times within the first minute.
        timed = 0
        while not timed and time.monotonic() < deadline + 60:
            time.sleep(2)
            timed = ledger(
                tmp_path,
                "SELECT COUNT(*) FROM history_placement"
                " WHERE startup_seconds IS NOT NULL AND run_seconds IS NOT NULL",
            )[0][0]
        assert timed
    finally:
        demo.terminate()
        output, _ = demo.communicate(timeout=60)
    assert demo.returncode == 0, output
    assert "Stopping the demo" in output
    # The headline is the ledger's warmth, and the ledger's warmth is "this pipeline
    # ran on this node before", as the documented query recomputes it.
    rows = dict(
        ledger(
            tmp_path, "SELECT warmth, COUNT(*) FROM history_placement GROUP BY warmth"
        )
    )
    total = sum(rows.values())
    shares = ", ".join(
        f"{rows.get(level, 0) / total:.0%} {level}"
        for level in ("exact", "partial", "cold")
    )
    assert output.rstrip().endswith(f"ledger: {total} placements, {shares}"), output
    check = (REPO / "tools" / "demo_warmth.sql").read_text()
    with sqlite3.connect(tmp_path / "demo.db") as db:
        cursor = db.execute(check)
        result = dict(
            zip([c[0] for c in cursor.description], cursor.fetchone(), strict=True)
        )
    assert result["placements"] == total
    assert result["ledger_exact"] == rows.get("exact", 0) > 0
    assert result["disagreements"] == 0
    # Loopback only.
    assert (
        f"Listening at: http://127.0.0.1:{port}" in (tmp_path / "web.log").read_text()
    )
