"""Every `manage.py` line in the shell blocks of the README and the docs/ pages runs as
printed, in a fresh checkout, after the steps of `make run`, with no other environment;
the docs site builds strictly and the README's links resolve.

The checkout is a copy of the files git knows (tracked and new, never ignored ones such
as `.env`, `var/` or `.venv`), with `.venv` linked to the virtualenv running the tests.
`make run` would then install (already done), write `.env` and migrate, and serve; the
test does the first two steps exactly as `make run` does them and skips serving.
Commands that need a cluster run against the test API server (tests/fakeapi/), given as
KUBECONFIG. Lines that start with `kubectl` run inside the image and are not run here.
One placeholder is replaced: the PostgreSQL URL of the migration steps becomes a SQLite
URL inside the checkout.
"""

import os
import pty
import re
import select
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fakeapi import FakeApiServer, make_node, make_pod, write_kubeconfig
from tests.helpers import REPO, free_port

pytestmark = pytest.mark.slow

POSTGRES_PLACEHOLDER = "postgres://ks:PASSWORD@db.example:5432/ks_scheduler"
ADMIN_PASSWORD = "a-long-readme-pass-42"
# How each interactive or long-running command is driven; the rest run to completion.
INTERACTIVE = {
    "createsuperuser": [
        # Not the non-interactive line's "admin": both lines run in one checkout.
        ("Username", "alice"),
        ("Email address", "admin@example.com"),
        ("Password:", ADMIN_PASSWORD),
        ("Password (again)", ADMIN_PASSWORD),
    ]
}
NEEDS_CLUSTER = {"watch_pods"}


def shell_blocks(text: str) -> list[list[str]]:
    """The README's ```sh blocks as lists of logical lines (continuations joined)."""
    blocks = []
    for body in re.findall(r"^ *```sh\n(.*?)^ *```", text, re.S | re.M):
        lines, current = [], ""
        for raw in body.splitlines():
            line = raw.strip()
            if line.endswith("\\"):
                current += line[:-1] + " "
                continue
            lines.append(current + line)
            current = ""
        blocks.append([line for line in lines if line])
    return blocks


def manage_commands(text: str) -> list[tuple[list[str], str]]:
    """(export lines before it in its block, line) for every checkout manage.py line."""
    commands = []
    for block in shell_blocks(text):
        exports = []
        for line in block:
            if line.startswith("export "):
                exports.append(line)
            elif "manage.py" in line and not line.startswith("kubectl"):
                commands.append((list(exports), line))
    return commands


def subcommand(line: str) -> str:
    return line.split("manage.py", 1)[1].split()[0]


def clean_env(root: Path) -> dict[str, str]:
    """What a new shell has: a PATH and a HOME, nothing of ks-scheduler's."""
    home = root.parent / "home"
    home.mkdir(exist_ok=True)
    return {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8"}


def script(exports: list[str], line: str) -> str:
    text = "\n".join([*exports, line])
    return text.replace(POSTGRES_PLACEHOLDER, "sqlite:///var/loaded.db")


def run(root: Path, env: dict, exports: list[str], line: str, timeout: float = 120):
    return subprocess.run(
        ["bash", "-c", script(exports, line)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_interactive(root: Path, env: dict, line: str, answers, timeout: float = 60):
    """Run `line` on a terminal of its own, answering each prompt.

    Returns (exit status, output)."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: its terminal is the pty, as in a shell
        os.chdir(root)
        os.execvpe("bash", ["bash", "-c", line], env)
    output, pending = b"", list(answers)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            output += chunk
            if pending and pending[0][0].encode() in output.rsplit(b"\n", 1)[-1]:
                os.write(fd, pending.pop(0)[1].encode() + b"\n")
    else:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status), output.decode(errors="replace")


def placements(root: Path) -> int:
    with sqlite3.connect(root / "var" / "scheduler.db") as db:
        return db.execute("SELECT count(*) FROM history_placement").fetchone()[0]


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """A fresh checkout after `make run`'s set-up steps: .env written, migrated."""
    return make_checkout(tmp_path_factory.mktemp("clone") / "ks-scheduler")


def make_checkout(root: Path) -> Path:
    """Copy the repository's files to `root`, then `make run`'s set-up steps."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (item.decode() for item in listed)):
        source = REPO / name
        if source.is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, root / name)
    (root / ".venv").symlink_to(Path(sys.prefix))
    env = clean_env(root)
    # `make run`, after installing: the .env line, then migrate.
    made = subprocess.run(
        ["make", "--no-print-directory", "-s", ".env"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    migrated = run(root, env, [], ".venv/bin/python manage.py migrate --noinput")
    assert migrated.returncode == 0, migrated.stderr
    return root


@pytest.fixture
def cluster():
    """The test API server with a few nodes and pipeline pods already placed."""
    with FakeApiServer(bookmark_interval=0.5) as server:
        for number in range(1, 4):
            server.add_node(make_node(f"worker-{number}"))
        for number in range(6):
            node = f"worker-{number % 3 + 1}"
            label = ("jenkins-java-maven", "gitlab-go-build")[number % 2]
            server.add_pod(make_pod(f"build-{number}", label=label, node=node))
        yield server


def documentation(root: Path) -> str:
    """The README and every docs/ page, one after another."""
    pages = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    return "\n".join(page.read_text() for page in pages)


def test_readme_manage_commands_run_as_printed(checkout, cluster):
    commands = manage_commands(documentation(checkout))
    names = [subcommand(line) for _, line in commands]
    # The README's commands as of writing; a new one is run too (and listed here).
    assert {"createsuperuser", "watch_pods", "watcher_health", "audit_counts"} <= set(
        names
    ), names
    env = clean_env(checkout)
    ran = []
    order = {"createsuperuser": 0, "watch_pods": 1}
    first = sorted(commands, key=lambda c: order.get(subcommand(c[1]), 2))
    for exports, line in first:
        name = subcommand(line)
        if name in INTERACTIVE and "--noinput" not in line:
            code, output = run_interactive(checkout, env, line, INTERACTIVE[name])
            assert code == 0, f"{line}\n{output}"
            assert "Superuser created successfully" in output
        elif name in NEEDS_CLUSTER:
            kubeconfig = write_kubeconfig(checkout.parent, cluster.url)
            watcher = subprocess.Popen(
                ["bash", "-c", f"exec {script(exports, line)}"],
                cwd=checkout,
                env={**env, "KUBECONFIG": str(kubeconfig)},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            deadline = time.monotonic() + 60
            while placements(checkout) < 6 and time.monotonic() < deadline:
                assert watcher.poll() is None, watcher.stdout.read().decode()
                time.sleep(0.2)
            assert placements(checkout) == 6
            # "in another shell", while the watcher runs
            health = [c for c in commands if subcommand(c[1]) == "watcher_health"]
            for health_exports, health_line in health:
                result = run(checkout, env, health_exports, health_line)
                assert result.returncode == 0, result.stderr
                assert result.stdout.startswith("ok: heartbeat")
                ran.append(health_line)
            watcher.send_signal(signal.SIGINT)
            assert watcher.wait(timeout=30) == 0, watcher.stdout.read().decode()
        elif line not in ran:
            if name == "loaddata":
                # Step 2 of the migration makes this file inside the pod.
                dumped = run(
                    checkout,
                    env,
                    [],
                    ".venv/bin/python manage.py dumpdata --natural-foreign "
                    "--natural-primary --exclude contenttypes --exclude "
                    "auth.permission --exclude admin.logentry --exclude sessions "
                    "-o ks-scheduler.json",
                )
                assert dumped.returncode == 0, dumped.stderr
            result = run(checkout, env, exports, line)
            assert result.returncode == 0, f"{line}\n{result.stdout}{result.stderr}"
            if "createsuperuser" in line:
                assert "Superuser created successfully" in result.stdout
            if name == "drf_create_token":
                assert re.search(r"[0-9a-f]{40}", result.stdout)
        ran.append(line)
    assert sorted(set(ran)) == sorted({line for _, line in commands})
    # The history stayed inside the checkout, where .env put it.
    assert placements(checkout) == 6
    assert (checkout / "var" / "watcher" / "heartbeat").is_file()
    assert not any(Path(env["HOME"]).iterdir())


def test_checkout_settings_come_from_dot_env(checkout):
    env = clean_env(checkout)
    code = (
        "from django.conf import settings as s; print(s.DATABASES['default']['NAME'])"
    )
    line = f'.venv/bin/python manage.py shell --no-imports -c "{code}"'
    result = run(checkout, env, [], line)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(checkout / "var" / "scheduler.db")
    # Real environment variables win over the file.
    other = checkout / "var" / "other.db"
    result = run(checkout, {**env, "DATA_PATH": str(other)}, [], line)
    assert result.stdout.strip() == str(other)
    # KSSCHED_READ_DOT_ENV=0 turns the file off: no secret key then.
    result = run(checkout, {**env, "KSSCHED_READ_DOT_ENV": "0"}, [], line)
    assert result.returncode != 0
    assert "SECRET_KEY" in result.stderr


@pytest.mark.skipif(Path("/data").exists(), reason="/data exists on this machine")
def test_unset_data_path_creates_no_folder_outside_the_checkout(checkout):
    env = {**clean_env(checkout), "KSSCHED_READ_DOT_ENV": "0", "SECRET_KEY": "x" * 50}
    result = run(checkout, env, [], ".venv/bin/python manage.py migrate --noinput")
    assert result.returncode != 0
    assert (
        "DATA_PATH='' is not valid: required when /data does not exist" in result.stderr
    )
    assert not Path("/data").exists()


@pytest.mark.parametrize("variable", ["KSSCHED_BIND", "KSSCHED_EXTENDER_BIND"])
def test_make_run_names_the_variable_when_a_port_is_taken(checkout, variable):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        address = f"127.0.0.1:{port}"
        # The other listener on a free port: its default may be taken on this machine.
        (other,) = {"KSSCHED_BIND", "KSSCHED_EXTENDER_BIND"} - {variable}
        free = f"127.0.0.1:{free_port()}"
        started = time.monotonic()
        # -o: the virtualenv is the one running the tests; never reinstall into it.
        result = subprocess.run(
            ["make", "-o", ".venv/.installed", "run", f"{variable}={address}"]
            + [f"{other}={free}"],
            cwd=checkout,
            env=clean_env(checkout),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode != 0
    assert f"{address} is in use" in result.stderr
    assert f"set {variable} to a free address" in result.stderr
    assert "Connection in use" not in result.stdout + result.stderr
    # A free alternative, checked free (tools/port_check.py).
    suggested = re.search(rf"make run {variable}=127\.0\.0\.1:(\d+)", result.stderr)
    assert suggested and int(suggested.group(1)) != port
    assert time.monotonic() - started < 10


def test_docs_site_builds_strictly_and_a_broken_anchor_fails_it(tmp_path):
    # Not --quiet: it hides the warnings that strict mode counts.
    mkdocs = [sys.executable, "-m", "mkdocs", "build", "--strict"]
    built = subprocess.run(
        [*mkdocs, "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert built.returncode == 0, built.stderr
    assert (tmp_path / "site" / "install" / "index.html").is_file()
    # The same site with one link to a missing anchor does not build.
    copy = tmp_path / "copy"
    shutil.copytree(REPO / "docs", copy / "docs")
    shutil.copy2(REPO / "mkdocs.yml", copy / "mkdocs.yml")
    index = copy / "docs" / "index.md"
    index.write_text(index.read_text() + "\n[Gone](operate.md#no-such-part)\n")
    broken = subprocess.run(
        [*mkdocs, "--site-dir", str(tmp_path / "broken")],
        cwd=copy,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert broken.returncode != 0
    assert "no-such-part" in broken.stderr


def heading_anchors(text: str) -> set[str]:
    """The anchors of a page's headings, as the site and GitHub make them."""
    text = re.sub(r"^ *```.*?^ *```", "", text, flags=re.S | re.M)
    anchors = set()
    for title in re.findall(r"^#{1,6} (.+)$", text, re.M):
        slug = re.sub(r"[^\w\s-]", "", title).strip().lower()
        anchors.add(re.sub(r"[-\s]+", "-", slug))
    return anchors


def test_readme_links_reach_a_file_and_its_heading():
    readme = (REPO / "README.md").read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", readme)
    local = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert any(link.startswith("docs/") for link in local)
    for link in local:
        path, _, anchor = link.partition("#")
        target = REPO / path if path else REPO / "README.md"
        assert target.is_file(), link
        if anchor:
            assert anchor in heading_anchors(target.read_text()), link


def test_readme_is_a_front_page():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 250
    text = "\n".join(lines[:45])
    # The first screen: both commands, the ports to move, the demo, both logins.
    for words in (
        "make run",
        "make test",
        "KSSCHED_BIND",
        "KSSCHED_EXTENDER_BIND",
        "make demo",
        "createsuperuser --noinput",
    ):
        assert words in text, words
