"""The admin in a real headless Chromium against a live test server.

Debian's chromium, driven by Playwright's sync API (no downloaded browsers). Each test
logs in through the login form like a person would and checks the database after
acting. Screenshots of the main pages, 1280 px wide, go to var/screenshots/ (or
KSSCHED_SCREENSHOT_DIR); `make screenshots` refreshes the committed copies in
docs/screenshots/ when the picture changed, so a reviewer can look without running
anything.
"""

import os
from datetime import UTC, datetime, timedelta
from importlib import import_module
from pathlib import Path

import pytest
from django.apps import apps as django_apps
from django.contrib.auth.models import Group, User
from django.test import override_settings
from django.utils import timezone

from extender.scoring.steering import process_memory
from history.corrections import create_key_node
from history.labels import placement_keys, split_pipeline_label
from history.ledger import finish_placement, record_placement
from history.models import KeyNode, NodeRecord, Placement, WatchState
from history.reader.pool import database_pool
from tests.helpers import IS_CI, REPO, default_scoring
from tests.screenshots import check_shown, save_if_changed

# Playwright's sync API runs an event loop in this thread; the ORM calls made here
# between browser steps are still plain synchronous calls.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM = Path(os.environ.get("KSSCHED_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = Path(
    os.environ.get("KSSCHED_SCREENSHOT_DIR", REPO / "var" / "screenshots")
)
PASSWORD = "a-long-browser-pass-42"

pytestmark = [
    pytest.mark.browser,
    # Transactional: the live server thread must see the test's rows.
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not CHROMIUM.exists() and not IS_CI,
        reason=f"{CHROMIUM} is not installed",
    ),
]


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    # The width of a laptop screen: the screenshots show what most people see.
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(10_000)
    page = context.new_page()
    yield page
    context.close()


def login(page, live_server, username, next_path="/admin/"):
    page.goto(f"{live_server.url}/admin/login/?next={next_path}")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_server.url}{next_path}")


# What a picture shows: the headings of its panels and the columns of its tables
# (numbers left out: they are the data, not the page), and on a pipeline page the
# scoring strategy it shows.
SHOWN = """(within) => {
    const root = document.querySelector(within || '#content');
    const shown = 'h1, h2, h3, thead th, svg[id], .module[id], #pipeline-strategy';
    return [...root.querySelectorAll(shown)]
        .filter(el => el.getBoundingClientRect().height > 0)
        .map(el => el.tagName.toLowerCase() + ': '
             + (el.matches('svg, .module') ? '#' + el.id
                : el.innerText.replace(/\\d+/g, '#').replace(/\\s+/g, ' ').trim()))
        .filter(text => !text.endsWith(': '));
}"""


def screenshot(page, name, within=None):
    """Store a full-page screenshot, unless the stored one shows the same picture,
    and hold the committed picture to what the page shows (tests/screenshots.py)."""
    save_if_changed(SCREENSHOTS / name, page.screenshot(full_page=True))
    check_shown(SCREENSHOTS, name, page.evaluate(SHOWN, within))


@pytest.fixture
def superuser():
    return User.objects.create_superuser("admin", "admin@example.com", PASSWORD)


@pytest.fixture
def viewer():
    user = User.objects.create_user("viewer", password=PASSWORD, is_staff=True)
    user.groups.add(viewer_group())
    return user


def viewer_group():
    """The group migration 0002 creates; made again by the same code if a
    transactional test's flush removed it."""
    group = Group.objects.filter(name="ks-scheduler viewers").first()
    if group is None:
        migration = import_module("history.migrations.0002_viewer_group")
        migration.create_viewer_group(django_apps, None)
        group = Group.objects.get(name="ks-scheduler viewers")
    return group


PIPELINES = {
    # label: [(node, pods placed), ...]
    "jenkins-java-maven": [("worker-a1", 14), ("worker-a2", 6), ("worker-b1", 2)],
    "jenkins-java-gradle": [("worker-a2", 9), ("worker-b2", 3)],
    "jenkins-python-pytest": [("worker-b1", 5), ("worker-b3", 4)],
    "gitlab-go-build": [("worker-c1", 8), ("worker-a1", 1)],
}
NODES = ["worker-a1", "worker-a2", "worker-b1", "worker-b2", "worker-b3", "worker-c1"]


# The history's clock: fixed, so the screenshots show the same dates on every run.
HISTORY_NOW = datetime(2026, 1, 5, 9, 41, tzinfo=UTC)


@pytest.fixture
def cluster_history():
    """A small cluster's worth of history, recorded the way the watcher records it."""
    now = HISTORY_NOW
    number = 0
    for label, placements in PIPELINES.items():
        for node, pods in placements:
            for index in range(pods):
                number += 1
                uid = f"uid-{number:04d}"
                record_placement(
                    pod_uid=uid,
                    namespace="ci",
                    name=f"{label}-{number}",
                    label=label,
                    node=node,
                    bound_at=now - timedelta(minutes=37 * number),
                )
                # The older pods have finished; the newest of each run still run.
                if index >= 2:
                    finish_placement(pod_uid=uid, finished_at=now)
    for node in NODES:
        NodeRecord.objects.create(name=node, uid=f"{node}-uid")
    create_key_node(key="legacy", node="worker-b3", count=0, actor="admin")
    KeyNode.objects.update(created=now, updated=now)
    KeyNode.objects.exclude(last_placed_at=None).update(last_placed_at=now)
    # The watcher's health is relative to the real clock.
    now = timezone.now()
    WatchState.objects.create(
        name="pods",
        resource_version="48213",
        last_event_at=now - timedelta(seconds=12),
        heartbeat_at=now - timedelta(seconds=4),
        relists=2,
        events=number,
        holder="ks-scheduler-0",
    )


# Names as real clusters make them: long, with many hyphens.
LONG_LABEL = "jenkins-platform-services-java17-maven-payments-gateway-integration"
LONG_NODE = "ip-10-120-37-214.eu-central-1.compute.internal"


@pytest.fixture
def long_names():
    """A placement and counts with the long names of a real cluster."""
    record_placement(
        pod_uid="uid-long",
        namespace="ci-payments-gateway-integration",
        name=f"{LONG_LABEL}-build-4711-x7k2p",
        label=LONG_LABEL,
        node=LONG_NODE,
        bound_at=HISTORY_NOW - timedelta(minutes=3),
    )


def table_rows(page):
    """(key, node, count text) of the KeyNode change list as shown."""
    rows = []
    for row in page.locator("#result_list tbody tr").all():
        cells = row.locator("th, td")
        key = row.locator("th.field-key").inner_text().strip()
        node = row.locator("td.field-node_name").inner_text().strip()
        count_input = row.locator("td.field-count input")
        if count_input.count():
            count = count_input.input_value()
        else:
            count = row.locator("td.field-count").inner_text().strip()
        assert cells.count() > 3
        rows.append((key, node, count))
    return rows


def test_anonymous_users_are_sent_to_login(page, live_server):
    for path in ("/admin/", "/admin/history/keynode/", "/admin/pipeline/?q=maven"):
        page.goto(f"{live_server.url}{path}")
        assert page.url.startswith(f"{live_server.url}/admin/login/")
        assert page.locator("#id_username").is_visible()


def test_login_shows_the_overview(page, live_server, superuser, cluster_history):
    login(page, live_server, "admin")
    assert page.locator("#ks-overview").is_visible()
    assert page.locator("#ks-total-placements").inner_text() == str(
        sum(pods for rows in PIPELINES.values() for _, pods in rows)
    )
    assert page.locator("#ks-empty-state").count() == 0
    watcher = page.locator("#ks-watcher").inner_text()
    assert "48213" in watcher and "ks-scheduler-0" in watcher
    assert "SQLite" in page.locator("#ks-database").inner_text() or "PostgreSQL" in (
        page.locator("#ks-database").inner_text()
    )
    busiest = page.locator("#ks-busiest-keys tbody tr").first.inner_text()
    assert busiest.startswith("jenkins")
    # ks-scheduler's own models come first; there is no site to "view".
    sections = page.locator("#content-main .module caption").all_inner_texts()
    assert sections[0].lower() == "pipeline history", sections
    assert page.get_by_role("link", name="View site").count() == 0
    screenshot(page, "admin-index.png")


def test_empty_history_says_what_to_check(page, live_server, superuser):
    login(page, live_server, "admin")
    empty = page.locator("#ks-empty-state").inner_text()
    assert "watch_pods" in empty
    assert "ks-pipeline: <value>" in empty
    assert "schedulerName: ks-scheduler" in empty


def test_search_and_filter_keynodes(page, live_server, superuser, cluster_history):
    login(page, live_server, "admin", "/admin/history/keynode/")
    page.fill("#searchbar", "pytest")
    page.press("#searchbar", "Enter")
    page.wait_for_url("**/?q=pytest")
    # The segment and the label path of jenkins-python-pytest.
    assert {key for key, _, _ in table_rows(page)} == {
        "pytest",
        "jenkins-python-pytest-*",
        "jenkins-python-pytest$",
    }
    filters = page.locator("#changelist-filter")
    filters.get_by_role("link", name="segment", exact=True).click()
    page.wait_for_url("**kind=segment**")
    assert table_rows(page) == [
        ("pytest", "worker-b1", "5"),
        ("pytest", "worker-b3", "4"),
    ]
    filters.get_by_role("link", name="pipeline", exact=True).click()
    page.wait_for_url("**kind=pipeline**")
    assert table_rows(page) == [
        ("jenkins-python-pytest$", "worker-b1", "5"),
        ("jenkins-python-pytest$", "worker-b3", "4"),
    ]
    kinds = page.locator("#result_list td.field-kind").all_inner_texts()
    assert kinds == ["pipeline", "pipeline"]
    page.goto(f"{live_server.url}/admin/history/keynode/")
    page.locator("#changelist-filter").get_by_role("link", name="worker-c1").click()
    page.wait_for_url("**node=worker-c1**")
    assert {key for key, _, _ in table_rows(page)} == set(
        placement_keys("gitlab-go-build")
    )
    page.goto(f"{live_server.url}/admin/history/keynode/?key=java&o=-3")
    shown = table_rows(page)
    assert [node for _, node, _ in shown] == [
        "worker-a2",
        "worker-a1",
        "worker-b2",
        "worker-b1",
    ]
    page.goto(f"{live_server.url}/admin/history/keynode/?o=-3")
    counts = [int(count) for _, _, count in table_rows(page)]
    assert counts == sorted(counts, reverse=True)
    screenshot(page, "keynode-list.png")


def test_inline_count_edit_is_saved(page, live_server, superuser, cluster_history):
    login(page, live_server, "admin", "/admin/history/keynode/?key=maven")
    row = page.locator("#result_list tbody tr", has_text="worker-a1")
    row.locator("td.field-count input").fill("30")
    page.click("input[name=_save]")
    page.wait_for_selector("ul.messagelist")
    assert "changed successfully" in page.locator("ul.messagelist").inner_text()
    assert KeyNode.objects.get(key="maven", node="worker-a1").count == 30
    page.goto(f"{live_server.url}/admin/history/keynode/?key=maven")
    row = page.locator("#result_list tbody tr", has_text="worker-a1")
    assert row.locator("td.field-count input").input_value() == "30"
    row.locator("th.field-key a").click()
    page.click("a.historylink")
    assert (
        "Changed count from 14 to 30." in page.locator("#change-history").inner_text()
    )


def test_inline_negative_count_is_refused(
    page, live_server, superuser, cluster_history
):
    login(page, live_server, "admin", "/admin/history/keynode/?key=maven")
    row = page.locator("#result_list tbody tr", has_text="worker-a1")
    row.locator("td.field-count input").fill("-3")
    page.click("input[name=_save]")
    page.wait_for_selector(".errornote")
    assert KeyNode.objects.get(key="maven", node="worker-a1").count == 14


def test_bulk_halve(page, live_server, superuser, cluster_history):
    login(page, live_server, "admin", "/admin/history/keynode/?key=java")
    before = dict(KeyNode.objects.filter(key="java").values_list("node", "count"))
    for node in ("worker-a1", "worker-a2"):
        row = page.locator("#result_list tbody tr", has_text=node)
        row.locator("input.action-select").check()
    page.select_option("select[name=action]", "halve_counts")
    page.click("button[name=index]")
    page.wait_for_selector("ul.messagelist")
    after = dict(KeyNode.objects.filter(key="java").values_list("node", "count"))
    assert after == {
        **before,
        "worker-a1": before["worker-a1"] // 2,
        "worker-a2": before["worker-a2"] // 2,
    }


def test_pipeline_page_chart(page, live_server, superuser, cluster_history):
    label = "jenkins-java-maven"
    keys = split_pipeline_label(label)
    # Per node, the count of the most specific segment it has: what the score uses.
    expected = {}
    for node in NODES:
        for key in reversed(keys):
            row = KeyNode.objects.filter(key=key, node=node, count__gt=0).first()
            if row:
                expected[node] = row.count
                break
    login(page, live_server, "admin", "/admin/")
    page.goto(f"{live_server.url}/admin/history/keynode/?key=maven")
    row = page.locator("#result_list tbody tr", has_text="worker-a1")
    row.get_by_role("link", name="pipeline").click()
    page.wait_for_url("**/admin/pipeline/?q=maven")
    page.fill("#pipeline-q", label)
    page.press("#pipeline-q", "Enter")
    page.wait_for_url(f"**q={label}")
    bars = page.locator("#pipeline-chart g.bar")
    assert bars.count() == len(expected)
    shown, order = {}, []
    table = {
        row.get_attribute("data-node"): int(row.locator("td.score").text_content())
        for row in page.locator("#pipeline-scores tbody tr").all()
    }
    for bar in bars.all():
        node = bar.get_attribute("data-node")
        score = bar.locator("text.bar-score").text_content()
        # The bar draws the score the table gives, with the score on it.
        assert int(score) == table[node]
        assert bar.locator("title").text_content().startswith(f"{node}: score {score} ")
        assert float(bar.locator("rect.bar-score-rect").get_attribute("width")) > 0
        shown[node] = int(bar.get_attribute("data-count"))
        order.append(int(score))
    assert shown == expected
    assert order == sorted(order, reverse=True)
    widths = [
        float(r.get_attribute("width"))
        for r in bars.locator("rect.bar-score-rect").all()
    ]
    assert widths == sorted(widths, reverse=True)
    # The legend is above the chart, where it is seen with it.
    legend = page.locator("#pipeline-legend").bounding_box()
    assert legend["y"] < page.locator("#pipeline-chart").bounding_box()["y"]
    assert "total load" in page.locator("#pipeline-penalty-help").text_content()
    scores = page.locator("#pipeline-scores tbody tr")
    assert scores.count() == len(NODES)
    assert page.locator("#pipeline-placements tbody tr").count() == 22


def test_pipeline_page_hero_shows_the_default_strategy(
    page, live_server, superuser, cluster_history
):
    """README's picture of the pipeline page: what a new install shows, the strategy
    a pod runs with when KSSCHED_SCORING is not set."""
    default = default_scoring()
    process_memory().clear()
    database_pool.clear()
    with override_settings(KSSCHED_SCORING=default):
        login(page, live_server, "admin", "/admin/pipeline/?q=jenkins-java-maven")
        assert page.locator("#pipeline-strategy").inner_text() == default
        bars = page.locator("#pipeline-chart g.bar")
        assert bars.count() >= 3
        assert page.locator("#pipeline-placements tbody tr").count() == 22
        screenshot(page, "pipeline.png")
    process_memory().clear()
    database_pool.clear()


def test_placement_ledger(page, live_server, superuser, cluster_history):
    login(page, live_server, "admin", "/admin/history/keynode/?key=gradle")
    row = page.locator("#result_list tbody tr", has_text="worker-b2")
    row.get_by_role("link", name="placements").click()
    page.wait_for_url("**/admin/history/placement/?**")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 3
    for text in rows.all_inner_texts():
        assert "jenkins-java-gradle" in text and "worker-b2" in text
    assert page.locator(".object-tools a.addlink").count() == 0
    page.goto(f"{live_server.url}/admin/history/placement/?active=yes")
    screenshot(page, "placement-list.png")


def test_viewer_sees_no_edit_controls(page, live_server, viewer, cluster_history):
    login(page, live_server, "viewer", "/admin/history/keynode/")
    assert page.locator("#result_list tbody tr").count() > 0
    assert page.locator("#result_list input[name$='-count']").count() == 0
    assert page.locator("input[name=_save]").count() == 0
    assert page.locator(".object-tools a.addlink").count() == 0
    options = page.locator("select[name=action] option").evaluate_all(
        "options => options.map(o => o.value)"
    )
    assert options == ["", "export_csv"]
    page.locator("#result_list tbody tr th.field-key a").first.click()
    assert page.locator("input[type=submit]").count() == 0
    assert page.locator("input[name=count]").count() == 0
    assert page.locator("a.deletelink").count() == 0
    page.goto(f"{live_server.url}/admin/pipeline/?q=maven")
    assert page.locator("#pipeline-chart g.bar").count() == 3


# label: warmth: [(startup s, run s, outcome), ...] -- shaped like a Maven build farm
OUTCOMES = {
    "exact": [(14, 402), (18, 431), (21, 455), (16, 418), (25, 470), (19, 440)]
    + [(22, 461), (17, 425), (30, 512), (20, 447), (12, 0, "Failed")],
    "partial": [(64, 468), (88, 495), (71, 480), (120, 560), (95, 505)],
    "cold": [(212, 540), (248, 575), (190, 522), (305, 640), (231, 560), (268, 601)]
    + [(40, 0, "Failed")],
}


def test_pipeline_page_outcomes_chart(page, live_server, superuser):
    from history.ledger import record_outcome
    from history.outcomes import outcome_report

    label = "jenkins-java-maven"
    now = timezone.now()
    number = 0
    for warmth, runs in OUTCOMES.items():
        for startup, run, *failed in runs:
            number += 1
            uid = f"uid-{number:04d}"
            record_placement(
                pod_uid=uid,
                namespace="ci",
                name=f"{label}-{number}",
                label=label,
                node=f"worker-{warmth}-{number % 3}",
                bound_at=now - timedelta(hours=number),
                warmth=warmth,
            )
            outcome = failed[0] if failed else "Succeeded"
            record_outcome(pod_uid=uid, startup=startup, run=run, outcome=outcome)
    expected = outcome_report(label=label)
    page.set_viewport_size({"width": 1280, "height": 900})
    login(page, live_server, "admin", f"/admin/pipeline/?q={label}")
    module = page.locator("#pipeline-outcomes")
    for warmth, figures in expected["overall"].items():
        for measure in ("startup", "run"):
            bar = page.locator(
                f'#outcomes-chart g[data-warmth="{warmth}"][data-measure="{measure}"]'
            )
            assert float(bar.get_attribute("data-p50")) == figures[f"{measure}_p50"]
            assert float(bar.get_attribute("data-p90")) == figures[f"{measure}_p90"]
            assert float(bar.locator("rect").get_attribute("width")) > 0
    [pipeline] = expected["pipelines"]
    assert pipeline["saved_seconds"] is not None
    headline = page.locator("#outcomes-saved").text_content()
    assert "Warm placement saved" in headline
    assert f"({pipeline['saved_seconds']:.0f} s)" in headline
    box = module.bounding_box()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    picture = page.screenshot(
        full_page=True,
        clip={"x": 0, "y": box["y"] - 12, "width": 1280, "height": box["height"] + 24},
    )
    save_if_changed(SCREENSHOTS / "pipeline-outcomes.png", picture)
    check_shown(
        SCREENSHOTS, "pipeline-outcomes.png", page.evaluate(SHOWN, "#pipeline-outcomes")
    )
    page.goto(f"{live_server.url}/admin/")
    assert "over 1 pipeline" in page.locator("#ks-time-saved").text_content()


# Every page of ks-scheduler's admin a platform engineer opens; {keynode} and
# {placement} are filled with a row's id.
ADMIN_PAGES = [
    "/admin/",
    "/admin/history/",
    "/admin/history/keynode/",
    "/admin/history/keynode/?o=-3",
    "/admin/history/keynode/?kind=prefix",
    "/admin/history/keynode/{keynode}/change/",
    "/admin/history/placement/",
    "/admin/history/placement/{placement}/change/",
    "/admin/history/countadjustment/",
    "/admin/history/keypolicy/",
    "/admin/history/keypolicy/add/",
    "/admin/history/nodepolicy/",
    "/admin/history/nodepolicy/add/",
    "/admin/pipeline/",
    "/admin/pipeline/?q=jenkins-java-maven",
    f"/admin/pipeline/?q={LONG_LABEL}",
    "/admin/auth/user/",
    "/admin/auth/group/",
]
SIDEWAYS = """() => {
    const width = document.documentElement.clientWidth;
    const name = el => el.tagName.toLowerCase() + (el.id ? '#' + el.id : '')
        + (el.className && typeof el.className === 'string'
           ? '.' + el.className.trim().split(/\\s+/).join('.') : '');
    const found = [];
    if (document.documentElement.scrollWidth > width) {
        found.push(`the page is ${document.documentElement.scrollWidth} px wide`);
    }
    for (const el of document.querySelectorAll('#container *')) {
        const box = el.getBoundingClientRect();
        if (box.width === 0 || getComputedStyle(el).visibility === 'hidden') continue;
        const scrolls = ['auto', 'scroll'].includes(getComputedStyle(el).overflowX);
        if (scrolls && el.scrollWidth > el.clientWidth + 1) {
            found.push(`${name(el)} scrolls: ${el.scrollWidth} in ${el.clientWidth}`);
        }
        if (box.right > width + 1) {
            found.push(`${name(el)} ends at ${Math.round(box.right)} px`);
        }
        if (['table', 'svg'].includes(el.tagName.toLowerCase())) {
            const room = el.parentElement.clientWidth;
            if (box.width > room + 1) {
                found.push(`${name(el)} is ${Math.round(box.width)} px in ${room}`);
            }
        }
    }
    return found.slice(0, 10);
}"""


# Boxes that must not cover each other, and the words that must not break inside: a
# "word" is a run of letters and digits, so a label may wrap at its hyphens.
OVERLAPS = """() => {
    const name = el => el.tagName.toLowerCase() + (el.id ? '#' + el.id : '')
        + (el.className && typeof el.className === 'string'
           ? '.' + el.className.trim().split(/\\s+/).join('.') : '');
    const visible = el => {
        const box = el.getBoundingClientRect();
        return box.width > 0 && box.height > 0
            && getComputedStyle(el).visibility !== 'hidden';
    };
    const boxes = [...document.querySelectorAll(
        '#content h1, #content h2, #content p, #content form, #content table, '
        + '#content svg, #content .object-tools li, #content .paginator, '
        + '#content #toolbar, #content .actions, #content .errornote')]
        .filter(visible);
    // A heading or paragraph covers its text, not the whole width of its block.
    const extent = el => {
        if (!['h1', 'h2', 'p'].includes(el.tagName.toLowerCase())) {
            return el.getBoundingClientRect();
        }
        const text = document.createRange();
        text.selectNodeContents(el);
        return text.getBoundingClientRect();
    };
    const found = [];
    for (let i = 0; i < boxes.length; i++) {
        for (let j = i + 1; j < boxes.length; j++) {
            const a = boxes[i], b = boxes[j];
            if (a.contains(b) || b.contains(a)) continue;
            const p = extent(a), q = extent(b);
            const x = Math.min(p.right, q.right) - Math.max(p.left, q.left);
            const y = Math.min(p.bottom, q.bottom) - Math.max(p.top, q.top);
            if (x > 1 && y > 1) {
                const size = `${Math.round(x)}x${Math.round(y)} px`;
                found.push(`${name(a)} and ${name(b)} overlap by ${size}`);
            }
        }
    }
    const walker = document.createTreeWalker(
        document.querySelector('#content') || document.body, NodeFilter.SHOW_TEXT);
    const range = document.createRange();
    while (walker.nextNode()) {
        const node = walker.currentNode;
        if (!node.parentElement || !visible(node.parentElement)) continue;
        if (node.parentElement.closest('svg, script, style, option')) continue;
        for (const match of node.data.matchAll(/[\\p{L}\\p{N}]{2,}/gu)) {
            range.setStart(node, match.index);
            range.setEnd(node, match.index + match[0].length);
            const lines = new Set([...range.getClientRects()]
                .filter(r => r.width > 0).map(r => Math.round(r.top)));
            if (lines.size > 1) {
                const where = name(node.parentElement);
                found.push(`"${match[0]}" breaks inside, in ${where}`);
            }
        }
    }
    return found.slice(0, 10);
}"""


@pytest.mark.parametrize("size", [(1280, 800), (1024, 768)], ids=["1280", "1024"])
def test_no_admin_page_scrolls_sideways(
    browser, live_server, superuser, cluster_history, long_names, size
):
    width, height = size
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    try:
        login(page, live_server, "admin")
        ids = {
            "keynode": KeyNode.objects.order_by("-count").first().pk,
            "placement": Placement.objects.get(pod_uid="uid-long").pk,
        }
        problems = {}
        for path in ADMIN_PAGES:
            page.goto(f"{live_server.url}{path.format(**ids)}")
            assert page.locator("#container").count() == 1, path
            found = page.evaluate(SIDEWAYS) + page.evaluate(OVERLAPS)
            if found:
                problems[path] = found
        assert problems == {}, "\n".join(f"{k}: {v}" for k, v in problems.items())
    finally:
        context.close()


# A segment as long as a label value allows, with no hyphen to wrap at.
LONG_SEGMENT = "com.example.payments.gateway.integrationtests.nightly.eu1"


def test_index_fits_1280_and_names_what_the_node_totals_are(
    page, live_server, superuser, cluster_history, long_names
):
    record_placement(
        pod_uid="uid-segment",
        namespace="ci",
        name="nightly-1",
        label=f"jenkins-{LONG_SEGMENT}",
        node=f"{LONG_SEGMENT}.node",
    )
    KeyNode.objects.filter(key=LONG_SEGMENT).update(count=500)
    login(page, live_server, "admin")
    assert page.locator("#ks-busiest-keys", has_text=LONG_SEGMENT).count() == 1
    width = page.evaluate(
        "() => [document.documentElement.scrollWidth, "
        "document.documentElement.clientWidth]"
    )
    assert width[0] <= width[1], width
    headers = page.locator("#ks-busiest-nodes thead th").all_text_contents()
    assert headers[1] == "Key counts (all keys)"
    note = page.locator("#ks-busiest-nodes .ks-note").inner_text()
    assert "Each placement counts once under every key of its label" in note


def test_placement_list_keeps_a_long_pod_name_on_one_line(
    page, live_server, superuser, cluster_history, long_names
):
    login(page, live_server, "admin", "/admin/history/placement/")
    name = f"{LONG_LABEL}-build-4711-x7k2p"
    cell = page.locator("#result_list tbody tr", has_text="x7k2p").locator(
        ".field-pod_name"
    )
    # One line: the name's box is one line high, and the whole name is its title.
    height, line = cell.evaluate(
        "el => { const range = document.createRange(); range.selectNodeContents(el);"
        " const lines = new Set([...range.getClientRects()].filter(r => r.width > 0)"
        ".map(r => Math.round(r.top)));"
        " return [lines.size, parseFloat(getComputedStyle(el).lineHeight)]; }"
    )
    assert height == 1 and line > 0
    assert cell.locator(".ks-pod-name").get_attribute("title") == name
    width = page.evaluate(
        "() => [document.documentElement.scrollWidth, "
        "document.documentElement.clientWidth]"
    )
    assert width[0] <= width[1], width
