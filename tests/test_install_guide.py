"""The cluster install as printed: its images and every command that needs no cluster.

`kubectl` lines of the install guide are sorted by what they do. Those that need no
cluster run, in a fresh checkout beside which the guide's own kustomizations are
written (`# DIR/kustomization.yaml` blocks), as the guide lays them out:

Every command runs in the checkout, whose folder is not called ks-scheduler:

- `make overlay ...` and `deploy/render.sh ...` run as printed;
- `kubectl create secret generic ...` runs as printed plus `--dry-run=client -o yaml`;
- `kubectl kustomize DIR` runs as printed; `apply -k`/`delete -k DIR` build DIR;
  `apply -f`/`delete -f FILE` read the file render.sh wrote;
- `kubectl -n NS exec deploy/ks-scheduler -c C -- python manage.py createsuperuser ...`
  runs in the checkout with container C's environment from the Deployment built into
  NS, its Secret references filled from the Secrets made in NS (a pod reads Secrets of
  its own namespace only).

The rest need a cluster and are named in `NEEDS_CLUSTER`; a line that is neither
fails the test, so a new command gets a decision.
"""

import base64
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO
from tests.test_deploy import kubectl_or_skip, kustomize
from tests.test_readme import clean_env, make_checkout, run, shell_blocks

pytestmark = pytest.mark.slow

# The install path: its own page.
GUIDE = REPO / "docs" / "install.md"

CUSTOM = "registry.example.com:5000/team/ks-scheduler:9.8.7"
CUSTOM_SCHEDULER = "registry.example.com/mirror/kube-scheduler:v1.30.9"
BUILDS = {
    "sqlite": "overlays/sqlite",
    "postgres": "overlays/postgres",
    "webhook": "overlays/webhook",
    "legacy/v1beta3": "legacy/v1beta3",
    "legacy/policy": "legacy/policy",
}
# kubectl verbs (after the options) that talk to a running cluster.
NEEDS_CLUSTER = {
    "port-forward",
    "get",
    "rollout",
    "logs",
    "scale",
    "run",
    "cp",
    "patch",
    "create secret tls",  # needs your certificate files
    "delete pod",
    "exec",  # except createsuperuser, run below
}


def guide_text() -> str:
    return GUIDE.read_text()


def guide_kustomizations(text: str) -> dict[str, str]:
    """The guide's YAML blocks that start with `# DIR/kustomization.yaml`."""
    found = {}
    for block in re.findall(r"^( *)```yaml\n(.*?)^ *```", text, re.M | re.S):
        indent, body = block
        lines = [line[len(indent) :] for line in body.splitlines()]
        match = re.match(r"# ([\w.-]+)/kustomization\.yaml", lines[0] if lines else "")
        if match:
            found[match.group(1)] = "\n".join(lines) + "\n"
    return found


def images_in(node) -> set[str]:
    """Every value of an `image` key anywhere in a manifest."""
    if isinstance(node, dict):
        found = {node["image"]} if isinstance(node.get("image"), str) else set()
        for value in node.values():
            found |= images_in(value)
        return found
    if isinstance(node, list):
        return set().union(*(images_in(item) for item in node)) if node else set()
    return set()


def kubectl_verb(line: str) -> str:
    """`kubectl -n ns create secret generic x` -> "create secret generic"."""
    words = line.split()[1:]
    while words and words[0].startswith("-"):
        words = words[2:] if words[0] in ("-n", "--namespace") else words[1:]
    return " ".join(words[:3])


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_every_build_takes_the_custom_images_and_no_other(tmp_path, name):
    kubectl_or_skip()
    (tmp_path / "ks-scheduler").symlink_to(REPO)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "kustomization.yaml").write_text(
        f"resources:\n  - ../ks-scheduler/deploy/{BUILDS[name]}\n"
        "images:\n"
        "  - name: ks-scheduler\n"
        "    newName: registry.example.com:5000/team/ks-scheduler\n"
        '    newTag: "9.8.7"\n'
        "  - name: registry.k8s.io/kube-scheduler\n"
        "    newName: registry.example.com/mirror/kube-scheduler\n"
        "    newTag: v1.30.9\n"
    )
    built = images_in(kustomize(tmp_path / "mine"))
    rendered = subprocess.run(
        [
            REPO / "deploy" / "render.sh",
            *("--overlay", name, "--image", CUSTOM),
            *("--kube-scheduler", CUSTOM_SCHEDULER),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert rendered.returncode == 0, rendered.stderr
    one_file = images_in(list(yaml.safe_load_all(rendered.stdout)))
    expected = {CUSTOM} if name == "webhook" else {CUSTOM, CUSTOM_SCHEDULER}
    assert built == expected
    assert one_file == expected
    # render.sh leaves nothing behind in deploy/.
    assert not list((REPO / "deploy").glob(".render.*"))


def test_render_refuses_an_image_without_a_tag():
    result = subprocess.run(
        [REPO / "deploy" / "render.sh", "--image", "registry.example.com/ks"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "has no tag" in result.stderr


def test_the_guide_sets_no_image_by_editing_manifests():
    text = guide_text()
    assert "image:` lines" not in text
    assert "make overlay DIR=" in text  # writes the kustomization with the images


def secret_env(
    container: dict,
    secrets: dict[tuple[str | None, str], dict[str, str]],
    namespace: str | None,
) -> dict[str, str]:
    """The container's variables that come from Secrets, as the kubelet fills them:
    from Secrets in the pod's own namespace only."""
    env = {}
    for item in container.get("env", []):
        ref = item.get("valueFrom", {}).get("secretKeyRef")
        if not ref:
            continue
        value = secrets.get((namespace, ref["name"]), {}).get(ref["key"])
        if value is None:
            assert ref.get("optional"), (
                f"{ref} is missing in namespace {namespace} and not optional"
            )
            continue
        env[item["name"]] = value
    return env


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """A checkout whose folder is not called ks-scheduler: the guide's commands may not
    depend on the name."""
    return make_checkout(tmp_path_factory.mktemp("install") / "my-clone-2")


def kubectl_namespace(words: list[str]) -> str | None:
    for flag in ("-n", "--namespace"):
        if flag in words:
            return words[words.index(flag) + 1]
    return None


def test_install_commands_run_as_printed(clone):
    kubectl_or_skip()
    workspace = clone.parent  # the guide's layout: kustomizations beside the clone
    text = guide_text()
    for directory, body in guide_kustomizations(text).items():
        (workspace / directory).mkdir(exist_ok=True)
        (workspace / directory / "kustomization.yaml").write_text(body)
    env = clean_env(clone)
    # (namespace, name) -> the Secret's keys and values.
    secrets: dict[tuple[str | None, str], dict[str, str]] = {}
    built: dict[str, list[dict]] = {}
    done, skipped = [], []
    for block in shell_blocks(text):
        for line in block:
            if line.startswith("#"):
                continue
            if line.startswith(("deploy/render.sh", "make overlay")):
                result = run(clone, env, [], line)
                assert result.returncode == 0, f"{line}\n{result.stderr}"
                done.append(line)
                continue
            if not line.startswith("kubectl"):
                continue
            verb = kubectl_verb(line)
            words = line.split("#")[0].split()
            namespace = kubectl_namespace(words)
            if verb.startswith("create secret generic"):
                result = run(clone, env, [], f"{line} --dry-run=client -o yaml")
                assert result.returncode == 0, f"{line}\n{result.stderr}"
                secret = yaml.safe_load(result.stdout)
                secrets[namespace, secret["metadata"]["name"]] = {
                    key: base64.b64decode(value).decode()
                    for key, value in secret["data"].items()
                }
            elif verb.startswith("kustomize"):
                result = run(clone, env, [], line)
                assert result.returncode == 0, f"{line}\n{result.stderr}"
                built[words[-1]] = list(yaml.safe_load_all(result.stdout))
            elif verb.startswith(("apply -k", "delete -k")):
                directory = words[words.index("-k") + 1]
                built[directory] = kustomize(clone / directory)
            elif verb.startswith(("apply -f", "delete -f")):
                path = clone / words[words.index("-f") + 1]
                assert path.is_file(), f"{line}: the guide never writes {path.name}"
                assert [d for d in yaml.safe_load_all(path.read_text()) if d]
            elif verb.startswith("exec") and "manage.py createsuperuser" in line:
                # The Deployment the command names, where the guide built it.
                deployment = next(
                    doc
                    for docs in built.values()
                    for doc in docs
                    if doc
                    and doc["kind"] == "Deployment"
                    and doc["metadata"].get("namespace") == namespace
                )
                container_name = words[words.index("-c") + 1]
                (container,) = [
                    c
                    for c in deployment["spec"]["template"]["spec"]["containers"]
                    if c["name"] == container_name
                ]
                command = line.split(" -- ", 1)[1]
                assert command.startswith("python ")
                filled = secret_env(container, secrets, namespace)
                # A fresh database per install: the admin user is made once in each.
                fresh = {**env, "DATA_PATH": str(workspace / f"{namespace}.db")}
                migrated = run(
                    clone, {**fresh, **filled}, [], ".venv/bin/python manage.py migrate"
                )
                assert migrated.returncode == 0, migrated.stderr
                result = run(clone, {**fresh, **filled}, [], ".venv/bin/" + command)
                assert result.returncode == 0, f"{line}\n{result.stderr}"
                assert "Superuser created successfully" in result.stdout
                check_admin_login(clone, fresh, secrets[namespace, "ks-scheduler"])
            elif any(verb.startswith(v) for v in NEEDS_CLUSTER):
                skipped.append(line)
                continue
            else:
                pytest.fail(f"no decision for the guide's command: {line}")
            done.append(line)
    # The path as printed: the Secret, the build, the admin user.
    assert any("create secret generic ks-scheduler" in line for line in done)
    assert any("createsuperuser" in line for line in done)
    assert any("render.sh" in line for line in done)
    installs = {"../my-ks-scheduler", "../my-ks-webhook", "../ksphere-install"}
    assert installs <= set(built)
    assert skipped  # the cluster-only commands were seen, not silently dropped
    # Every build's pod finds the Secrets it reads in its own namespace.
    for docs in built.values():
        for doc in docs:
            if doc and doc["kind"] == "Deployment":
                spec = doc["spec"]["template"]["spec"]
                namespace = doc["metadata"].get("namespace")
                for container in spec.get("initContainers", []) + spec["containers"]:
                    secret_env(container, secrets, namespace)
    # The kustomizations the guide has you write name the overlay by its real path.
    made = (workspace / "my-ks-scheduler" / "kustomization.yaml").read_text()
    assert "../my-clone-2/deploy/overlays/sqlite" in made
    assert images_in(built["../my-ks-scheduler"]) == {
        "registry.example.com/ks-scheduler:1.0.0",
        "registry.k8s.io/kube-scheduler:v1.31.4",
    }
    assert images_in(built["../my-ks-webhook"]) == {
        "registry.example.com/ks-scheduler:1.0.0"
    }


def check_admin_login(root: Path, env: dict, secret: dict[str, str]) -> None:
    """The admin user made from the Secret logs in with the Secret's password."""
    code = (
        "from django.contrib.auth.models import User; "
        f"u = User.objects.get(username={secret['admin-username']!r}); "
        f"print(u.is_superuser and u.check_password({secret['admin-password']!r}))"
    )
    result = run(
        root, env, [], f'.venv/bin/python manage.py shell --no-imports -c "{code}"'
    )
    assert result.stdout.strip() == "True", result.stderr
