"""A kubeconfig that points the unmodified kubernetes client at the fake API server."""

from __future__ import annotations

from pathlib import Path


def write_kubeconfig(directory: Path, url: str) -> Path:
    """A kubeconfig whose only context points at `url` (the fake API server)."""
    path = Path(directory) / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f'clusters: [{{name: fake, cluster: {{server: "{url}"}}}}]\n'
        "users: [{name: watcher, user: {token: not-a-secret}}]\n"
        "contexts: [{name: fake, context: {cluster: fake, user: watcher}}]\n"
        "current-context: fake\n"
    )
    return path
