"""Offline checks of deploy/ and the Dockerfile.

The manifests are built with `kubectl kustomize` and validated against the Kubernetes
JSON schemas shipped with kubernetes-validate (strict: unknown fields are errors). The
scheduler configuration is checked key by key against the exact, case-sensitive field
names of kubescheduler.config.k8s.io, because kube-scheduler refuses to start on an
unknown key. No cluster, no container engine and no database are needed.
"""

import importlib.util
import ipaddress
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlparse

import kubernetes_validate
import pytest
import yaml

from kssched import variables

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
ONE_FILE = DEPLOY / "ks-scheduler.yaml"
BASE_CONFIG = DEPLOY / "base" / "kube-scheduler-config.yaml"
V1BETA3_CONFIG = DEPLOY / "legacy" / "v1beta3" / "kube-scheduler-config.yaml"
POLICY_FILE = DEPLOY / "legacy" / "policy" / "policy.cfg"
DOCKERFILE = ROOT / "Dockerfile"

BUILDS = {
    "sqlite": DEPLOY / "overlays" / "sqlite",
    # Not "postgres": the conftest treats that word in a test id as the postgres marker.
    "pg": DEPLOY / "overlays" / "postgres",
    "legacy-policy": DEPLOY / "legacy" / "policy",
    "legacy-v1beta3": DEPLOY / "legacy" / "v1beta3",
}
# Oldest and newest schema sets kubernetes-validate ships. The legacy builds target
# older clusters, but 1.25 is the oldest schema available offline.
SCHEMA_VERSIONS = ("1.25", kubernetes_validate.latest_version())

NAMESPACE = "kube-system"
SCHEDULER_NAME = "ks-scheduler"
SCHEDULER_LEASE = "ks-scheduler"
WATCHER_LEASE = "ks-scheduler-watcher"
EXTENDER_URL = "http://127.0.0.1:8081/scheduler"
PRIORITIZE_VERB = "priorities/pipeline"
FILTER_VERB = "predicates/alwaystrue"
# Counts are a soft preference: a failing extender must never block scheduling.
IGNORABLE_POLICY = True
GUNICORN_GRACEFUL_TIMEOUT = 30

# Exact field names of kubescheduler.config.k8s.io/v1 (and v1beta3, which has the same
# names for everything used here). Case-sensitive; anything else is fatal at start-up.
CONFIG_KEYS = {
    "apiVersion",
    "kind",
    "parallelism",
    "leaderElection",
    "clientConnection",
    "enableProfiling",
    "enableContentionProfiling",
    "percentageOfNodesToScore",
    "podInitialBackoffSeconds",
    "podMaxBackoffSeconds",
    "profiles",
    "extenders",
}
LEADER_ELECTION_KEYS = {
    "leaderElect",
    "leaseDuration",
    "renewDeadline",
    "retryPeriod",
    "resourceLock",
    "resourceName",
    "resourceNamespace",
}
# KubeSchedulerProfile.percentageOfNodesToScore exists only from 1.27, so it is not
# allowed here: the shipped v1 config must start on 1.25 and 1.26 too.
PROFILE_KEYS = {"schedulerName", "plugins", "pluginConfig"}
EXTENDER_KEYS = {
    "urlPrefix",
    "filterVerb",
    "preemptVerb",
    "prioritizeVerb",
    "bindVerb",
    "weight",
    "enableHTTPS",
    "tlsConfig",
    "httpTimeout",
    "nodeCacheCapable",
    "managedResources",
    "ignorable",
}
TLS_CONFIG_KEYS = {
    "insecure",
    "serverName",
    "certFile",
    "keyFile",
    "caFile",
    "certData",
    "keyData",
    "caData",
}
# Legacy Policy (apiVersion v1, Kubernetes <= 1.22): note enableHttps and an integer
# nanosecond httpTimeout.
POLICY_KEYS = {
    "kind",
    "apiVersion",
    "predicates",
    "priorities",
    "extenders",
    "hardPodAffinitySymmetricWeight",
    "alwaysCheckAllPredicates",
}
LEGACY_EXTENDER_KEYS = (EXTENDER_KEYS - {"enableHTTPS"}) | {"enableHttps"}

SECRET_NAME_RE = re.compile(r"SECRET|PASSWORD|TOKEN|DATABASE_URL|PRIVATE", re.I)
DURATION_RE = re.compile(r"^\d+(ms|s|m)$")


# --- helpers --------------------------------------------------------------------------


def kubectl_or_skip() -> str:
    """Path of kubectl; without it skip locally, but fail under CI."""
    kubectl = shutil.which("kubectl")
    if kubectl:
        return kubectl
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail("kubectl is required under CI (Debian package kubernetes-client)")
    pytest.skip("kubectl not installed (Debian package kubernetes-client)")


def kustomize(path: Path) -> list[dict]:
    kubectl = kubectl_or_skip()
    result = subprocess.run(
        [kubectl, "kustomize", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, f"kustomize {path} failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module")
def builds() -> dict[str, list[dict]]:
    return {name: kustomize(path) for name, path in BUILDS.items()}


def one_file_docs() -> list[dict]:
    return [doc for doc in yaml.safe_load_all(ONE_FILE.read_text()) if doc]


def find(docs: list[dict], kind: str, name: str | None = None) -> list[dict]:
    return [
        d
        for d in docs
        if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]


def the(docs: list[dict], kind: str, name: str) -> dict:
    found = find(docs, kind, name)
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def deployment(docs: list[dict]) -> dict:
    return the(docs, "Deployment", "ks-scheduler")


def pod_spec(docs: list[dict]) -> dict:
    return deployment(docs)["spec"]["template"]["spec"]


def containers(docs: list[dict]) -> dict[str, dict]:
    return {c["name"]: c for c in pod_spec(docs)["containers"]}


def all_containers(docs: list[dict]) -> list[dict]:
    spec = pod_spec(docs)
    return [*spec.get("initContainers", []), *spec["containers"]]


def scheduler_config_from(docs: list[dict]) -> dict:
    (config_map,) = [
        d
        for d in find(docs, "ConfigMap")
        if d["metadata"]["name"].startswith("ks-scheduler-config")
    ]
    return config_map


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def check_scheduler_config(config: dict, api_version: str) -> None:
    """Field-by-field check of a KubeSchedulerConfiguration (v1 or v1beta3)."""
    assert config["apiVersion"] == api_version
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert set(config) <= CONFIG_KEYS, set(config) - CONFIG_KEYS

    election = config["leaderElection"]
    assert set(election) <= LEADER_ELECTION_KEYS, set(election) - LEADER_ELECTION_KEYS
    assert election["leaderElect"] is True
    assert election["resourceLock"] == "leases"
    assert election["resourceNamespace"] == NAMESPACE
    # The default scheduler holds "kube-scheduler"; sharing it would idle one of them.
    assert election["resourceName"] == SCHEDULER_LEASE != "kube-scheduler"

    (profile,) = config["profiles"]
    assert set(profile) <= PROFILE_KEYS, set(profile) - PROFILE_KEYS
    assert profile["schedulerName"] == SCHEDULER_NAME
    # Every feasible node is scored, so warm nodes are never sampled away.
    assert config["percentageOfNodesToScore"] == 100

    (extender,) = config["extenders"]
    assert set(extender) <= EXTENDER_KEYS, set(extender) - EXTENDER_KEYS
    assert set(extender.get("tlsConfig", {})) <= TLS_CONFIG_KEYS
    assert extender["urlPrefix"] == EXTENDER_URL
    assert extender["prioritizeVerb"] == PRIORITIZE_VERB
    assert "filterVerb" not in extender, "the filter verb is off by default"
    assert "bindVerb" not in extender and "preemptVerb" not in extender
    weight = extender["weight"]
    assert type(weight) is int and weight > 0, "prioritizeVerb needs a positive weight"
    # score (<= 10) x weight x 10 must not dwarf the default plugins' ~1200 maximum.
    assert 10 * weight * 10 <= 1200
    assert extender["nodeCacheCapable"] is True
    assert extender["ignorable"] is IGNORABLE_POLICY
    assert extender["enableHTTPS"] is False
    timeout = extender["httpTimeout"]
    assert isinstance(timeout, str) and DURATION_RE.match(timeout), timeout


def check_config_comments(text: str) -> None:
    """The decisions carry their reasons next to them in the shipped file."""
    lines = text.splitlines()

    def comment_before(key: str) -> str:
        index = next(i for i, line in enumerate(lines) if line.strip().startswith(key))
        block = []
        for line in reversed(lines[:index]):
            if not line.strip().startswith("#"):
                break
            block.append(line)
        return "\n".join(block)

    assert "1200" in comment_before("weight:")
    assert "soft preference" in comment_before("ignorable:")
    assert "sample" in comment_before("percentageOfNodesToScore:")
    assert re.search(rf"^\s*#\s*filterVerb: {FILTER_VERB}$", text, re.M), (
        "a commented variant enabling the filter verb"
    )


# --- schema validation ----------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(BUILDS))
@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_kustomize_build_validates_against_kubernetes_schemas(builds, name, version):
    docs = builds[name]
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_one_file_install_validates_against_kubernetes_schemas(version):
    for doc in one_file_docs():
        kubernetes_validate.validate(doc, version, strict=True)


def test_schema_validation_rejects_a_misspelt_field(builds):
    """The validator used above does catch mistakes (strict mode, nested fields)."""
    docs = json.loads(json.dumps(builds["sqlite"]))
    container = pod_spec(docs)["containers"][0]
    container["securityContext"]["readOnlyRootFileSystem"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment(docs), SCHEMA_VERSIONS[0], strict=True)


def test_one_file_install_equals_the_sqlite_kustomize_build(builds):
    assert one_file_docs() == builds["sqlite"], (
        "deploy/ks-scheduler.yaml is stale: run deploy/render.sh"
    )


# --- scheduler configuration ----------------------------------------------------------


def test_v1_scheduler_config_uses_exact_v1_field_names():
    text = BASE_CONFIG.read_text()
    check_scheduler_config(yaml.safe_load(text), "kubescheduler.config.k8s.io/v1")
    check_config_comments(text)


def test_v1beta3_scheduler_config_uses_exact_field_names():
    text = V1BETA3_CONFIG.read_text()
    check_scheduler_config(yaml.safe_load(text), "kubescheduler.config.k8s.io/v1beta3")
    check_config_comments(text)
    assert "1.23" in text.splitlines()[1] and "1.24" in text.splitlines()[1]


def test_v1beta3_and_v1_configs_agree_apart_from_api_version():
    v1 = yaml.safe_load(BASE_CONFIG.read_text())
    v1beta3 = yaml.safe_load(V1BETA3_CONFIG.read_text())
    assert v1.pop("apiVersion") != v1beta3.pop("apiVersion")
    assert v1 == v1beta3


def test_scheduler_config_check_rejects_wrong_casing():
    config = yaml.safe_load(BASE_CONFIG.read_text())
    extender = config["extenders"][0]
    extender["enableHttps"] = extender.pop("enableHTTPS")
    with pytest.raises(AssertionError):
        check_scheduler_config(config, "kubescheduler.config.k8s.io/v1")


@pytest.mark.parametrize("name", ["sqlite", "pg"])
def test_built_config_map_carries_the_v1_config_unchanged(builds, name):
    config_map = scheduler_config_from(builds[name])
    assert config_map["data"]["config.yaml"] == BASE_CONFIG.read_text()
    mounts = {
        m["name"]: m["mountPath"]
        for m in containers(builds[name])["kube-scheduler"]["volumeMounts"]
    }
    command = containers(builds[name])["kube-scheduler"]["command"]
    assert f"--config={mounts['config']}/config.yaml" in command


def test_extender_url_is_the_loopback_extender_listener(builds):
    """kube-scheduler calls the extender listener (loopback, its own workers); the
    pod port is the web listener's."""
    url = urlparse(EXTENDER_URL)
    extender = containers(builds["sqlite"])["extender"]
    env = env_of(extender)
    assert env["KSSCHED_EXTENDER_BIND"]["value"] == f"{url.hostname}:{url.port}"
    assert ipaddress.ip_address(url.hostname).is_loopback
    web_port = int(env["KSSCHED_BIND"]["value"].rsplit(":", 1)[1])
    assert web_port != url.port
    assert {p["containerPort"] for p in extender["ports"]} == {web_port}
    assert extender["command"] == ["python", "-m", "kssched.serve"]


def test_extender_routes_exist_for_the_configured_verbs():
    from django.urls import resolve

    path = urlparse(EXTENDER_URL).path
    for verb in (PRIORITIZE_VERB, FILTER_VERB):
        resolve(f"{path}/{verb}")


def test_legacy_policy_uses_legacy_field_names_and_nanoseconds(builds):
    policy = json.loads(POLICY_FILE.read_text())
    assert policy["kind"] == "Policy" and policy["apiVersion"] == "v1"
    assert set(policy) <= POLICY_KEYS
    (extender,) = policy["extenders"]
    assert set(extender) <= LEGACY_EXTENDER_KEYS, set(extender) - LEGACY_EXTENDER_KEYS
    assert extender["enableHttps"] is False
    v1 = yaml.safe_load(BASE_CONFIG.read_text())["extenders"][0]
    for key in ("urlPrefix", "prioritizeVerb", "weight", "nodeCacheCapable"):
        assert extender[key] == v1[key], key
    assert extender["ignorable"] is IGNORABLE_POLICY
    seconds = int(v1["httpTimeout"].rstrip("s"))
    assert extender["httpTimeout"] == seconds * 1_000_000_000

    docs = builds["legacy-policy"]
    config_map = scheduler_config_from(docs)
    assert json.loads(config_map["data"]["policy.cfg"]) == policy
    scheduler = containers(docs)["kube-scheduler"]
    mounts = {m["name"]: m["mountPath"] for m in scheduler["volumeMounts"]}
    command = scheduler["command"]
    assert f"--policy-config-file={mounts['config']}/policy.cfg" in command
    assert f"--scheduler-name={SCHEDULER_NAME}" in command
    assert f"--lock-object-name={SCHEDULER_LEASE}" in command
    assert not any(arg.startswith("--config") for arg in command)
    # The index-based JSON patches in legacy/policy must have hit the right containers.
    assert [c["name"] for c in pod_spec(docs)["containers"]] == [
        "kube-scheduler",
        "extender",
        "watcher",
    ]
    assert scheduler["livenessProbe"]["httpGet"]["port"] == 10251
    minor = int(scheduler["image"].rsplit(":v1.", 1)[1].split(".")[0])
    assert 13 <= minor <= 22


def test_legacy_files_state_their_version_range():
    policy_head = (DEPLOY / "legacy" / "policy" / "kustomization.yaml").read_text()
    assert "1.13 - 1.22" in policy_head.splitlines()[0]
    v1beta3_head = (DEPLOY / "legacy" / "v1beta3" / "kustomization.yaml").read_text()
    assert "1.23 - 1.24" in v1beta3_head.splitlines()[0]
    assert "1.25" in BASE_CONFIG.read_text().splitlines()[1]


# --- pod, security, RBAC --------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_every_container_is_hardened_and_bounded(builds, name):
    spec = pod_spec(builds[name])
    pod_security = spec["securityContext"]
    assert pod_security["runAsNonRoot"] is True
    assert pod_security["runAsUser"] != 0
    if name == "legacy-policy":
        # Kubernetes 1.13 - 1.18 know only the annotation form.
        annotations = deployment(builds[name])["spec"]["template"]["metadata"]
        key = "seccomp.security.alpha.kubernetes.io/pod"
        assert annotations["annotations"][key] == "runtime/default"
        assert "seccompProfile" not in pod_security
        assert not any("startupProbe" in c for c in spec["containers"])
    else:
        assert pod_security["seccompProfile"]["type"] == "RuntimeDefault"
    assert spec["serviceAccountName"] == "ks-scheduler"
    for container in all_containers(builds[name]):
        security = container["securityContext"]
        where = f"{name}: {container['name']}"
        assert security["allowPrivilegeEscalation"] is False, where
        assert security["readOnlyRootFilesystem"] is True, where
        assert security.get("runAsNonRoot", True) is True, where
        assert "privileged" not in security or security["privileged"] is False
        assert security["capabilities"]["drop"] == ["ALL"], where
        assert "add" not in security["capabilities"], where
        resources = container["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"]), where
        assert "memory" in resources["limits"], where
    for container in spec["containers"]:
        assert "livenessProbe" in container, container["name"]


def test_probes_point_at_the_right_endpoints(builds):
    by_name = containers(builds["sqlite"])
    scheduler = by_name["kube-scheduler"]
    for probe in ("livenessProbe", "readinessProbe"):
        get = scheduler[probe]["httpGet"]
        assert (get["path"], get["port"], get["scheme"]) == ("/healthz", 10259, "HTTPS")
    extender = by_name["extender"]
    # Liveness checks the extender listener from inside the container (the kubelet
    # reaches only the web listener, which clients on the network can keep busy).
    probe = ["python", "-m", "kssched.probe"]
    assert extender["livenessProbe"]["exec"]["command"] == probe
    assert extender["startupProbe"]["exec"]["command"] == probe
    assert extender["readinessProbe"]["httpGet"]["path"] == "/readyz"
    watcher = by_name["watcher"]
    assert watcher["livenessProbe"]["exec"]["command"] == [
        "python",
        "manage.py",
        "watcher_health",
    ]


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_writable_paths_are_volumes(builds, name):
    """With a read-only root filesystem, /data and /tmp must be mounted volumes."""
    spec = pod_spec(builds[name])
    volumes = {v["name"] for v in spec["volumes"]}
    for container in all_containers(builds[name]):
        if container["name"] == "kube-scheduler":
            continue
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert {"/data", "/tmp"} <= set(mounts), container["name"]
        assert set(mounts.values()) <= volumes


def test_termination_grace_outlasts_gunicorn_graceful_timeout(builds):
    graceful = GUNICORN_GRACEFUL_TIMEOUT
    conf = ROOT / "kssched" / "gunicorn_conf.py"
    if conf.exists():
        match = re.search(r"^graceful_timeout\s*=\D*(\d+)", conf.read_text(), re.M)
        if match:
            graceful = int(match.group(1))
    for name in BUILDS:
        assert pod_spec(builds[name])["terminationGracePeriodSeconds"] > graceful


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_no_secret_is_inlined(builds, name):
    docs = builds[name]
    assert not find(docs, "Secret"), "Secrets are referenced, never shipped"
    for container in all_containers(docs):
        for item in container.get("env", []):
            if SECRET_NAME_RE.search(item["name"]):
                assert "value" not in item, f"{container['name']}: {item['name']}"
                assert "secretKeyRef" in item["valueFrom"], item["name"]
    for config_map in find(docs, "ConfigMap"):
        for key in config_map.get("data", {}):
            assert not SECRET_NAME_RE.search(key), f"{key} in a ConfigMap"
    env = env_of(containers(docs)["extender"])
    assert env["SECRET_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "ks-scheduler",
        "key": "secret-key",
    }


def test_example_secret_is_not_installed():
    for kustomization in DEPLOY.rglob("kustomization.yaml"):
        spec = yaml.safe_load(kustomization.read_text())
        listed = spec.get("resources", []) + [
            p if isinstance(p, str) else p.get("path", "")
            for p in spec.get("patches", [])
        ]
        assert not any("secret" in entry for entry in listed), kustomization
        assert "secretGenerator" not in spec, kustomization
    assert "kind: Secret" not in ONE_FILE.read_text()


def test_sqlite_overlay_is_single_replica_on_a_volume_claim(builds):
    docs = builds["sqlite"]
    spec = deployment(docs)["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}
    volumes = {v["name"]: v for v in spec["template"]["spec"]["volumes"]}
    claim = volumes["data"]["persistentVolumeClaim"]["claimName"]
    assert set(volumes["data"]) == {"name", "persistentVolumeClaim"}
    the(docs, "PersistentVolumeClaim", claim)
    for container in all_containers(docs):
        assert "DATABASE_URL" not in env_of(container)
    assert "--leader-elect" not in containers(docs)["watcher"]["command"]


def test_pg_overlay_is_replicated_with_database_url_from_a_secret(builds):
    docs = builds["pg"]
    assert deployment(docs)["spec"]["replicas"] >= 2
    assert not find(docs, "PersistentVolumeClaim")
    for container in pod_spec(docs)["initContainers"] + [
        containers(docs)["extender"],
        containers(docs)["watcher"],
    ]:
        ref = env_of(container)["DATABASE_URL"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "ks-scheduler-db", "key": "database-url"}
    assert "--leader-elect" in containers(docs)["watcher"]["command"]
    pdb = the(docs, "PodDisruptionBudget", "ks-scheduler")
    assert pdb["spec"]["minAvailable"] < deployment(docs)["spec"]["replicas"]


def test_watcher_knows_its_pod_and_heartbeat(builds):
    watcher = containers(builds["pg"])["watcher"]
    env = env_of(watcher)
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert (
        env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"]
        == "metadata.namespace"
    )
    env_map = the(
        [
            d
            for d in builds["pg"]
            if d["kind"] == "ConfigMap"
            and d["metadata"]["name"].startswith("ks-scheduler-env")
        ],
        "ConfigMap",
        next(
            d["metadata"]["name"]
            for d in builds["pg"]
            if d["metadata"]["name"].startswith("ks-scheduler-env")
        ),
    )
    assert env_map["data"]["KSSCHED_HEARTBEAT_PATH"].startswith("/tmp/")
    assert env_map["data"]["PROMETHEUS_MULTIPROC_DIR"].startswith("/tmp/")
    assert env_map["data"]["DEBUG"] == "false"


def test_network_policy_allows_admin_in_and_only_needed_egress(builds):
    def ports(rules):
        return {p["port"] for rule in rules for p in rule.get("ports", [])}

    for name in ("sqlite", "pg"):
        policy = the(builds[name], "NetworkPolicy", "ks-scheduler")["spec"]
        assert set(policy["policyTypes"]) == {"Ingress", "Egress"}
        assert ports(policy["ingress"]) == {
            8080,
            9100,
        }  # admin + extender metrics, watcher metrics
        expected = {53, 443, 6443} | ({5432} if name == "pg" else set())
        assert ports(policy["egress"]) == expected
        labels = deployment(builds[name])["spec"]["template"]["metadata"]["labels"]
        assert policy["podSelector"]["matchLabels"].items() <= labels.items()


def test_service_exposes_the_admin_port_only(builds):
    docs = builds["sqlite"]
    (service,) = find(docs, "Service")
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}
    ]
    labels = deployment(docs)["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()


def test_rbac_is_the_documented_least_privilege(builds):
    docs = builds["sqlite"]
    subject = {"kind": "ServiceAccount", "name": "ks-scheduler", "namespace": NAMESPACE}
    the(docs, "ServiceAccount", "ks-scheduler")
    bound = {}
    for binding in find(docs, "ClusterRoleBinding") + find(docs, "RoleBinding"):
        assert binding["subjects"] == [subject]
        bound[(binding["roleRef"]["kind"], binding["roleRef"]["name"])] = binding
    assert ("ClusterRole", "system:kube-scheduler") in bound
    assert ("ClusterRole", "system:volume-scheduler") in bound
    rb = bound[("Role", "extension-apiserver-authentication-reader")]
    assert rb["metadata"]["namespace"] == NAMESPACE

    for role in find(docs, "Role") + find(docs, "ClusterRole"):
        assert (role["kind"], role["metadata"]["name"]) in bound, "unbound role"
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], role["metadata"]["name"]

    def leases(role_name):
        role = the(docs, "Role", role_name)
        assert role["metadata"]["namespace"] == NAMESPACE
        return {
            (verb, name)
            for rule in role["rules"]
            for verb in rule["verbs"]
            for name in rule.get("resourceNames", ["*any*"])
            if rule["resources"] == ["leases"]
            and rule["apiGroups"] == ["coordination.k8s.io"]
        }

    lease = yaml.safe_load(BASE_CONFIG.read_text())["leaderElection"]["resourceName"]
    assert leases("ks-scheduler-leader-election") == {
        ("get", lease),
        ("update", lease),
    }
    assert leases("ks-scheduler-watcher-leader-election") == {
        ("create", "*any*"),
        ("get", WATCHER_LEASE),
        ("update", WATCHER_LEASE),
    }
    watcher = the(docs, "ClusterRole", "ks-scheduler-watcher")
    assert watcher["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["pods", "nodes"],
            "verbs": ["get", "list", "watch"],
        },
        # Placement Events on pipeline pods: create only.
        {
            "apiGroups": ["events.k8s.io"],
            "resources": ["events"],
            "verbs": ["create"],
        },
    ]


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_names_namespace_and_images(builds, name):
    docs = builds[name]
    for doc in docs:
        assert doc["metadata"]["name"].startswith("ks-scheduler"), doc["metadata"]
        if doc["kind"] not in {"ClusterRole", "ClusterRoleBinding"}:
            assert doc["metadata"]["namespace"] == NAMESPACE
    images = {c["name"]: c["image"] for c in all_containers(docs)}
    assert re.fullmatch(
        r"registry\.k8s\.io/kube-scheduler:v1\.\d+\.\d+", images.pop("kube-scheduler")
    )
    assert len(set(images.values())) == 1, "one image runs everything else"
    assert all(":" in image for image in images.values())


# --- commands the manifests and the image run -----------------------------------------


def commands_in(docs: list[dict]) -> list[list[str]]:
    found = []
    for container in all_containers(docs):
        if container["name"] == "kube-scheduler":
            continue
        found.append(container["command"])
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            exec_ = container.get(probe, {}).get("exec")
            if exec_:
                found.append(exec_["command"])
    return found


def check_command_exists(command: list[str]) -> None:
    if command[:2] == ["python", "manage.py"]:
        assert (ROOT / "manage.py").is_file()
        name = command[2]
        if importlib.util.find_spec(f"django.core.management.commands.{name}"):
            return
        path = ROOT / "history" / "management" / "commands" / f"{name}.py"
        assert path.is_file(), f"management command {name} is missing ({path})"
    elif command[:2] == ["python", "-m"]:
        module = command[2]
        assert (ROOT / (module.replace(".", "/") + ".py")).is_file(), module
    elif command[0] == "gunicorn":
        config = command[command.index("-c") + 1]
        assert (ROOT / config).is_file(), f"{config} is missing"
        module = command[-1].split(":")[0]
        assert (ROOT / (module.replace(".", "/") + ".py")).is_file(), module
    else:
        pytest.fail(f"unexpected command {command}")


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_manifest_commands_exist_in_the_project(builds, name):
    commands = commands_in(builds[name])
    assert ["python", "manage.py", "migrate", "--noinput"] in commands
    for command in commands:
        check_command_exists(command)


def test_command_check_rejects_a_missing_command():
    with pytest.raises(AssertionError):
        check_command_exists(["python", "manage.py", "no_such_command_here"])


# --- Dockerfile -----------------------------------------------------------------------


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined."""
    joined = re.sub(r"\\\n", " ", text)
    result = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            result.append((word.upper(), rest.strip()))
    return result


def dockerfile_problems(text: str) -> list[str]:
    problems = []
    instructions = dockerfile_instructions(text)
    args = {}
    stages = set()
    for word, rest in instructions:
        if word == "ARG" and "=" in rest:
            key, _, value = rest.partition("=")
            args[key] = value
        if word == "ARG" and SECRET_NAME_RE.search(rest.partition("=")[0]):
            problems.append(f"secret build argument: {rest}")
        if word == "ENV":
            for key in re.findall(r"(\w+)=", rest):
                if SECRET_NAME_RE.search(key):
                    problems.append(f"secret in ENV: {key}")
        if word == "FROM":
            parts = rest.split()
            image = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), ""), parts[0])
            if len(parts) == 3 and parts[1].upper() == "AS":
                stages.add(parts[2])
            if image in stages:
                continue
            pinned = "@sha256:" in image or re.search(r":\d+\.\d+\.\d+[\w.-]*$", image)
            if not pinned:
                problems.append(f"unpinned base image: {image or parts[0]}")
            if not image.startswith("python:") or "slim" not in image:
                problems.append(f"not a slim Python base: {image}")
    if len([w for w, _ in instructions if w == "FROM"]) < 2:
        problems.append("not multi-stage")
    users = [rest for word, rest in instructions if word == "USER"]
    if not users or users[-1].split(":")[0] in {"root", "0"}:
        problems.append("runs as root")
    if not any(w == "RUN" and "collectstatic" in r for w, r in instructions):
        problems.append("static files are not collected at build time")
    if not any(w in {"CMD", "ENTRYPOINT"} for w, _ in instructions):
        problems.append("no CMD or ENTRYPOINT")
    return problems


def dockerfile_command(text: str) -> list[str]:
    (cmd,) = [rest for word, rest in dockerfile_instructions(text) if word == "CMD"]
    return json.loads(cmd)


def test_dockerfile_is_pinned_non_root_and_secret_free():
    text = DOCKERFILE.read_text()
    assert dockerfile_problems(text) == []
    users = [r for w, r in dockerfile_instructions(text) if w == "USER"]
    assert users[-1].split(":")[0] == "10001"
    # The build-time SECRET_KEY is set for the collectstatic command only.
    for word, rest in dockerfile_instructions(text):
        if "SECRET_KEY" in rest:
            assert word == "RUN" and "collectstatic" in rest


def test_dockerfile_checks_catch_a_bad_dockerfile():
    bad = 'FROM python:3.11-slim\nENV SECRET_KEY=abc\nCMD ["gunicorn"]\n'
    problems = dockerfile_problems(bad)
    assert any("unpinned" in p for p in problems)
    assert any("SECRET_KEY" in p for p in problems)
    assert "runs as root" in problems
    assert "not multi-stage" in problems


def test_dockerfile_command_matches_the_extender_container(builds):
    command = dockerfile_command(DOCKERFILE.read_text())
    check_command_exists(command)
    assert containers(builds["sqlite"])["extender"]["command"] == command


def test_dockerignore_keeps_secrets_and_local_state_out():
    patterns = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv", ".env", "*.db"} <= patterns
    for needed in ("manage.py", "requirements.txt", "kssched", "history", "extender"):
        assert needed not in patterns


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_every_setting_in_the_manifests_is_valid_and_known(builds, name):
    """The settings the manifests give each container all parse (a bad one would stop
    the pod) and are all settings (none would be warned about as unknown)."""
    docs = builds[name]
    shared = {}
    for config_map in find(docs, "ConfigMap"):
        if config_map["metadata"]["name"].startswith("ks-scheduler-env"):
            shared.update(config_map["data"])
    assert shared["KSSCHED_WATCHER_METRICS_BIND"] == "0.0.0.0:9100"
    for container in all_containers(docs):
        if container["name"] == "kube-scheduler":
            continue
        literal = {
            e["name"]: e["value"] for e in container.get("env", []) if "value" in e
        }
        environ = {**shared, **literal, "SECRET_KEY": "from-the-secret"}
        variables.read(environ)
        assert variables.unknown(environ) == [], container["name"]
