"""history.watcher.lease: leader election on a Lease of the fake API server."""

from datetime import timedelta

import pytest

from history.watcher.kube import parse_time
from history.watcher.lease import LeaderElector
from tests.fakeapi import (
    conflict,
    make_lease,
)
from tests.watch_streams import (
    NS,
)

pytestmark = pytest.mark.django_db(transaction=True)


def test_lease_acquire_renew_release_and_conflict(api, server):
    first = LeaderElector(api, "lease", NS, "a", duration=2)
    second = LeaderElector(api, "lease", NS, "b", duration=2)
    assert first.try_acquire()
    assert not second.try_acquire()
    assert first.try_acquire()  # renew
    server.inject(conflict("lease"), verb="update", resource="leases")
    assert not first.try_acquire()
    first.release()
    assert second.try_acquire()
    lease = server.get("leases", "lease", NS)
    assert lease["spec"]["holderIdentity"] == "b"
    assert lease["spec"]["leaseTransitions"] == 1


def test_an_expired_lease_is_taken_over(api, server):
    """Held until renewTime + leaseDurationSeconds, taken over after. The elector's
    clock is set from the lease's own renewTime (written to the whole second), so the
    result does not depend on how long the calls take."""
    server.add("leases", make_lease("lease", holder="gone", duration=1))
    renewed = parse_time(server.get("leases", "lease", NS)["spec"]["renewTime"])
    assert renewed is not None
    moment = [renewed + timedelta(seconds=0.5)]
    elector = LeaderElector(api, "lease", NS, "me", duration=2, clock=lambda: moment[0])
    assert not elector.try_acquire()
    moment[0] = renewed + timedelta(seconds=1.2)
    assert elector.try_acquire()
    assert server.get("leases", "lease", NS)["spec"]["holderIdentity"] == "me"
