"""Offline checks of deploy/overlays/webhook: webhook mode, no second scheduler.

Kubernetes objects are validated against kubernetes-validate's schemas (strict), as
in test_deploy.py. kubernetes-validate has no schemas for cert-manager's CRDs, so the
Issuer and Certificate are checked against the fields of cert-manager.io/v1 they
use, strictly (an unknown or misspelt field fails).
"""

import re

import environ
import jsonschema
import kubernetes_validate
import pytest
from django.conf import settings
from django.urls import resolve

from extender.webhook import WebhookMutateView
from tests.test_deploy import (
    DEPLOY,
    NAMESPACE,
    ROOT,
    SCHEMA_VERSIONS,
    all_containers,
    check_command_exists,
    commands_in,
    containers,
    deployment,
    env_of,
    find,
    kustomize,
    pod_spec,
    the,
)

WEBHOOK = DEPLOY / "overlays" / "webhook"
CERT_MANAGER = "cert-manager.io/v1"

_STRICT = {"type": "object", "additionalProperties": False}
_METADATA = {
    **_STRICT,
    "required": ["name", "namespace"],
    "properties": {
        "name": {"type": "string"},
        "namespace": {"type": "string"},
        "labels": {"type": "object"},
        "annotations": {"type": "object"},
    },
}
# The fields of cert-manager.io/v1 Issuer and Certificate used by the overlay, from
# cert-manager's API reference (https://cert-manager.io/docs/reference/api-docs/).
CERT_MANAGER_SCHEMAS = {
    "Issuer": {
        **_STRICT,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": CERT_MANAGER},
            "kind": {"const": "Issuer"},
            "metadata": _METADATA,
            "spec": {
                **_STRICT,
                "properties": {"selfSigned": {**_STRICT, "properties": {}}},
                "minProperties": 1,
            },
        },
    },
    "Certificate": {
        **_STRICT,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": CERT_MANAGER},
            "kind": {"const": "Certificate"},
            "metadata": _METADATA,
            "spec": {
                **_STRICT,
                "required": ["secretName", "issuerRef"],
                "properties": {
                    "secretName": {"type": "string"},
                    "dnsNames": {"type": "array", "items": {"type": "string"}},
                    "issuerRef": {
                        **_STRICT,
                        "required": ["name"],
                        "properties": {
                            "name": {"type": "string"},
                            "kind": {"enum": ["Issuer", "ClusterIssuer"]},
                            "group": {"type": "string"},
                        },
                    },
                    "duration": {"type": "string", "pattern": r"^\d+h$"},
                    "renewBefore": {"type": "string", "pattern": r"^\d+h$"},
                    "privateKey": {
                        **_STRICT,
                        "properties": {
                            "algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]},
                            "size": {"type": "integer"},
                            "encoding": {"enum": ["PKCS1", "PKCS8"]},
                            "rotationPolicy": {"enum": ["Never", "Always"]},
                        },
                    },
                    "usages": {
                        "type": "array",
                        "items": {
                            "enum": [
                                "digital signature",
                                "key encipherment",
                                "server auth",
                                "client auth",
                            ]
                        },
                    },
                },
            },
        },
    },
}


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    return kustomize(WEBHOOK)


def webhook_configuration(docs) -> dict:
    return the(docs, "MutatingWebhookConfiguration", "ks-scheduler")


def env_config(docs) -> dict[str, str]:
    (config_map,) = [
        d
        for d in find(docs, "ConfigMap")
        if d["metadata"]["name"].startswith("ks-scheduler-env")
    ]
    return config_map["data"]


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_webhook_build_validates_against_the_schemas(docs, version):
    for doc in docs:
        if doc["apiVersion"] == CERT_MANAGER:
            jsonschema.validate(doc, CERT_MANAGER_SCHEMAS[doc["kind"]])
        else:
            kubernetes_validate.validate(doc, version, strict=True)
    assert {d["kind"] for d in docs} >= {
        "MutatingWebhookConfiguration",
        "Certificate",
        "Issuer",
        "Deployment",
        "Service",
    }


def test_cert_manager_check_rejects_a_misspelt_field(docs):
    certificate = the(docs, "Certificate", "ks-scheduler-webhook")
    wrong = {**certificate, "spec": {**certificate["spec"], "dnsName": ["x"]}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(wrong, CERT_MANAGER_SCHEMAS["Certificate"])


def test_no_second_scheduler_runs(docs):
    assert set(containers(docs)) == {"extender", "watcher"}
    assert "config" not in {v["name"] for v in pod_spec(docs)["volumes"]}
    assert not [d for d in find(docs, "ConfigMap") if "ks-scheduler-config" in str(d)]
    roles = {
        b["roleRef"]["name"]
        for b in find(docs, "ClusterRoleBinding") + find(docs, "RoleBinding")
    }
    assert roles == {"ks-scheduler-watcher", "ks-scheduler-watcher-leader-election"}
    assert deployment(docs)["spec"]["replicas"] == 1


def test_mutating_webhook_never_blocks_and_skips_system_namespaces(docs):
    (hook,) = webhook_configuration(docs)["webhooks"]
    assert hook["failurePolicy"] == "Ignore"
    assert hook["sideEffects"] == "None"
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["timeoutSeconds"] in (2, 3)
    assert hook["reinvocationPolicy"] == "Never"
    assert hook["rules"] == [
        {
            "operations": ["CREATE"],
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    label = env_config(docs)["KSSCHED_PIPELINE_LABEL"]
    assert hook["objectSelector"] == {
        "matchExpressions": [{"key": label, "operator": "Exists"}]
    }
    (rule,) = hook["namespaceSelector"]["matchExpressions"]
    assert rule["key"] == "kubernetes.io/metadata.name"
    assert rule["operator"] == "NotIn"
    own = deployment(docs)["metadata"]["namespace"]
    assert {"kube-system", own} <= set(rule["values"])
    assert "caBundle" not in hook["clientConfig"], "cert-manager injects it"


def test_webhook_reaches_the_mutate_view_over_tls(docs):
    configuration = webhook_configuration(docs)
    (hook,) = configuration["webhooks"]
    target = hook["clientConfig"]["service"]
    assert resolve(target["path"]).func.view_class is WebhookMutateView
    service = the(docs, "Service", target["name"])
    assert service["metadata"]["namespace"] == target["namespace"]
    (port,) = service["spec"]["ports"]
    assert port["port"] == target["port"] == 443
    extender = containers(docs)["extender"]
    assert port["targetPort"] in {p["name"] for p in extender["ports"]}
    labels = deployment(docs)["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()

    # cert-manager: the injected CA is the Certificate's, whose names are the
    # Service's, and whose Secret the web listener serves.
    namespace, name = configuration["metadata"]["annotations"][
        "cert-manager.io/inject-ca-from"
    ].split("/")
    certificate = the(docs, "Certificate", name)
    assert certificate["metadata"]["namespace"] == namespace
    assert (
        f"{target['name']}.{target['namespace']}.svc" in certificate["spec"]["dnsNames"]
    )
    issuer = certificate["spec"]["issuerRef"]
    assert the(docs, issuer["kind"], issuer["name"])["metadata"]["namespace"] == (
        namespace
    )
    volumes = {v["name"]: v for v in pod_spec(docs)["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in extender["volumeMounts"]}
    (tls_volume,) = [
        name
        for name, volume in volumes.items()
        if volume.get("secret", {}).get("secretName")
        == certificate["spec"]["secretName"]
    ]
    env = env_of(extender)
    for variable in ("KSSCHED_TLS_CERT_FILE", "KSSCHED_TLS_KEY_FILE"):
        assert env[variable]["value"].startswith(mounts[tls_volume] + "/")
    assert "KSSCHED_TLS_CA_FILE" not in env, "the API server sends no client cert"
    service_host = f"{target['name']}.{target['namespace']}.svc"
    assert service_host in env["ALLOWED_HOSTS"]["value"].split(",")
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert extender[probe]["httpGet"]["scheme"] == "HTTPS", probe


def test_env_references_are_defined_before_use(docs):
    """Kubernetes expands $(VAR) only for variables listed earlier."""
    for container in all_containers(docs):
        defined: set[str] = set()
        for item in container.get("env", []):
            for name in re.findall(r"\$\((\w+)\)", item.get("value", "")):
                assert name in defined, (container["name"], item["name"], name)
            defined.add(item["name"])


def test_the_watcher_counts_pods_of_every_scheduler(docs):
    config = env_config(docs)
    assert environ.Env.parse_value(config["KSSCHED_WATCH_ANY_SCHEDULER"], bool)
    watcher = containers(docs)["watcher"]
    assert watcher["envFrom"][0]["configMapRef"]["name"].startswith("ks-scheduler-env")


def test_webhook_settings_are_real_settings_and_documented(docs):
    readme = (ROOT / "docs" / "settings.md").read_text()
    config = env_config(docs)
    for name in (
        "KSSCHED_WATCH_ANY_SCHEDULER",
        "KSSCHED_WEBHOOK_MAX_NODES",
        "KSSCHED_WEBHOOK_MEMORY_SECONDS",
        "KSSCHED_WEBHOOK_POOL_DAYS",
    ):
        assert name in config
        assert hasattr(settings, name), name
        assert f"`{name}`" in readme, f"{name} is missing from docs/settings.md"


def test_webhook_manifest_commands_exist(docs):
    for command in commands_in(docs):
        check_command_exists(command)
    for doc in docs:
        assert doc["metadata"]["name"].startswith(("ks-scheduler", "warm-nodes"))
        if doc["kind"] not in {
            "ClusterRole",
            "ClusterRoleBinding",
            "MutatingWebhookConfiguration",
        }:
            assert doc["metadata"]["namespace"] == NAMESPACE
