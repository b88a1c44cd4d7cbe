"""The extender answers loopback callers only, unless gunicorn verifies client
certificates; probes, metrics and the admin stay reachable from the network."""

import http.client
import ipaddress
import logging
import shutil
import socket
import ssl
import subprocess

import orjson
import pytest
from django.test import Client

from kssched.middleware import is_loopback
from tests.helpers import load_fixture, run_gunicorn
from tests.test_settings import run_manage

PRIORITIZE = "/scheduler/priorities/pipeline"
FILTER = "/scheduler/predicates/alwaystrue"
OUTSIDE = "192.0.2.10"


def post_prioritize(client, **extra):
    return client.post(
        PRIORITIZE,
        load_fixture("prioritize-nodenames.json"),
        content_type="application/json",
        **extra,
    )


# --- The rule, through Django -------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("address", ["127.0.0.1", "::1", "127.0.0.2"])
def test_extender_answers_loopback_callers(address):
    response = post_prioritize(Client(REMOTE_ADDR=address))
    assert response.status_code == 200, response.content
    assert [entry["Host"] for entry in response.json()] == ["worker-2", "worker-1"]


@pytest.mark.django_db
@pytest.mark.parametrize("path", [PRIORITIZE, FILTER])
def test_extender_refuses_callers_outside_the_pod(path, caplog):
    client = Client(REMOTE_ADDR=OUTSIDE)
    with caplog.at_level(logging.WARNING, logger="kssched.middleware"):
        response = client.post(
            path,
            load_fixture("prioritize-nodenames.json"),
            content_type="application/json",
        )
    assert response.status_code == 403
    assert response["Content-Type"] == "application/json"
    error = response.json()["Error"]
    assert "loopback callers only" in error
    assert OUTSIDE in error
    assert "KSSCHED_TLS_CA_FILE" in error
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert OUTSIDE in caplog.records[0].getMessage()


@pytest.mark.django_db
def test_probes_metrics_and_admin_stay_reachable_from_the_network():
    client = Client(REMOTE_ADDR=OUTSIDE)
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 200
    assert client.get("/metrics").status_code == 200
    admin = client.get("/admin/")
    assert admin.status_code == 302
    assert admin["Location"].startswith("/admin/login/")


@pytest.mark.django_db
def test_verified_client_certificate_lets_outside_callers_in(settings):
    settings.KSSCHED_TLS_CERT_FILE = "/tls/tls.crt"
    settings.KSSCHED_TLS_CA_FILE = "/tls/ca.crt"
    client = Client(REMOTE_ADDR=OUTSIDE)
    # gunicorn marks connections it terminated TLS on with the https scheme.
    assert post_prioritize(client, secure=True).status_code == 200
    # Plain HTTP on the same server is still refused.
    assert post_prioritize(client).status_code == 403


@pytest.mark.django_db
def test_tls_without_client_verification_keeps_the_loopback_rule(settings):
    settings.KSSCHED_TLS_CERT_FILE = "/tls/tls.crt"
    settings.KSSCHED_TLS_CA_FILE = ""
    response = post_prioritize(Client(REMOTE_ADDR=OUTSIDE), secure=True)
    assert response.status_code == 403


@pytest.mark.django_db
def test_forwarded_proto_header_does_not_count_as_client_tls(settings):
    settings.KSSCHED_TLS_CERT_FILE = "/tls/tls.crt"
    settings.KSSCHED_TLS_CA_FILE = "/tls/ca.crt"
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    client = Client(REMOTE_ADDR=OUTSIDE)
    response = post_prioritize(client, HTTP_X_FORWARDED_PROTO="https")
    assert response.status_code == 403


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1", True),
        ("127.10.0.1", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("192.0.2.10", False),
        ("::ffff:192.0.2.10", False),
        ("fd00::2", False),
        ("", False),
        ("not-an-address", False),
    ],
)
def test_is_loopback(address, expected):
    assert is_loopback(address) is expected


def test_check_deploy_is_clean_with_tls_json_logs_and_metrics_token(tmp_path):
    env = {
        "SECRET_KEY": "k" * 20 + "-production-like-secret-value-9f8e7d6c5b4a",
        "DATA_PATH": str(tmp_path / "db.sqlite3"),
        "KSSCHED_HTTPS": "1",
        "KSSCHED_LOG_FORMAT": "json",
        "KSSCHED_METRICS_TOKEN": "scrape-token",
        "KSSCHED_TLS_CERT_FILE": "/tls/tls.crt",
        "KSSCHED_TLS_KEY_FILE": "/tls/tls.key",
        "KSSCHED_TLS_CA_FILE": "/tls/ca.crt",
    }
    result = run_manage(["check", "--deploy", "--fail-level", "WARNING"], env)
    assert result.returncode == 0, result.stdout + result.stderr


# --- Against the real gunicorn ------------------------------------------------------


def outside_address_or_none() -> str | None:
    """An IPv4 address of this machine other than loopback, if it has one."""
    candidates = []
    try:
        result = subprocess.run(
            ["hostname", "-I"], capture_output=True, text=True, timeout=5
        )
        candidates = result.stdout.split()
    except OSError:
        pass
    try:
        candidates.append(socket.gethostbyname(socket.gethostname()))
    except OSError:
        pass
    for candidate in candidates:
        ip = ipaddress.ip_address(candidate)
        if ip.version == 4 and not ip.is_loopback and not ip.is_link_local:
            return candidate
    return None


def outside_address() -> str:
    """An IPv4 address of this machine other than loopback, or skip."""
    address = outside_address_or_none()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    return address


def call(host, port, method, path, body=None, context=None):
    if context is None:
        conn = http.client.HTTPConnection(host, port, timeout=10)
    else:
        conn = http.client.HTTPSConnection(host, port, timeout=10, context=context)
    headers = {"Host": "localhost", "Content-Type": "application/json"}
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


@pytest.mark.django_db(transaction=True)
def test_gunicorn_on_loopback_answers_the_extender():
    body = load_fixture("prioritize-nodenames.json")
    with run_gunicorn(workers=1) as (url, _process):
        status, answer = call("127.0.0.1", port_of(url), "POST", PRIORITIZE, body)
    assert status == 200, answer
    assert len(orjson.loads(answer)) == 2


@pytest.mark.django_db(transaction=True)
def test_gunicorn_refuses_the_extender_to_outside_callers():
    address = outside_address()
    body = load_fixture("prioritize-nodenames.json")
    with run_gunicorn(workers=1, host="0.0.0.0") as (url, _process):
        port = port_of(url)
        status, answer = call(address, port, "POST", PRIORITIZE, body)
        assert status == 403, answer
        assert address in orjson.loads(answer)["Error"]
        assert call(address, port, "GET", "/healthz") == (200, b"ok")
        assert call(address, port, "GET", "/readyz")[0] == 200
        assert call(address, port, "GET", "/metrics")[0] == 200
        # The same server still answers kube-scheduler in the pod.
        assert call("127.0.0.1", port, "POST", PRIORITIZE, body)[0] == 200


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_certificate(directory, name, *, issuer, extensions):
    """An EC key and a certificate for `name` signed by `issuer` (a CA name)."""
    ext = directory / f"{name}.ext"
    ext.write_text("\n".join(extensions) + "\n")
    openssl(
        "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
        "-subj", f"/CN={name}",
        cwd=directory,
    )  # fmt: skip
    openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{issuer}.crt",
        "-CAkey", f"{issuer}.key", "-set_serial", "0x1a2b", "-days", "1",
        "-out", f"{name}.crt", "-extfile", ext.name,
        cwd=directory,
    )  # fmt: skip


def make_ca(directory, name):
    openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "1",
        "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=directory,
    )  # fmt: skip


@pytest.fixture
def pki(tmp_path):
    """A throwaway CA with a server and a client certificate, and a rogue CA."""
    if not shutil.which("openssl"):
        pytest.skip("the openssl command is not installed")
    address = outside_address_or_none()
    make_ca(tmp_path, "ca")
    make_ca(tmp_path, "rogue-ca")
    make_certificate(
        tmp_path,
        "server",
        issuer="ca",
        extensions=[
            "subjectAltName=DNS:localhost,IP:127.0.0.1"
            + (f",IP:{address}" if address else ""),
            "extendedKeyUsage=serverAuth",
        ],
    )
    for name, issuer in (("client", "ca"), ("rogue-client", "rogue-ca")):
        make_certificate(
            tmp_path, name, issuer=issuer, extensions=["extendedKeyUsage=clientAuth"]
        )
    return tmp_path, address


def client_context(directory, certificate=None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(directory / "ca.crt"))
    if certificate:
        context.load_cert_chain(
            str(directory / f"{certificate}.crt"), str(directory / f"{certificate}.key")
        )
    return context


def tls_env(directory, *, with_ca: bool) -> dict[str, str]:
    env = {
        "KSSCHED_TLS_CERT_FILE": str(directory / "server.crt"),
        "KSSCHED_TLS_KEY_FILE": str(directory / "server.key"),
    }
    if with_ca:
        env["KSSCHED_TLS_CA_FILE"] = str(directory / "ca.crt")
    return env


@pytest.mark.django_db(transaction=True)
def test_gunicorn_with_client_certificates_serves_verified_callers_anywhere(pki):
    directory, address = pki
    body = load_fixture("prioritize-nodenames.json")
    env = tls_env(directory, with_ca=True)
    with run_gunicorn(env, workers=1, host="0.0.0.0") as (url, _process):
        port = port_of(url)
        verified = client_context(directory, "client")
        # Through another address of this machine too, when it has one.
        for host in filter(None, ("127.0.0.1", address)):
            status, answer = call(host, port, "POST", PRIORITIZE, body, verified)
            assert status == 200, (host, answer)
            assert len(orjson.loads(answer)) == 2
        assert call("127.0.0.1", port, "GET", "/healthz", context=verified) == (
            200,
            b"ok",
        )

        # No certificate, or one from another CA: the handshake fails.
        for certificate in (None, "rogue-client"):
            context = client_context(directory, certificate)
            with pytest.raises((ssl.SSLError, ConnectionError)):
                call("127.0.0.1", port, "POST", PRIORITIZE, body, context)


@pytest.mark.django_db(transaction=True)
def test_gunicorn_with_tls_but_no_client_verification_keeps_the_loopback_rule(pki):
    directory, address = pki
    body = load_fixture("prioritize-nodenames.json")
    env = tls_env(directory, with_ca=False)
    with run_gunicorn(env, workers=1, host="0.0.0.0") as (url, _process):
        port = port_of(url)
        context = client_context(directory)
        assert call("127.0.0.1", port, "POST", PRIORITIZE, body, context)[0] == 200
        if address is None:
            pytest.skip("this machine has no non-loopback IPv4 address")
        status, answer = call(address, port, "POST", PRIORITIZE, body, context)
        assert status == 403, answer


@pytest.mark.django_db(transaction=True)
def test_gunicorn_refuses_a_ca_without_a_server_certificate():
    with pytest.raises(
        RuntimeError, match="is not valid: only with KSSCHED_TLS_CERT_FILE"
    ):
        with run_gunicorn({"KSSCHED_TLS_CA_FILE": "/nonexistent/ca.crt"}, workers=1):
            pass


@pytest.mark.django_db(transaction=True)
def test_admin_over_https_gets_secure_cookies_hsts_and_csrf(pki):
    directory, _address = pki
    env = {**tls_env(directory, with_ca=False), "KSSCHED_HTTPS": "1"}
    with run_gunicorn(env, workers=1) as (url, _process):
        conn = http.client.HTTPSConnection(
            "127.0.0.1", port_of(url), timeout=10, context=client_context(directory)
        )
        try:
            conn.request("GET", "/admin/login/", headers={"Host": "localhost"})
            response = conn.getresponse()
            response.read()
            headers = response.getheaders()
        finally:
            conn.close()
        assert response.status == 200
        hsts = response.getheader("Strict-Transport-Security")
        assert hsts == "max-age=31536000; includeSubDomains"
        cookies = [value for name, value in headers if name.lower() == "set-cookie"]
        csrf = [c for c in cookies if c.startswith("csrftoken=")]
        assert csrf and "Secure" in csrf[0]

        # A login post without the CSRF token is refused.
        status, _ = call(
            "127.0.0.1",
            port_of(url),
            "POST",
            "/admin/login/",
            b"username=a&password=b",
            client_context(directory),
        )
        assert status == 403
