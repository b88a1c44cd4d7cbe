"""`make demo`: the real extender and watcher on a simulated cluster fill the admin."""

import http.cookiejar
import re
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
        chart = opener.open(f"{url}/admin/pipeline/?q=jenkins").read().decode()
        assert 'class="bar"' in chart
    finally:
        demo.terminate()
        output, _ = demo.communicate(timeout=60)
    assert demo.returncode == 0, output
    assert "Stopping the demo" in output
    # Loopback only.
    assert (
        f"Listening at: http://127.0.0.1:{port}" in (tmp_path / "web.log").read_text()
    )
