"""ks-scheduler's own processes beside the real control plane: the servers
(`python -m kssched.serve`), the watcher (`manage.py watch_pods` with the
ks-scheduler ServiceAccount's token) and kube-scheduler configured from deploy/.
"""

from __future__ import annotations

import base64
import copy
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import yaml

from tests.e2e.controlplane import ControlPlane, make_serving_cert
from tests.helpers import REPO, database_env, run_servers
from tests.watcher_process import WatcherProcess, wait_until, watcher_env

DEPLOY = REPO / "deploy"
# What the processes run with: the production scoring default, not the suite's seed.
PRODUCTION = {"KSSCHED_SCORING": "warm", "KSSCHED_WATCHER_METRICS_BIND": ""}


@contextmanager
def servers(plane: ControlPlane | None = None, **extra: str):
    """Both listeners as deployed; with `plane`, the web listener serves TLS with a
    certificate of the control plane's CA (the webhook's caBundle)."""
    env = dict(PRODUCTION)
    if plane is not None:
        cert, key = make_serving_cert(plane.workdir, "webhook")
        env["KSSCHED_TLS_CERT_FILE"] = str(cert)
        env["KSSCHED_TLS_KEY_FILE"] = str(key)
    env.update(extra)
    with run_servers(env, web_workers=1, extender_workers=1) as running:
        yield running


def kept_connections(url: str) -> set[int]:
    """The client ports of the connections to `url`'s port that are open now
    (/proc/net/tcp: local port in hex, state 01 = established)."""
    port = f"{int(url.rsplit(':', 1)[1]):04X}"
    with open("/proc/net/tcp") as table:
        rows = [line.split() for line in table.readlines()[1:]]
    return {
        int(row[2].split(":")[1], 16)
        for row in rows
        if row[1].split(":")[1] == port and row[3] == "01"
    }


@contextmanager
def watcher(plane: ControlPlane, workdir: Path, *args: str, name="watcher", **extra):
    """`manage.py watch_pods` with the ks-scheduler ServiceAccount's kubeconfig."""
    env = watcher_env(
        {**database_env(), **PRODUCTION},
        plane.kubeconfig("ks-scheduler"),
        workdir,
        **extra,
    )
    process = WatcherProcess(env, list(args), workdir / f"{name}.log").start()
    try:
        assert process.wait_ready(30), process.log
        yield process
    finally:
        if process.process.poll() is None:
            process.stop()


def scheduler_config(extender_url: str, **changes) -> str:
    """deploy/'s KubeSchedulerConfiguration for 1.23-1.24 (the one nearest to 1.20's
    v1beta1, whose fields it shares), pointed at `extender_url`, with `changes`
    applied to its extender."""
    document = yaml.safe_load(
        (DEPLOY / "legacy/v1beta3/kube-scheduler-config.yaml").read_text()
    )
    extender = document["extenders"][0]
    extender["urlPrefix"] = f"{extender_url}/scheduler"
    extender.update(changes)
    return yaml.safe_dump(document)


def policy_scheduler_args(plane: ControlPlane, extender_url: str) -> list[str]:
    """kube-scheduler's flags and Policy from deploy/legacy/policy, pointed at
    `extender_url`."""
    kustomization = yaml.safe_load(
        (DEPLOY / "legacy/policy/kustomization.yaml").read_text()
    )
    patch = yaml.safe_load(kustomization["patches"][0]["patch"])
    command = next(op["value"] for op in patch if op["path"].endswith("/command"))
    policy = yaml.safe_load((DEPLOY / "legacy/policy/policy.cfg").read_text())
    policy = copy.deepcopy(policy)
    policy["extenders"][0]["urlPrefix"] = f"{extender_url}/scheduler"
    path = plane.workdir / f"policy-{time.monotonic_ns()}.cfg"
    path.write_text(yaml.safe_dump(policy))
    args = []
    for flag in command[1:]:
        if flag.startswith("--policy-config-file="):
            flag = f"--policy-config-file={path}"
        args.append(flag)
    return args


def webhook_configuration(plane: ControlPlane, web_url: str) -> str:
    """deploy/overlays/webhook's MutatingWebhookConfiguration, reaching the web
    listener by url with the control plane's CA as its caBundle (no cert-manager
    here)."""
    document = yaml.safe_load(
        (DEPLOY / "overlays/webhook/mutating-webhook.yaml").read_text()
    )
    document["metadata"].pop("annotations", None)
    port = web_url.rsplit(":", 1)[1]
    for hook in document["webhooks"]:
        hook["clientConfig"] = {
            "url": f"https://127.0.0.1:{port}/webhook/mutate",
            "caBundle": base64.b64encode(plane.ca_file.read_bytes()).decode(),
        }
    return yaml.safe_dump(document)


def wait_recorded(uids: set[str], timeout: float = 30) -> bool:
    """Wait until the ledger has every pod of `uids`."""
    from tests.watcher_process import ledger_uids

    return wait_until(lambda: uids <= ledger_uids(), timeout)


def wait_finished(uids: set[str], timeout: float = 30) -> bool:
    from history.models import Placement

    return wait_until(
        lambda: (
            Placement.objects.filter(
                pod_uid__in=uids, finished_at__isnull=False
            ).count()
            == len(uids)
        ),
        timeout,
    )


def run_pod(
    plane: ControlPlane,
    namespace: str,
    name: str,
    *,
    label: str,
    node: str | None = None,
    scheduler: str = "ks-scheduler",
    finish: bool = True,
    startup: Callable[[str], float] | None = None,
) -> tuple[str, str]:
    """A pipeline pod from creation to its end: bound by the scheduler (or to
    `node` directly), then Running, then Succeeded. Returns (uid, node).

    `startup(node)` gives the seconds its container takes to start on the node
    it was bound to (image pulls, workspace restores): the status says it started
    that long after now (default: at once)."""
    pod = plane.create_pod(namespace, name, label=label, scheduler=scheduler)
    if node is not None:
        plane.ok(
            "POST",
            f"/api/v1/namespaces/{namespace}/pods/{name}/binding",
            {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": name},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node},
            },
        )
    bound = plane.wait_bound(namespace, name)
    late = startup(bound) if startup is not None else 0.0
    started = _stamp(late)
    plane.set_phase(namespace, name, "Running", started=started)
    if finish:
        plane.set_phase(
            namespace, name, "Succeeded", started=started, finished=_stamp(late)
        )
    return pod["metadata"]["uid"], bound


def _stamp(later: float = 0.0) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + later))
