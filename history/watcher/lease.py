"""Leader election on a coordination.k8s.io/v1 Lease.

Leadership only avoids duplicate work: counting is exact without it (the ledger is
keyed on the pod UID), so a lost race or a late renewal never loses a placement.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from history.watcher import kube

logger = logging.getLogger(__name__)


@dataclass
class LeaderElector:
    """Hold the coordination.k8s.io/v1 Lease `name` in `namespace` as `identity`.

    Leadership only avoids duplicate work: counting is exact without it (ledger).
    """

    api: kube.KubeApi
    name: str
    namespace: str
    identity: str
    duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    clock: Callable[[], datetime] = timezone.now
    last_renewed: float = field(default=0.0)

    def try_acquire(self) -> bool:
        """Acquire or renew the lease; False if another holder's lease is valid."""
        try:
            return self._try_acquire()
        except Exception as exc:  # noqa: BLE001 - any API failure means "not now"
            failure = kube.classify(exc)
            logger.warning(
                "Lease %s/%s: %s",
                self.namespace,
                self.name,
                failure.detail[:200] if failure else repr(exc),
            )
            return False

    def _try_acquire(self) -> bool:
        now = self.clock()
        lease = self.api.get_lease(name=self.name, namespace=self.namespace)
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(now, now, 0),
            }
            created = self.api.create_lease(namespace=self.namespace, body=body)
            if created:
                self.last_renewed = time.monotonic()
                logger.info("Acquired lease %s/%s", self.namespace, self.name)
            return created
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        transitions = int(spec.get("leaseTransitions") or 0)
        acquired = kube.parse_time(spec.get("acquireTime")) or now
        if holder and holder != self.identity:
            renewed = kube.parse_time(spec.get("renewTime"))
            seconds = float(spec.get("leaseDurationSeconds") or self.duration)
            if renewed is not None and renewed + timedelta(seconds=seconds) > now:
                return False
        if holder != self.identity:
            transitions += 1
            acquired = now
        lease["spec"] = self._spec(acquired, now, transitions)
        ok = self.api.replace_lease(
            name=self.name, namespace=self.namespace, body=lease
        )
        if ok:
            if holder != self.identity:
                logger.info(
                    "Acquired lease %s/%s (previous holder %r)",
                    self.namespace,
                    self.name,
                    holder,
                )
            self.last_renewed = time.monotonic()
        return ok

    def _spec(
        self, acquired: datetime, renewed: datetime, transitions: int
    ) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.duration)),
            "acquireTime": kube.micro_time(acquired),
            "renewTime": kube.micro_time(renewed),
            "leaseTransitions": transitions,
        }

    def release(self) -> None:
        """Give the lease up so a standby takes over at once (best effort)."""
        try:
            lease = self.api.get_lease(name=self.name, namespace=self.namespace)
            if lease is None:
                return
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != self.identity:
                return
            spec.update(holderIdentity=None, leaseDurationSeconds=1)
            spec["renewTime"] = kube.micro_time(self.clock() - timedelta(seconds=2))
            lease["spec"] = spec
            self.api.replace_lease(name=self.name, namespace=self.namespace, body=lease)
            logger.info("Released lease %s/%s", self.namespace, self.name)
        except Exception as exc:  # noqa: BLE001 - the lease expires anyway
            logger.warning("Could not release lease %s: %r", self.name, exc)
