"""System checks on stored history (run by `migrate` and `check --database default`).

Node names are checked where they enter (`history.nodenames`), but rows written
before that rule may hold names the API server would reject. The webhook leaves
them out of its patches; this check lists them so they can be corrected.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core import checks
from django.db import connections

from history.nodenames import is_valid_node_name

# Names shown per model; the rest are counted.
SHOWN_NAMES = 20


@checks.register(checks.Tags.database)
def check_node_names(
    databases: Sequence[str] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """A warning per model (KeyNode, NodePolicy) holding invalid node names."""
    from history.models import KeyNode, NodePolicy

    found: list[checks.CheckMessage] = []
    for alias in databases or ():
        # Before the first `migrate` there are no tables, and nothing stored.
        tables = set(connections[alias].introspection.table_names())
        for model, where in ((KeyNode, "keys on nodes"), (NodePolicy, "node policies")):
            if model._meta.db_table not in tables:
                continue
            names = (
                model.objects.using(alias)
                .order_by()
                .values_list("node", flat=True)
                .distinct()
            )
            bad = sorted(name for name in names if not is_valid_node_name(name))
            if not bad:
                continue
            shown = ", ".join(repr(name) for name in bad[:SHOWN_NAMES])
            more = (
                f" and {len(bad) - SHOWN_NAMES} more" if len(bad) > SHOWN_NAMES else ""
            )
            found.append(
                checks.Warning(
                    f"{len(bad)} node name(s) in {where} are not Kubernetes node "
                    f"names: {shown}{more}.",
                    hint=(
                        "The webhook leaves them out of its patches and no pod can "
                        "run on such a node. Delete these rows in the admin (or "
                        "add them again under the node's real name)."
                    ),
                    obj=model._meta.label,
                    id="history.W001" if model is KeyNode else "history.W002",
                )
            )
    return found
