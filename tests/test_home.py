"""`/`: a small page that says what this port serves and links to it."""

import re

import pytest

pytestmark = pytest.mark.django_db


def test_home_page_links_admin_api_schema_metrics_and_health(
    client, django_assert_num_queries
):
    with django_assert_num_queries(0):
        response = client.get("/")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    links = re.findall(r'href="([^"]+)"', response.content.decode())
    assert links == [
        "/admin/",
        "/admin/pipeline/",
        "/api/",
        "/api/schema/",
        "/metrics",
        "/healthz",
        "/readyz",
        "/version",
    ]
    assert "make docs" in response.content.decode()


@pytest.mark.parametrize(
    ("url", "status"),
    [
        ("/admin/", 302),
        ("/admin/pipeline/", 302),
        ("/api/", 401),
        ("/api/schema/", 401),
        ("/metrics", 200),
        ("/healthz", 200),
        ("/readyz", 200),
        ("/version", 200),
    ],
)
def test_every_link_of_the_home_page_answers(client, url, status):
    assert client.get(url).status_code == status
