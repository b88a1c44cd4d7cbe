"""Guard and measure the extender routes (`/scheduler/...`).

The extender routes carry no authentication: kube-scheduler calls them from the
same pod over loopback. So a caller from any other address is refused with 403,
unless gunicorn serves TLS and verifies client certificates (KSSCHED_TLS_CERT_FILE
and KSSCHED_TLS_CA_FILE): then every connection that reached Django presented a
certificate signed by that CA. `/healthz`, `/readyz`, `/metrics` and `/admin/`
are not affected.

On the extender listener (KSSCHED_LISTENER=extender, see kssched.serve), every route
but `/scheduler/...`, `/healthz` and `/version` is a 404: the admin, the API and the
metrics are served by the web listener's workers only.
"""

import ipaddress
import logging
import time
from collections.abc import Callable

import orjson
from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseBase

from kssched.config import EXTENDER_PREFIX
from kssched.metrics import (
    extender_verb,
    observe_extender_request,
    record_after_response,
)

logger = logging.getLogger(__name__)

_LOOPBACK = frozenset({"127.0.0.1", "::1"})
# What the extender listener serves besides /scheduler/: the admin, the API and
# /metrics stay on the web listener.
_ALSO_ON_EXTENDER = frozenset({"/healthz", "/version"})


def _not_on_this_listener(request: HttpRequest) -> HttpResponse:
    return HttpResponse(
        orjson.dumps(
            {
                "Error": f"{request.path_info} is not served on the extender "
                "listener, which answers /scheduler/ only: use the web listener "
                "(KSSCHED_BIND)"
            }
        ),
        status=404,
        content_type="application/json",
    )


def is_loopback(address: str) -> bool:
    """True for 127.0.0.0/8, ::1 and IPv4-mapped loopback (`::ffff:127.0.0.1`)."""
    if address in _LOOPBACK:
        return True
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or bool(mapped and mapped.is_loopback)


def has_verified_client_certificate(request: HttpRequest) -> bool:
    """True when the request came over gunicorn's TLS with client certificates required.

    gunicorn rejects, during the handshake, every client without a certificate signed
    by KSSCHED_TLS_CA_FILE, so a request on such a connection is from a verified client.
    The WSGI scheme is set by gunicorn from the socket, not from a request header.
    """
    return bool(
        settings.KSSCHED_TLS_CERT_FILE
        and settings.KSSCHED_TLS_CA_FILE
        and request.META.get("wsgi.url_scheme") == "https"
    )


class ExtenderMiddleware:
    """Refuse non-loopback extender callers (without mTLS) and record metrics; on
    the extender listener, refuse the other routes.

    The latency is measured up to the rendered response; the metrics are written
    when the response is closed, after the reply went out. Other paths pass
    straight through after one string comparison.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response
        self.is_extender_listener = settings.KSSCHED_LISTENER == "extender"

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        if not request.path_info.startswith(EXTENDER_PREFIX):
            if self.is_extender_listener and request.path_info not in _ALSO_ON_EXTENDER:
                return _not_on_this_listener(request)
            return self.get_response(request)
        started = time.perf_counter()
        address = request.META.get("REMOTE_ADDR", "")
        if is_loopback(address) or has_verified_client_certificate(request):
            response = self.get_response(request)
        else:
            response = self._refuse(request, address)
        seconds = time.perf_counter() - started
        record_after_response(
            response,
            request.path_info,
            lambda: observe_extender_request(
                extender_verb(request),
                seconds,
                status=response.status_code,
                exception=getattr(request, "kssched_exception", None),
            ),
        )
        return response

    def process_exception(self, request: HttpRequest, exception: Exception) -> None:
        """Remember a view's exception so the error metric can name its kind."""
        # An attribute of this request only (HttpRequest declares no such field).
        request.kssched_exception = exception  # type: ignore[attr-defined]

    @staticmethod
    def _refuse(request: HttpRequest, address: str) -> HttpResponse:
        message = (
            f"the extender answers loopback callers only, not {address or 'unknown'}; "
            "call it from kube-scheduler in the same pod at "
            f"http://{settings.KSSCHED_EXTENDER_BIND}, or "
            "configure TLS with client certificates (KSSCHED_TLS_CERT_FILE, "
            "KSSCHED_TLS_KEY_FILE, KSSCHED_TLS_CA_FILE)"
        )
        logger.warning(
            "Refused %s %s from %s: not loopback and no verified client certificate",
            request.method,
            request.path_info,
            address or "unknown",
        )
        return HttpResponse(
            orjson.dumps({"Error": message}),
            status=403,
            content_type="application/json",
        )
