"""What the extender middleware (loopback rule + metrics) costs on prioritize.

    python -m tools.bench.metrics_overhead                      # in-process metrics
    PROMETHEUS_MULTIPROC_DIR=$(mktemp -d) python -m tools.bench.metrics_overhead

Posts a 1000-name prioritize body through DRF's APIClient, 2000 times with
`kssched.middleware.ExtenderMiddleware` and 2000 times without it, in alternating
blocks of 200 so both see the same machine noise, against a fresh SQLite file under
the test settings. Prints p50/mean/p99 of each and the difference of the p50s, overall
and for the quietest block.
"""

import os
import statistics
import time
import warnings

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
# A checkout without collected static files: whitenoise says so once; not news here.
warnings.filterwarnings("ignore", "No directory at")

import django  # noqa: E402

django.setup()

import orjson  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.test.utils import override_settings  # noqa: E402
from rest_framework.test import APIClient  # noqa: E402

from history.ledger import increment_key_nodes  # noqa: E402

MIDDLEWARE = "kssched.middleware.ExtenderMiddleware"
PATH = "/scheduler/priorities/pipeline"


def body() -> bytes:
    names = [f"node-{i:04d}" for i in range(1000)]
    for name in names[::7]:
        increment_key_nodes(keys=["pipe", "a"], node=name)
    pod = {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u",
            "labels": {settings.KSSCHED_PIPELINE_LABEL: "pipe-a"},
        },
        "spec": {},
    }
    return orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})


def timed_calls(middleware: list[str], payload: bytes, count: int) -> list[float]:
    with override_settings(MIDDLEWARE=middleware, ALLOWED_HOSTS=["testserver"]):
        client = APIClient()
        times = []
        for _ in range(count):
            started = time.perf_counter()
            response = client.post(PATH, payload, content_type="application/json")
            times.append(time.perf_counter() - started)
            assert response.status_code == 200, response.content[:200]
        return times


def main() -> None:
    call_command("migrate", verbosity=0)
    payload = body()
    variants = {
        "without": [m for m in settings.MIDDLEWARE if m != MIDDLEWARE],
        "with": list(settings.MIDDLEWARE),
    }
    assert MIDDLEWARE in variants["with"]
    for middleware in variants.values():
        timed_calls(middleware, payload, 200)  # warm-up
    times = {name: [] for name in variants}
    blocks = {name: [] for name in variants}
    for _ in range(10):
        for name, middleware in variants.items():
            block = timed_calls(middleware, payload, 200)
            times[name] += block
            blocks[name].append(statistics.median(block))
    multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
    mode = "multiprocess" if multiprocess else "in-process"
    for name, values in times.items():
        ordered = sorted(values)
        print(
            f"{mode} {name:7s} n={len(values)} "
            f"p50={statistics.median(values) * 1e3:.3f} ms "
            f"mean={statistics.mean(values) * 1e3:.3f} ms "
            f"p99={ordered[int(len(ordered) * 0.99)] * 1e3:.3f} ms"
        )
    p50 = {name: statistics.median(values) for name, values in times.items()}
    quiet = {name: min(values) for name, values in blocks.items()}
    print(
        f"{mode} overhead: p50 {(p50['with'] - p50['without']) * 1e6:+.1f} us, "
        f"quietest block {(quiet['with'] - quiet['without']) * 1e6:+.1f} us"
    )


if __name__ == "__main__":
    main()
