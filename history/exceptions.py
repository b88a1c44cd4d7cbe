"""Exceptions of the history app that callers outside the raising module catch."""


class WriteLockTimeoutError(Exception):
    """Another connection held SQLite's write lock for longer than the write could
    wait. The write's transaction was rolled back: nothing was changed."""

    def __init__(self, *, attempts: int, waited: float):
        super().__init__(
            f"the database write lock was held elsewhere for {waited:.1f} s "
            f"({attempts} attempt(s))"
        )
        self.attempts = attempts
        self.waited = waited


class KubeConfigError(Exception):
    """No usable cluster configuration (not in a cluster, no kubeconfig)."""


class WatcherFatalError(Exception):
    """A fault the watcher cannot recover from by retrying (missing schema...)."""
