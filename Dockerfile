# ks-scheduler image: the extender and admin (python -m kssched.serve), the watcher
# (python manage.py watch_pods) and migrations (python manage.py migrate) all run from it.
#   make docker-build IMG=registry.example.com/ks-scheduler:1.0.0
# The base is pinned to an exact patch release; pin its digest too for reproducible
# builds: --build-arg PYTHON_IMAGE=python:3.11.11-slim-bookworm@sha256:<digest>
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

# --- build: install the pinned runtime requirements into a virtualenv -----------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
COPY requirements.txt /tmp/requirements.txt
RUN /opt/venv/bin/pip install --no-compile -r /tmp/requirements.txt

# --- runtime ---------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    DATA_PATH=/data/scheduler.db \
    KSSCHED_BIND=0.0.0.0:8080 \
    KSSCHED_EXTENDER_BIND=127.0.0.1:8081
RUN groupadd --system --gid 10001 kssched \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /tmp \
        --shell /usr/sbin/nologin kssched \
 && mkdir -p /data \
 && chown 10001:10001 /data
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
COPY --chown=root:root . /app
# Static files for the admin, collected at build time. SECRET_KEY here is a throwaway
# value set for this one command only: it is not an ENV and is not in the final image.
RUN SECRET_KEY=collectstatic-build-only DEBUG=false DATA_PATH=/tmp/build/scheduler.db \
        python manage.py collectstatic --noinput \
 && rm -rf /tmp/build \
 && python -m compileall -q /app /opt/venv
USER 10001:10001
EXPOSE 8080
VOLUME ["/data"]
# Two gunicorns with their own workers: the web listener on 8080 (admin, API, metrics,
# probes) and the extender listener on 127.0.0.1:8081 (kube-scheduler in the same pod or
# network namespace), both reporting at /metrics on 8080.
# The watcher: python manage.py watch_pods; migrations: python manage.py migrate --noinput.
CMD ["python", "-m", "kssched.serve"]
