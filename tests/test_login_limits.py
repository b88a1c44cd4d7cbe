"""Login attempts django-axes records: bounded in size and in number."""

from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.utils import timezone

pytestmark = pytest.mark.django_db


def log_in(client, username, password="wrong-password"):
    return client.post(
        "/admin/login/?next=/admin/",
        {"username": username, "password": password, "next": "/admin/"},
    )


@pytest.mark.parametrize("length", [151, 255, 256, 10_000])
def test_a_username_no_account_can_have_is_a_form_error_and_no_attempt_row(
    client, length
):
    response = log_in(client, "u" * length)
    assert response.status_code == 200
    assert "No account has a username longer than 150 characters." in (
        response.content.decode()
    )
    assert not AccessAttempt.objects.exists()


def test_failed_attempts_are_deleted_once_older_than_the_cool_off(client, settings):
    for number in range(3):
        log_in(client, f"nobody-{number}")
    assert AccessAttempt.objects.count() == 3
    AccessAttempt.objects.update(
        attempt_time=timezone.now() - settings.AXES_COOLOFF_TIME - timedelta(seconds=1)
    )
    log_in(client, "nobody-new")
    assert list(AccessAttempt.objects.values_list("username", flat=True)) == [
        "nobody-new"
    ]
