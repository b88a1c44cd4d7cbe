"""A real Kubernetes control plane on 127.0.0.1 for the end-to-end tests and
`make bench-e2e`: etcd (Debian's etcd-server), kube-apiserver and kube-scheduler
(built from Debian's `kubernetes` source by tools/e2e/build-control-plane.sh).

No kubelet: Nodes are objects created through the API, pods are scheduled and bound
by the real kube-scheduler, and their status (started, finished) is written through
the API as a kubelet would. TLS comes from a throw-away CA, clients authenticate
with static tokens, and RBAC decides: the ks-scheduler ServiceAccount's token (a
static token for `system:serviceaccount:kube-system:ks-scheduler`) is authorised by
the RBAC of deploy/, never by system:masters.

Plain standard library plus the openssl command, so the benchmark uses it outside
pytest. Every process is started here and stopped by its own id.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tests.servers import free_port

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "tools" / "e2e" / "build-control-plane.sh"
# The build script's exit status when the Debian source cannot be had.
NO_SOURCE = 3

# Users of the static token file: name -> (user, groups).
USERS = {
    "admin": ("e2e-admin", "system:masters"),
    "ks-scheduler": (
        "system:serviceaccount:kube-system:ks-scheduler",
        "system:serviceaccounts,system:serviceaccounts:kube-system",
    ),
    "default-scheduler": ("system:kube-scheduler", ""),
}


class Unavailable(RuntimeError):
    """The control plane cannot be built on this machine (no Debian source)."""


def build_binaries() -> Path:
    """The directory with kube-apiserver and kube-scheduler, built or cached.

    KSSCHED_E2E_BIN names a directory that has them already (make e2e sets it).
    Raises Unavailable when the Debian source cannot be had.
    """
    given = os.environ.get("KSSCHED_E2E_BIN")
    if given and (Path(given) / "kube-apiserver").exists():
        return Path(given)
    result = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, check=False
    )
    if result.returncode == NO_SOURCE:
        raise Unavailable(result.stderr.strip().splitlines()[-1])
    if result.returncode != 0:
        raise RuntimeError(f"building the control plane failed:\n{result.stderr}")
    return Path(result.stdout.strip().splitlines()[-1])


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_ca(directory: Path) -> None:
    """A throw-away CA: ca.crt and ca.key in `directory`."""
    _openssl("genrsa", "-out", "ca.key", "2048", cwd=directory)
    _openssl(
        "req", "-x509", "-new", "-key", "ca.key", "-subj", "/CN=ks-e2e-ca",
        "-days", "2", "-out", "ca.crt", cwd=directory,
    )  # fmt: skip


def make_serving_cert(directory: Path, name: str) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost signed by the CA in `directory`."""
    ext = directory / f"{name}.ext"
    ext.write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n"
    )
    _openssl("genrsa", "-out", f"{name}.key", "2048", cwd=directory)
    _openssl(
        "req", "-new", "-key", f"{name}.key", "-subj", f"/CN={name}",
        "-out", f"{name}.csr", cwd=directory,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "2", "-extfile", ext.name,
        "-out", f"{name}.crt", cwd=directory,
    )  # fmt: skip
    return directory / f"{name}.crt", directory / f"{name}.key"


@dataclass
class Process:
    """A child process with its log file; stopped by its own id."""

    name: str
    popen: subprocess.Popen
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()

    def pause(self) -> None:
        self.popen.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.popen.send_signal(signal.SIGCONT)

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class ControlPlane:
    """etcd and kube-apiserver on free loopback ports, and schedulers on demand."""

    bin_dir: Path
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp("-ks-e2e")))
    processes: list[Process] = field(default_factory=list)
    apiserver_port: int = 0
    etcd_port: int = 0
    tokens: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def ca_file(self) -> Path:
        return self.workdir / "ca.crt"

    # --- processes -----------------------------------------------------------------

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None):
        log = self.workdir / f"{name}.log"
        with open(log, "ab") as out:
            popen = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env if env is not None else dict(os.environ),
                cwd=self.workdir,
                start_new_session=True,
            )
        process = Process(name, popen, log)
        self.processes.append(process)
        return process

    def start(self) -> ControlPlane:
        make_ca(self.workdir)
        cert, key = make_serving_cert(self.workdir, "apiserver")
        _openssl("genrsa", "-out", "sa.key", "2048", cwd=self.workdir)
        _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=self.workdir)
        lines = []
        for index, (name, (user, groups)) in enumerate(USERS.items()):
            token = base64.b32encode(os.urandom(20)).decode().lower()
            self.tokens[name] = token
            lines.append(f'{token},{user},uid-{index},"{groups}"')
        (self.workdir / "tokens.csv").write_text("\n".join(lines) + "\n")
        self._start_etcd()
        self._start_apiserver(cert, key)
        return self

    def _start_etcd(self) -> None:
        self.etcd_port, peer = free_port(), free_port()
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        data = Path(tempfile.mkdtemp("-ks-etcd", dir=shm))
        self._etcd_data = data
        self.spawn(
            "etcd",
            [
                "etcd", "--name", "e2e", "--data-dir", str(data),
                "--listen-client-urls", f"http://127.0.0.1:{self.etcd_port}",
                "--advertise-client-urls", f"http://127.0.0.1:{self.etcd_port}",
                "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                "--initial-cluster", f"e2e=http://127.0.0.1:{peer}",
                "--log-level", "warn",
            ],
        )  # fmt: skip
        self._wait(lambda: self.etcd("/v3/maintenance/status", {}) is not None, "etcd")

    def _start_apiserver(self, cert: Path, key: Path) -> None:
        self.apiserver_port = free_port()
        self.spawn(
            "kube-apiserver",
            [
                str(self.bin_dir / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.apiserver_port}",
                "--insecure-port=0",
                f"--tls-cert-file={cert}",
                f"--tls-private-key-file={key}",
                f"--client-ca-file={self.ca_file}",
                f"--token-auth-file={self.workdir / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                f"--service-account-key-file={self.workdir / 'sa.pub'}",
                f"--service-account-signing-key-file={self.workdir / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc",
                "--api-audiences=https://kubernetes.default.svc",
                "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
                "--endpoint-reconciler-type=none",
                "--service-cluster-ip-range=10.96.0.0/16",
                # Pods are read from etcd, not the watch cache, so that an etcd
                # compaction answers an old watch with 410 Gone, as it does on a
                # cluster whose watch cache has moved on.
                "--watch-cache-sizes=pods#0",
                "--profiling=false",
                "--v=1",
            ],
        )
        self._wait(self._ready, "kube-apiserver", timeout=90)

    def _ready(self) -> bool:
        try:
            status, _ = self.request("GET", "/readyz")
        except OSError:
            return False
        return status == 200

    def _wait(self, check, what: str, timeout: float = 30) -> None:
        """Wait for `check()`, failing at once if the process starting (the last
        one) or etcd and the API server exit."""
        deadline = time.monotonic() + timeout
        watched = [*self.processes[:2], self.processes[-1]]
        while time.monotonic() < deadline:
            for process in watched:
                if not process.alive():
                    raise RuntimeError(f"{process.name} exited:\n{process.tail()}")
            if check():
                return
            time.sleep(0.2)
        raise TimeoutError(f"{what} not ready after {timeout} s")

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()
        shutil.rmtree(getattr(self, "_etcd_data", ""), ignore_errors=True)

    # --- clients -------------------------------------------------------------------

    def kubeconfig(self, user: str = "admin") -> Path:
        """A kubeconfig for `user` (a key of USERS)."""
        path = self.workdir / f"kubeconfig-{user}"
        if not path.exists():
            path.write_text(
                json.dumps(
                    {
                        "apiVersion": "v1",
                        "kind": "Config",
                        "clusters": [
                            {
                                "name": "e2e",
                                "cluster": {
                                    "server": self.url,
                                    "certificate-authority": str(self.ca_file),
                                },
                            }
                        ],
                        "users": [{"name": user, "user": {"token": self.tokens[user]}}],
                        "contexts": [
                            {"name": "e2e", "context": {"cluster": "e2e", "user": user}}
                        ],
                        "current-context": "e2e",
                    }
                )
            )
        return path

    def _context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def request(
        self,
        method: str,
        path: str,
        body: object | None = None,
        *,
        user: str = "admin",
        content_type: str = "application/json",
        timeout: float = 30,
    ) -> tuple[int, dict]:
        """One API call; (status, decoded JSON body or {})."""
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={
                "Authorization": f"Bearer {self.tokens[user]}",
                "Content-Type": content_type,
                "Accept": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(
                request, context=self._context(), timeout=timeout
            ) as answer:
                raw = answer.read()
                status = answer.status
        except urllib.error.HTTPError as error:
            raw, status = error.read(), error.code
        try:
            return status, json.loads(raw) if raw else {}
        except ValueError:
            return status, {"raw": raw.decode(errors="replace")}

    def ok(self, method: str, path: str, body: object | None = None, **kw) -> dict:
        status, answer = self.request(method, path, body, **kw)
        if status >= 300:
            raise RuntimeError(f"{method} {path}: {status} {answer}")
        return answer

    def kubectl(self, *args: str, user: str = "admin", stdin: str | None = None) -> str:
        """Run kubectl against this control plane; its stdout (raises on failure)."""
        result = subprocess.run(
            ["kubectl", f"--kubeconfig={self.kubeconfig(user)}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {result.stderr}")
        return result.stdout

    def apply(self, manifests: str, user: str = "admin") -> None:
        self.kubectl("apply", "-f", "-", user=user, stdin=manifests)

    # --- etcd ----------------------------------------------------------------------

    def etcd(self, path: str, body: dict) -> dict | None:
        """A call to etcd's JSON gateway, or None while it does not answer."""
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.etcd_port}{path}",
            data=json.dumps(body).encode(),
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:
                return json.loads(answer.read())
        except OSError:
            return None

    def compact(self) -> int:
        """Compact etcd at its current revision (as the API server does every five
        minutes); returns the revision."""
        status = self.etcd("/v3/kv/range", {"key": base64.b64encode(b"/").decode()})
        if status is None:
            raise RuntimeError("etcd does not answer")
        revision = int(status["header"]["revision"])
        self.etcd("/v3/kv/compaction", {"revision": revision, "physical": True})
        return revision

    # --- cluster objects -----------------------------------------------------------

    def create_nodes(self, names: Iterable[str], *, cpu: str = "64", pods: str = "500"):
        """Ready Node objects (no kubelet): allocatable enough for every test pod."""
        for name in names:
            resources = {"cpu": cpu, "memory": "256Gi", "pods": pods}
            self.ok(
                "POST",
                "/api/v1/nodes",
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": name,
                        "labels": {"kubernetes.io/hostname": name},
                    },
                    "status": {
                        "capacity": resources,
                        "allocatable": resources,
                        "conditions": [
                            {
                                "type": "Ready",
                                "status": "True",
                                "reason": "KubeletReady",
                                "lastHeartbeatTime": _now(),
                                "lastTransitionTime": _now(),
                            }
                        ],
                    },
                },
            )

    def delete_nodes(self, names: Iterable[str]) -> None:
        for name in names:
            self.request("DELETE", f"/api/v1/nodes/{name}")

    def ensure_namespace(self, name: str, labels: dict[str, str] | None = None) -> None:
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        if labels:
            body["metadata"]["labels"] = labels
        status, answer = self.request("POST", "/api/v1/namespaces", body)
        if status not in (201, 409):
            raise RuntimeError(f"namespace {name}: {status} {answer}")

    def create_pod(
        self,
        namespace: str,
        name: str,
        *,
        label: str | None,
        scheduler: str = "ks-scheduler",
        extra_labels: dict[str, str] | None = None,
    ) -> dict:
        labels = dict(extra_labels or {})
        if label is not None:
            labels["ks-pipeline"] = label
        return self.ok(
            "POST",
            f"/api/v1/namespaces/{namespace}/pods",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "labels": labels},
                "spec": {
                    "schedulerName": scheduler,
                    "containers": [
                        {
                            "name": "build",
                            "image": "registry.example/ci/build:1",
                            "resources": {"requests": {"cpu": "10m"}},
                        }
                    ],
                },
            },
        )

    def pod(self, namespace: str, name: str) -> dict:
        return self.ok("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")

    def wait_bound(self, namespace: str, name: str, timeout: float = 30) -> str:
        """The node the pod was bound to (waits for the scheduler)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            node = self.pod(namespace, name)["spec"].get("nodeName")
            if node:
                return node
            time.sleep(0.05)
        raise TimeoutError(f"pod {namespace}/{name} not bound after {timeout} s")

    def set_phase(
        self, namespace: str, name: str, phase: str, *, started: str, finished=None
    ) -> None:
        """Write the pod's status as its kubelet would: Running or Succeeded, with
        the container's start (and finish) times."""
        pod = self.pod(namespace, name)
        if finished:
            state = {
                "terminated": {
                    "exitCode": 0,
                    "reason": "Completed",
                    "startedAt": started,
                    "finishedAt": finished,
                }
            }
        else:
            state = {"running": {"startedAt": started}}
        pod["status"] = {
            **pod.get("status", {}),
            "phase": phase,
            "startTime": pod.get("status", {}).get("startTime") or started,
            "containerStatuses": [
                {
                    "name": "build",
                    "image": "registry.example/ci/build:1",
                    "imageID": "",
                    "ready": not finished,
                    "restartCount": 0,
                    "state": state,
                    "started": not finished,
                }
            ],
        }
        self.ok("PUT", f"/api/v1/namespaces/{namespace}/pods/{name}/status", pod)

    def delete_pod(self, namespace: str, name: str) -> None:
        self.request(
            "DELETE",
            f"/api/v1/namespaces/{namespace}/pods/{name}",
            {"gracePeriodSeconds": 0},
        )

    def events_for(self, namespace: str, pod: str) -> list[dict]:
        answer = self.ok(
            "GET",
            f"/apis/events.k8s.io/v1/namespaces/{namespace}/events"
            f"?fieldSelector=regarding.name={pod}",
        )
        return answer.get("items", [])

    # --- schedulers ----------------------------------------------------------------

    def start_scheduler(
        self,
        name: str,
        *,
        config: str | None = None,
        args: Iterable[str] = (),
        user: str = "ks-scheduler",
        lease: str = "ks-scheduler",
        client: tuple[float, int] | None = None,
    ) -> tuple[Process, int]:
        """kube-scheduler with `config` (a KubeSchedulerConfiguration, its
        clientConnection and serving addresses filled in here) or with flags only;
        `client` sets its API client's (qps, burst) instead of the defaults (50, 100).
        Returns the process and the port of its plain-HTTP /metrics and /healthz."""
        port = free_port()
        argv = [str(self.bin_dir / "kube-scheduler"), "--secure-port=0", "--v=1"]
        if config is not None:
            path = self.workdir / f"{name}-config.json"
            path.write_text(
                _scheduler_config(config, self.kubeconfig(user), port, client)
            )
            argv.append(f"--config={path}")
        else:
            argv += [
                f"--kubeconfig={self.kubeconfig(user)}",
                f"--port={port}",
                "--address=127.0.0.1",
            ]
            if client is not None:
                argv += [f"--kube-api-qps={client[0]}", f"--kube-api-burst={client[1]}"]
        argv += list(args)
        # The Lease of a scheduler stopped before is not released (1.20 does not):
        # the new one takes it now rather than after its 15 s.
        leases = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"
        self.request("DELETE", f"{leases}/{lease}")
        process = self.spawn(name, argv)
        self._wait(lambda: _healthy(port), name, timeout=60)
        return process, port


def _scheduler_config(
    text: str, kubeconfig: Path, port: int, client: tuple[float, int] | None = None
) -> str:
    """The deploy/ configuration, as JSON, made to run here: 1.20 serves
    kubescheduler.config.k8s.io/v1beta1, the client is our kubeconfig (with
    `client`'s qps and burst when given), and health and metrics listen on `port`
    (plain HTTP on loopback)."""
    import yaml

    document = yaml.safe_load(text)
    document["apiVersion"] = "kubescheduler.config.k8s.io/v1beta1"
    document["clientConnection"] = {"kubeconfig": str(kubeconfig)}
    if client is not None:
        document["clientConnection"].update(qps=client[0], burst=client[1])
    document["healthzBindAddress"] = f"127.0.0.1:{port}"
    document["metricsBindAddress"] = f"127.0.0.1:{port}"
    return json.dumps(document)


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def scrape(port: int) -> str:
    """A scheduler's /metrics text."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
