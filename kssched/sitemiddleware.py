"""Django's site middleware, skipped on the machines' routes: kube-scheduler's
(`/scheduler/...`) and the API server's (`/webhook/...`).

Sessions, users and messages serve the admin and the browsable API. kube-scheduler's
calls and admission reviews need none of them (those views carry no
authentication), and running them cost about a sixth of the fixed time of an
extender request. Each class is Django's own and behaves exactly like it on every
other path; the admin's system checks still find them (they are subclasses).
"""

from django.contrib.auth import middleware as auth
from django.contrib.messages import middleware as messages
from django.contrib.sessions import middleware as sessions
from django.http import HttpRequest, HttpResponseBase
from django.utils.deprecation import MiddlewareMixin

from kssched.config import EXTENDER_PREFIX, WEBHOOK_PREFIX

MACHINE_PREFIXES = (EXTENDER_PREFIX, WEBHOOK_PREFIX)


def _skip_on_machine_routes(
    middleware_class: type[MiddlewareMixin],
) -> type[MiddlewareMixin]:
    # mypy cannot use a parameter as a base class: Skipping's base is Any to it, so
    # its inherited get_response and __call__ return Any.
    class Skipping(middleware_class):  # type: ignore[misc,valid-type]
        def __call__(self, request: HttpRequest) -> HttpResponseBase:
            if request.path_info.startswith(MACHINE_PREFIXES):
                return self.get_response(request)  # type: ignore[no-any-return]
            return super().__call__(request)  # type: ignore[no-any-return]

    Skipping.__name__ = Skipping.__qualname__ = middleware_class.__name__
    Skipping.__doc__ = f"{middleware_class.__name__}, except on {MACHINE_PREFIXES}."
    return Skipping


SessionMiddleware = _skip_on_machine_routes(sessions.SessionMiddleware)
AuthenticationMiddleware = _skip_on_machine_routes(auth.AuthenticationMiddleware)
MessageMiddleware = _skip_on_machine_routes(messages.MessageMiddleware)
