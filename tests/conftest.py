"""Shared test set-up: a real SQLite file (or PostgreSQL via DATABASE_URL), real
subprocesses for gunicorn and the watcher, and the rule that CI never skips the
PostgreSQL or browser tests.
"""

import pytest

from tests.helpers import IS_CI, run_gunicorn

# The fake API server's `server` and `api` fixtures.
pytest_plugins = ["tests.fakeapi.plugin"]

ENFORCED_MARKERS = ("postgres", "browser")


def pytest_collection_modifyitems(config, items):
    """Skip PostgreSQL-only tests on SQLite (CI turns such skips into failures)."""
    from django.conf import settings

    engine = settings.DATABASES["default"]["ENGINE"]
    if "postgresql" in engine:
        return
    skip = pytest.mark.skip(reason="needs PostgreSQL: set DATABASE_URL")
    for item in items:
        if item.get_closest_marker("postgres"):
            item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI=true, a skipped PostgreSQL or browser test is a failure."""
    outcome = yield
    report = outcome.get_result()
    if not IS_CI or not report.skipped:
        return
    marker = next((m for m in ENFORCED_MARKERS if item.get_closest_marker(m)), None)
    if marker:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid}: a '{marker}' test was skipped under CI=true; "
            f"CI must run it ({report.longrepr})"
        )


@pytest.fixture(autouse=True)
def _settings_restored():
    """No settings override outlives its test: one that does changes every test
    after it, wherever they are. (Overrides older than the test stay: the live
    server's ALLOWED_HOSTS lasts the session.)"""
    from django.conf import settings

    before = settings._wrapped
    yield
    if settings._wrapped is not before:
        leaked = {
            name: getattr(settings, name)
            for name in vars(settings._wrapped)
            if name.isupper()
        }
        settings._wrapped = before
        pytest.fail(f"a settings override outlived the test: {leaked}")


@pytest.fixture
def admin_client(client):
    """A client logged in as the superuser `admin` (the login form itself is tested
    in test_admin.py; the rest skip password hashing)."""
    from django.contrib.auth.models import User

    admin = User.objects.create_superuser("admin", "admin@example.com", None)
    client.force_login(admin)
    return client


@pytest.fixture
def warm(settings):
    """The `warm` strategy, an empty webhook steering memory and no cached pipeline
    pool (both live per process).

    Set through pytest-django's `settings`, as a test's own changes are: every
    override then ends in the order it began. A `with override_settings(...)` here
    ended before a test's later `settings.X = ...`, whose end then put this one
    back for the rest of the run (a leaked `warm` failed a browser test far away).
    """
    from extender.scoring.steering import process_memory
    from history.reader.pool import database_pool

    process_memory().clear()
    database_pool.clear()
    settings.KSSCHED_SCORING = "warm"
    yield
    process_memory().clear()
    database_pool.clear()


@pytest.fixture
def gunicorn_server(transactional_db):
    """A real gunicorn serving the test database; yields its base URL."""
    with run_gunicorn() as (url, _process):
        yield url


@pytest.fixture(autouse=True)
def _fresh_content_types():
    """Forget the ContentType ids cached by an earlier test: a transactional test's
    flush (the live-server browser tests) makes the rows again with new ids."""
    from django.contrib.contenttypes.models import ContentType

    ContentType.objects.clear_cache()
    yield


@pytest.fixture(autouse=True)
def _cold_history_cache():
    """Every test starts with a cold process cache of history, as a new worker
    does: the test database's flush between tests writes no ledger row, so a cache
    kept from an earlier test could not know its rows are gone."""
    from history.depth_feed import forget_depth
    from history.reader import forget_caches
    from history.worth_feed import forget_worth

    forget_caches()
    forget_worth()
    forget_depth()
    yield
