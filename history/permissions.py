"""Who may read pipeline history: the history API, the admin's overview and the
pipeline page all ask the same question."""

from __future__ import annotations

from django.contrib.auth.models import AnonymousUser, User

# The view permissions on both history models.
VIEW_HISTORY = ("history.view_keynode", "history.view_placement")


def can_view_history(user: User | AnonymousUser) -> bool:
    """True for an active user holding the view permission on the history models."""
    return user.is_authenticated and user.is_active and user.has_perms(VIEW_HISTORY)
