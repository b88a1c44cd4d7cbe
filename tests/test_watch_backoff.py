"""history.watcher.options.Backoff: the delay between retries."""

import pytest

from history.watcher.options import Backoff


def test_backoff_grows_is_capped_and_resets():
    now = [0.0]
    backoff = Backoff(
        base=0.8, cap=30, reset=120, rng=lambda: 0.5, clock=lambda: now[0]
    )
    delays = [backoff.next_delay() for _ in range(8)]
    assert delays[:3] == pytest.approx([1.2, 2.4, 4.8])
    assert max(delays) == 30 and min(delays) >= 0.8
    now[0] = 500.0
    assert backoff.next_delay() == pytest.approx(1.2)
