"""Issue 30's limits on the serving code: the worker of both listeners stays small
and leaves gunicorn as it is (its imports are checked by the import-layer contract
in pyproject.toml: no socket, select, mmap or struct code)."""

import ast
from pathlib import Path

WORKER = Path(__file__).resolve().parent.parent / "kssched" / "workers.py"
LIMIT = 150  # lines, docstrings and comments included


def test_the_serving_worker_is_at_most_150_lines() -> None:
    lines = WORKER.read_text().splitlines()
    assert len(lines) <= LIMIT, f"kssched/workers.py is {len(lines)} lines"


def test_the_serving_worker_patches_nothing_of_gunicorn() -> None:
    tree = ast.parse(WORKER.read_text())
    imported = {
        alias.asname or alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        and (getattr(node, "module", None) or node.names[0].name).startswith(
            ("gunicorn", "gevent")
        )
        for alias in node.names
    }
    patched = [
        ast.unparse(target)
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Attribute)
        and isinstance(root := _root(target), ast.Name)
        and root.id in imported
    ]
    assert not patched, f"assigned to a library's attribute: {patched}"


def _root(node: ast.expr) -> ast.expr:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node
