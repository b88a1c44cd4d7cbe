"""Exceptions of the history app that callers catch."""


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
