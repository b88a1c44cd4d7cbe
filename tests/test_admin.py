"""Admin: login required, counts editable and recorded."""

import pytest
from django.contrib.auth.models import Group, User

from history.models import CountAdjustment, KeyNode

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client):
    User.objects.create_superuser("admin", "admin@example.com", "s3cret-pass")
    client.login(username="admin", password="s3cret-pass")
    return client


def test_admin_requires_login(client):
    response = client.get("/admin/history/keynode/")
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


def test_admin_login_with_the_form(client):
    User.objects.create_superuser("admin", "admin@example.com", "s3cret-pass")
    response = client.post(
        "/admin/login/?next=/admin/",
        {"username": "admin", "password": "s3cret-pass", "next": "/admin/"},
    )
    assert response.status_code == 302
    assert response["Location"] == "/admin/"
    assert client.get("/admin/").status_code == 200


def test_keynode_list_and_search(admin_client):
    KeyNode.objects.create(key="jenkins", node="worker-1", count=3)
    KeyNode.objects.create(key="gitlab", node="worker-2", count=4)
    response = admin_client.get("/admin/history/keynode/", {"q": "jenkins"})
    assert response.status_code == 200
    assert b"worker-1" in response.content
    assert b"worker-2" not in response.content


def test_admin_count_edit_is_saved_and_recorded(admin_client):
    row = KeyNode.objects.create(key="jenkins", node="worker-1", count=3)
    response = admin_client.post(
        f"/admin/history/keynode/{row.pk}/change/", {"count": "12"}
    )
    assert response.status_code == 302
    row.refresh_from_db()
    assert row.count == 12
    adjustment = CountAdjustment.objects.get()
    assert (adjustment.delta, adjustment.actor) == (9, "admin")


def test_admin_rejects_negative_count(admin_client):
    row = KeyNode.objects.create(key="jenkins", node="worker-1", count=3)
    response = admin_client.post(
        f"/admin/history/keynode/{row.pk}/change/", {"count": "-1"}
    )
    assert response.status_code == 200
    assert b"greater than or equal to 0" in response.content
    row.refresh_from_db()
    assert row.count == 3


def test_viewer_group_can_browse_but_not_edit(client):
    viewer = User.objects.create_user("viewer", password="s3cret-pass", is_staff=True)
    viewer.groups.add(Group.objects.get(name="ks-scheduler viewers"))
    row = KeyNode.objects.create(key="jenkins", node="worker-1", count=3)
    client.login(username="viewer", password="s3cret-pass")
    assert client.get("/admin/history/keynode/").status_code == 200
    client.post(f"/admin/history/keynode/{row.pk}/change/", {"count": "99"})
    row.refresh_from_db()
    assert row.count == 3
