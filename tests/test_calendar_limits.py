"""Dates at the ends of the calendar: a 400 that says why, never an OverflowError."""

from datetime import UTC, date, datetime, timedelta, timezone

import pytest
from django.http import QueryDict

from history.validation import is_instant_in_range, out_of_range_parameter

pytestmark = pytest.mark.django_db

FIRST = "0001-01-01T00:00:00%2B00:01"
LAST = "9999-12-31T23:59:59-01:00"


@pytest.mark.parametrize(
    "url",
    [
        f"/api/placements/?since={FIRST}",
        f"/api/placements/?until={LAST}",
        f"/api/outcomes/?since={FIRST}",
        f"/api/outcomes/?since={LAST}",
    ],
)
def test_the_api_answers_400_for_dates_at_the_calendar_limits(admin_client, url):
    response = admin_client.get(url, HTTP_ACCEPT="application/json")
    assert response.status_code == 400, response.content
    assert "0001-01-02 and 9999-12-30" in response.content.decode()


@pytest.mark.parametrize(
    "query",
    [
        f"bound_at__gte={FIRST}",
        f"bound_at__gte={LAST}",
        "bound_at__lt=0001-01-01",
        "bound_at__year=9999&bound_at__month=12&bound_at__day=31",
    ],
)
def test_the_admin_refuses_dates_at_the_calendar_limits(admin_client, query):
    response = admin_client.get(f"/admin/history/placement/?{query}")
    assert response.status_code == 400
    assert "outside the range ks-scheduler can look up" in response.content.decode()


def test_ordinary_dates_are_still_looked_up(admin_client):
    response = admin_client.get("/admin/history/placement/?bound_at__gte=2026-01-05")
    assert response.status_code == 200
    response = admin_client.get("/api/placements/?since=2026-01-05T00:00:00Z")
    assert response.status_code == 200


def test_the_range_rule():
    assert is_instant_in_range(date(1, 1, 2))
    assert not is_instant_in_range(date(1, 1, 1))
    assert not is_instant_in_range(
        datetime(1, 1, 1, 0, 0, tzinfo=timezone(timedelta(minutes=1)))
    )
    assert is_instant_in_range(datetime(9999, 12, 30, tzinfo=UTC))
    assert not is_instant_in_range(datetime(9999, 12, 31, tzinfo=UTC))
    assert out_of_range_parameter(QueryDict("a=1&b__year=9999")) == "b__year"
    assert out_of_range_parameter(QueryDict("a=2026-13-45&q=x")) is None
