"""The admin's base: the page that says why a request was refused, and the ModelAdmin
every history admin builds on (outside text checked before any query, every POST in
one bounded write transaction)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from django.conf import settings
from django.contrib import admin
from django.db.models import Model
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from history.exceptions import WriteLockTimeoutError
from history.validation import (
    RANGE_TEXT,
    nul_message,
    nul_parameter,
    out_of_range_parameter,
)
from history.writelock import run_write

logger = logging.getLogger(__name__)


def refusal_page(
    request: HttpRequest,
    *,
    title: str,
    message: str,
    status: int,
    back_url: str,
    back_text: str,
) -> TemplateResponse:
    """An admin page that says why a request was refused, with a link back."""
    context = {
        **admin.site.each_context(request),
        "title": title,
        "message": message,
        "back_url": back_url,
        "back_text": back_text,
    }
    return TemplateResponse(
        request, "admin/request_refused.html", context, status=status
    )


def refuse_nul_parameters(request: HttpRequest) -> TemplateResponse | None:
    """A 400 page when a filter or search value holds a NUL character, or names a
    date the database query could not be built for, else None."""
    name = nul_parameter(request.GET)
    if name is not None:
        message = nul_message(f"The filter or search parameter {name!r}")
    else:
        name = out_of_range_parameter(request.GET)
        if name is None:
            return None
        message = (
            f"The filter parameter {name!r} names a date outside the range "
            f"ks-scheduler can look up ({RANGE_TEXT}); nothing was looked up"
        )
    return refusal_page(
        request,
        title="Filter refused",
        message=message,
        status=400,
        back_url=request.path,
        back_text="Show the page without filters",
    )


def write_lock_page(
    request: HttpRequest, exc: WriteLockTimeoutError
) -> TemplateResponse:
    """503: the edit did not get the database's write lock in time; nothing changed."""
    response = refusal_page(
        request,
        title="Database busy",
        message=(
            f"Nothing was changed: another process held the database's write lock "
            f"for {exc.waited:.0f} s (usually the watcher recording a burst of "
            f"pods, or a shell with a write transaction open), so this edit was "
            f"not saved. Your browser's Back button returns to the form with what "
            f"you entered; submit it again."
        ),
        status=503,
        back_url=request.get_full_path(),
        back_text="Open the page again",
    )
    response["Retry-After"] = "5"
    return response


_M = TypeVar("_M", bound=Model)


class HistoryModelAdmin(admin.ModelAdmin[_M]):
    """Base of the history admins.

    Outside text is checked before any query. Every POST (form saves, list edits,
    bulk actions, deletions) runs in one transaction that waits a bounded time for
    SQLite's write lock (KSSCHED_ADMIN_WRITE_WAIT) and is tried again while the
    watcher holds it; if that is not enough, the user gets a page that says nothing
    was changed instead of a 500.
    """

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        refused = refuse_nul_parameters(request)
        if refused is not None:
            return refused
        parent = super().changelist_view
        return self._write(request, lambda: parent(request, extra_context))

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        parent = super().changeform_view
        return self._write(
            request, lambda: parent(request, object_id, form_url, extra_context)
        )

    def delete_view(
        self,
        request: HttpRequest,
        object_id: str,
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        parent = super().delete_view
        return self._write(request, lambda: parent(request, object_id, extra_context))

    def _write(
        self, request: HttpRequest, view: Callable[[], HttpResponse]
    ) -> HttpResponse:
        if request.method != "POST":
            return view()
        try:
            return run_write(view, wait=settings.KSSCHED_ADMIN_WRITE_WAIT)
        except WriteLockTimeoutError as exc:
            logger.warning(
                "Refused admin %s %s by %s: %s; nothing was changed",
                request.method,
                request.path,
                request.user.get_username(),
                exc,
            )
            return write_lock_page(request, exc)
