"""Exceptions that callers outside the raising module catch."""


class KubeConfigError(Exception):
    """No usable cluster configuration (not in a cluster, no kubeconfig)."""


class WatcherFatalError(Exception):
    """A fault the watcher cannot recover from by retrying (missing schema...)."""
