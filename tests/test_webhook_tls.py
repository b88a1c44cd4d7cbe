"""Webhook mode end to end: the real gunicorn serves /webhook/mutate over TLS to
callers outside the pod (the API server), and answers a burst well inside the
webhook's timeoutSeconds."""

import base64
import time

import orjson
import pytest

from history.ledger import increment_key_nodes
from tests.helpers import run_gunicorn
from tests.test_security import (  # noqa: F401 - pki is a fixture
    call,
    client_context,
    pki,
    port_of,
    tls_env,
)
from tests.test_webhook import UID, new_pod, review

# The MutatingWebhookConfiguration in deploy/overlays/webhook.
TIMEOUT_SECONDS = 2


@pytest.mark.django_db(transaction=True)
def test_gunicorn_serves_the_webhook_over_tls_to_outside_callers(pki):  # noqa: F811
    directory, address = pki
    for node in ("n1", "n2"):
        for _ in range(4):
            increment_key_nodes(keys=["ci", "java", "app"], node=node)
    body = orjson.dumps(review(new_pod()))
    with run_gunicorn(tls_env(directory, with_ca=False), workers=1, host="0.0.0.0") as (
        url,
        _process,
    ):
        port = port_of(url)
        context = client_context(directory)
        host = address or "127.0.0.1"
        # The readiness probe's first call loads Django in the worker.
        assert call(host, port, "GET", "/readyz", context=context)[0] == 200
        targets = []
        for _ in range(4):
            started = time.perf_counter()
            status, answer = call(host, port, "POST", "/webhook/mutate", body, context)
            assert time.perf_counter() - started < TIMEOUT_SECONDS / 4
            assert status == 200, answer
            response = orjson.loads(answer)["response"]
            assert response["uid"] == UID and response["allowed"] is True
            patch = orjson.loads(base64.b64decode(response["patch"]))
            terms = patch[0]["value"]["nodeAffinity"][
                "preferredDuringSchedulingIgnoredDuringExecution"
            ]
            targets.append(terms[0]["preference"]["matchFields"][0]["values"][0])
        # One worker remembers the whole burst: it alternates between the two nodes.
        assert targets == ["n1", "n2", "n1", "n2"]
        # The extender routes keep their loopback rule on the same listener.
        if address:
            status, _ = call(
                address, port, "POST", "/scheduler/explain", b"{}", context
            )
            assert status == 403
