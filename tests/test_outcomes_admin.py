"""Outcomes in the admin: the startup/run chart on the pipeline page, the time-saved
headline there and on the index."""

import re
from datetime import timedelta
from xml.etree import ElementTree

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from history.ledger import record_outcome, record_placement
from tests.helpers import log_in

pytestmark = pytest.mark.django_db

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture
def admin_client(client):
    User.objects.create_superuser("admin", "admin@example.com", "pw-long-enough")
    log_in(client, "admin", "pw-long-enough")
    return client


def ran(uid, label, warmth, startup, run, ago=timedelta(hours=2)):
    record_placement(
        pod_uid=uid,
        namespace="ci",
        name=uid,
        label=label,
        node="n1",
        bound_at=timezone.now() - ago,
        warmth=warmth,
    )
    record_outcome(pod_uid=uid, startup=startup, run=run, outcome="Succeeded")


def chart(content: bytes) -> dict:
    svg = re.search(rb'<svg id="outcomes-chart".*?</svg>', content, re.S)
    assert svg, "no outcomes chart on the page"
    bars = {}
    for group in ElementTree.fromstring(svg.group(0)).iter(f"{SVG}g"):
        rect = group.find(f"{SVG}rect")
        lines = group.findall(f"{SVG}line")
        bars[(group.get("data-warmth"), group.get("data-measure"))] = {
            "p50": group.get("data-p50"),
            "p90": group.get("data-p90"),
            "width": float(rect.get("width")) if rect is not None else None,
            "whisker": float(lines[1].get("x1")) if lines else None,
        }
    return bars


def test_pipeline_page_charts_median_and_p90_by_warmth(admin_client):
    for i, (startup, run) in enumerate([(10, 100), (20, 300), (30, 200)]):
        ran(f"e{i}", "ci-java-app", "exact", startup, run)
    ran("c0", "ci-java-app", "cold", 120, 400)
    ran("other", "ci-go-svc", "cold", 999, 999)
    response = admin_client.get("/admin/pipeline/", {"q": "ci-java-app"})
    bars = chart(response.content)
    assert {key: (b["p50"], b["p90"]) for key, b in bars.items()} == {
        ("exact", "startup"): ("20", "30"),
        ("exact", "run"): ("200", "300"),
        ("partial", "startup"): ("-", "-"),
        ("partial", "run"): ("-", "-"),
        ("cold", "startup"): ("120", "120"),
        ("cold", "run"): ("400", "400"),
    }
    # One scale: the longest p90 (cold run, 400 s) spans the plot.
    assert bars[("cold", "run")]["width"] == 480
    assert bars[("exact", "run")]["width"] == 240
    assert bars[("exact", "run")]["whisker"] == 110 + 360
    assert bars[("partial", "run")]["width"] is None
    body = response.content.decode()
    assert "exact (3)" in body and "run: no successful runs" in body
    assert "<td>exact</td><td>3</td><td>0</td><td>20</td><td>30</td>" in body
    assert "Time saved: not known yet (needs at least 5 successful exact" in body


def test_pipeline_page_headline_and_empty_state(admin_client):
    for i in range(5):
        ran(f"e{i}", "ci-java-app", "exact", 10, 50)
        ran(f"c{i}", "ci-java-app", "cold", 70, 110)
    response = admin_client.get("/admin/pipeline/", {"q": "java"})
    headline = re.search(rb'<p id="outcomes-saved">(.*?)</p>', response.content, re.S)
    assert b"Warm placement saved <strong>10 min 0 s</strong>" in headline.group(1)
    assert b"(600 s)" in headline.group(1)
    response = admin_client.get("/admin/pipeline/", {"q": "maven"})
    assert b'id="outcomes-none"' in response.content
    assert b'id="outcomes-chart"' not in response.content


def test_index_shows_time_saved_over_the_last_30_days(admin_client):
    body = admin_client.get("/admin/").content.decode()
    assert "not known yet: no pipeline has 5 successful exact" in body
    for i in range(5):
        ran(f"e{i}", "ci-java-app", "exact", 10, 50)
        ran(f"c{i}", "ci-java-app", "cold", 70, 110)
        ran(f"ge{i}", "ci-go-svc", "exact", 5, 5)
        ran(f"gc{i}", "ci-go-svc", "cold", 5, 41)
        # Older than the window: left out.
        ran(f"old{i}", "ci-java-app", "cold", 5000, 5000, ago=timedelta(days=31))
    body = admin_client.get("/admin/").content.decode()
    saved = re.search(r'<td colspan="3" id="ks-time-saved">(.*?)</td>', body, re.S)
    # (180 - 60) x 5 + (46 - 10) x 5 = 780 s.
    assert "<strong>13 min 0 s</strong> over 2 pipelines" in saved.group(1)


def test_the_made_up_times_note_shows_only_under_the_demo(admin_client, settings):
    """A cluster's times are measured: no note. The demo's settings
    (tools/demo_settings.py) add one next to each time saved."""
    for i in range(5):
        ran(f"e{i}", "ci-java-app", "exact", 10, 50)
        ran(f"c{i}", "ci-java-app", "cold", 70, 110)
    pages = ("/admin/", "/admin/pipeline/?q=ci-java-app")
    for page in pages:
        assert b"made-up times" not in admin_client.get(page).content
    settings.KSSCHED_SIMULATED_TIMES = True
    index = admin_client.get(pages[0]).content.decode()
    assert 'id="ks-simulated-times"' in index
    pipeline = admin_client.get(pages[1]).content.decode()
    note = re.search(r'<p [^>]*id="outcomes-simulated">(.*?)</p>', pipeline, re.S)
    assert "the time saved shown here is made up, not measured" in note.group(1)
