# ks-scheduler: `make run` serves the extender and admin, `make test` runs every check.

VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
PYTHON3 ?= python3
RUN_DATA_PATH ?= $(CURDIR)/var/scheduler.db
SECRET_FILE := var/secret_key
# The two listeners of `make run` (environment variables of the same name win).
KSSCHED_BIND ?= 0.0.0.0:8080
KSSCHED_EXTENDER_BIND ?= 127.0.0.1:8081
export KSSCHED_BIND KSSCHED_EXTENDER_BIND
# What to type in a browser for an address that listens everywhere.
browse = $(subst 0.0.0.0,localhost,$(subst [::],localhost,$(1)))

.PHONY: help run migrate test lint typecheck format checks pytest pytest-postgres bench bench-cluster soak clean
.PHONY: pytest-pgbouncer control-plane e2e bench-e2e
.PHONY: outcomes-demo
.PHONY: docker-build docker-push deploy-yaml overlay screenshots demo manage docs docs-check

help:
	@echo "make run    - install, migrate and serve: web on $(KSSCHED_BIND), extender on $(KSSCHED_EXTENDER_BIND)"
	@echo "make test   - install dev tools, lint, run the whole suite"
	@echo "make bench  - benchmark the extender against a floor"
	@echo "make demo   - the extender, watcher and admin on a simulated cluster"
	@echo "make e2e    - the end-to-end tests on a real control plane (built from Debian's source)"
	@echo "make bench-e2e - kube-scheduler's own figures with the extender against default-scheduler"
	@echo "make docs   - serve the documentation site on $(DOCS_ADDR)"
	@echo "make manage ARGS='...' - a manage.py command with the checkout's settings"
	@echo "make overlay DIR=../my-ks-scheduler IMG=registry/ks-scheduler:tag - your kustomization for the cluster install"

$(VENV)/.installed: requirements.txt
	$(PYTHON3) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -r requirements.txt
	touch $@

$(VENV)/.dev-installed: $(VENV)/.installed requirements-dev.txt
	$(PIP) install --quiet -r requirements-dev.txt
	touch $@

# A local secret for `make run`, made once and kept under ./var/ (never committed).
$(SECRET_FILE):
	mkdir -p var
	$(PYTHON3) -c "import secrets; print(secrets.token_urlsafe(50))" > $@
	chmod 600 $@

# The checkout's settings for manage.py (see manage.py): made once, never committed.
# Paths are absolute so commands work from any directory.
.env: | $(SECRET_FILE)
	@printf '%s\n' \
	  '# ks-scheduler settings for this checkout, written by make. Never commit it.' \
	  "SECRET_KEY=$$(cat $(SECRET_FILE))" \
	  "DATA_PATH=$(RUN_DATA_PATH)" \
	  "KSSCHED_HEARTBEAT_PATH=$(CURDIR)/var/watcher/heartbeat" \
	  '# The watcher metrics listener (0.0.0.0:9100 in the image) is off in a checkout.' \
	  'KSSCHED_WATCHER_METRICS_BIND=' > $@
	@chmod 600 $@
	@echo "Wrote $@ (read by $(PY) manage.py)."

# Before serving: a listener's address already in use stops `make run` at once, naming
# the variable that moves it and a free alternative (tools/port_check.py; `make demo`
# checks its port there too).
run: $(VENV)/.installed $(SECRET_FILE)
	@$(PY) -m tools.port_check run KSSCHED_BIND="$(KSSCHED_BIND)" \
	  KSSCHED_EXTENDER_BIND="$(KSSCHED_EXTENDER_BIND)"
	@$(MAKE) --no-print-directory -s .env
	SECRET_KEY="$$(cat $(SECRET_FILE))" DATA_PATH="$(RUN_DATA_PATH)" $(PY) manage.py migrate --noinput
	SECRET_KEY="$$(cat $(SECRET_FILE))" DATA_PATH="$(RUN_DATA_PATH)" $(PY) manage.py collectstatic --noinput --verbosity 0
	@echo
	@echo "ks-scheduler (history in $(RUN_DATA_PATH)):"
	@echo "  web (admin, API, metrics, probes): http://$(call browse,$(KSSCHED_BIND))   [bound to $(KSSCHED_BIND)]"
	@echo "  extender (kube-scheduler's urlPrefix): http://$(KSSCHED_EXTENDER_BIND)/scheduler"
	@echo "Create an admin user for http://$(call browse,$(KSSCHED_BIND))/admin/ with:"
	@echo "  $(PY) manage.py createsuperuser"
	@echo "or without prompts:"
	@echo "  DJANGO_SUPERUSER_USERNAME=admin DJANGO_SUPERUSER_EMAIL=admin@example.com \\"
	@echo "  DJANGO_SUPERUSER_PASSWORD='a long password' $(PY) manage.py createsuperuser --noinput"
	@echo
	SECRET_KEY="$$(cat $(SECRET_FILE))" DATA_PATH="$(RUN_DATA_PATH)" exec $(PY) -m kssched.serve

# Any management command with the checkout's settings, e.g.
#   make manage ARGS=createsuperuser     make manage ARGS="audit_counts --json"
manage: $(VENV)/.installed .env
	$(PY) manage.py $(ARGS)

# A cluster without a cluster: the real extender and watch_pods against the test API
# server, with pipeline pods arriving, running and finishing on simulated nodes.
# Serves the admin on 127.0.0.1 only; stops after DEMO_MINUTES or on Ctrl-C.
# Its own database (var/demo/): the history of `make run` is left alone. A second demo
# on the same directory or a port in use stops before it touches anything (tools/demo.py).
DEMO_PORT ?= 8090
DEMO_MINUTES ?= 30
demo: $(VENV)/.installed
	$(PY) -m tools.demo --port $(DEMO_PORT) --minutes $(DEMO_MINUTES) $(DEMO_ARGS)

lint: $(VENV)/.dev-installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The import layers (history never imports extender, no cycles; pyproject.toml) and
# the types of the application code (mypy.ini: `mypy --strict` on every application
# module).
typecheck: $(VENV)/.dev-installed
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

format: $(VENV)/.dev-installed
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# Django's own gates: system checks and no model change without a migration.
checks: $(VENV)/.dev-installed
	SECRET_KEY=checks DATA_PATH="$$(mktemp -d)/checks.db" $(PY) manage.py check
	SECRET_KEY=checks DATA_PATH="$$(mktemp -d)/checks.db" $(PY) manage.py makemigrations --check --dry-run

pytest: $(VENV)/.dev-installed
	$(PY) -m pytest -m "not postgres"

# The same suite against PostgreSQL: TEST_DATABASE_URL=postgres://user@host:port/db
pytest-postgres: $(VENV)/.dev-installed
	@if [ -z "$(TEST_DATABASE_URL)" ]; then \
	  echo "TEST_DATABASE_URL is not set: cannot run the PostgreSQL suite"; exit 1; fi
	DATABASE_URL="$(TEST_DATABASE_URL)" $(PY) -m pytest

# A representative part of the PostgreSQL suite through PgBouncer in transaction mode
# (KSSCHED_PG_TRANSACTION_POOLER=true): PGBOUNCER_DATABASE_URL=postgres://user@host:port/db
# (`source .ci/postgres.sh; start_postgres; start_pgbouncer` sets it). The test
# database is made afresh (--create-db) and kept at the end (--reuse-db): PgBouncer
# still holds server sessions to it then, so it could not be dropped.
PGBOUNCER_TESTS ?= tests/test_pooler.py tests/test_api.py tests/test_outcomes.py \
  tests/test_outcomes_admin.py tests/test_admin.py tests/test_extender.py
pytest-pgbouncer: $(VENV)/.dev-installed
	@if [ -z "$(PGBOUNCER_DATABASE_URL)" ]; then \
	  echo "PGBOUNCER_DATABASE_URL is not set: cannot run the suite through PgBouncer"; exit 1; fi
	DATABASE_URL="$(PGBOUNCER_DATABASE_URL)" KSSCHED_PG_TRANSACTION_POOLER=true \
	  KSSCHED_TEST_POOLER=1 $(PY) -m pytest --create-db --reuse-db $(PGBOUNCER_TESTS)

# Under CI=true the PostgreSQL and PgBouncer runs are mandatory; locally they run
# when TEST_DATABASE_URL and PGBOUNCER_DATABASE_URL are set.
test: lint checks typecheck docs-check pytest
	@if [ -n "$(TEST_DATABASE_URL)" ]; then \
	  $(MAKE) --no-print-directory pytest-postgres; \
	elif [ "$(CI)" = "true" ]; then \
	  echo "CI=true but TEST_DATABASE_URL is not set: the PostgreSQL run may not be skipped"; \
	  exit 1; \
	else \
	  echo "PostgreSQL suite skipped: set TEST_DATABASE_URL to run it"; \
	fi
	@if [ -n "$(PGBOUNCER_DATABASE_URL)" ]; then \
	  $(MAKE) --no-print-directory pytest-pgbouncer; \
	elif [ "$(CI)" = "true" ]; then \
	  echo "CI=true but PGBOUNCER_DATABASE_URL is not set: the PgBouncer run may not be skipped"; \
	  exit 1; \
	else \
	  echo "PgBouncer run skipped: set PGBOUNCER_DATABASE_URL to run it"; \
	fi

# The documentation site from docs/ (mkdocs.yml): `make docs` serves it with live reload;
# `make docs-check` builds it strictly (every internal link and anchor must resolve;
# never --quiet, which hides the warnings strict mode counts).
DOCS_ADDR ?= 127.0.0.1:8000
docs: $(VENV)/.dev-installed
	$(VENV)/bin/mkdocs serve --dev-addr $(DOCS_ADDR)

docs-check: $(VENV)/.dev-installed
	$(VENV)/bin/mkdocs build --strict --site-dir "$$(mktemp -d)/site"

# Extender latency and throughput beside a bare orjson WSGI floor, both under the
# shipped gunicorn config; table to stdout, JSON to bench-results/latest.json.
# DATABASE_URL=postgres://... benchmarks against PostgreSQL instead of SQLite.
bench: $(VENV)/.dev-installed
	$(PY) -m tools.bench.run $(BENCH_ARGS)

# Prioritize on a history shaped like a large CI installation (tools/bench/cluster.py):
# 1 M KeyNode rows, 5 000 nodes, labels at random, writes, running pods, node churn.
bench-cluster: $(VENV)/.dev-installed
	$(PY) -m tools.bench.cluster $(BENCH_ARGS)

# The watcher through >= 1000 pods with injected faults, ending with exact counts;
# figures to stdout, JSON to var/soak-watch.json. SOAK_ARGS="--pods 5000" for more.
soak: $(VENV)/.dev-installed
	$(PY) -m tools.soak_watch $(SOAK_ARGS)

# Pipeline pods with realistic container statuses through a real watcher (killed,
# restarted, replayed), then `manage.py outcomes`; exits 1 unless the figures are exact.
outcomes-demo: $(VENV)/.dev-installed
	$(PY) -m tools.outcomes_demo $(DEMO_PODS)

# A real control plane for the end-to-end tests (tests/e2e/) and bench-e2e:
# kube-apiserver and kube-scheduler built from Debian's `kubernetes` source package
# (cached by its version under ~/.cache/ks-scheduler/control-plane; a cold build takes
# 4-8 minutes on 2 cores), etcd from etcd-server. Needs root for apt-get.
control-plane:
	bash tools/e2e/build-control-plane.sh

# The end-to-end tests alone (make test runs them too).
e2e: $(VENV)/.dev-installed
	KSSCHED_E2E_BIN="$$(bash tools/e2e/build-control-plane.sh | tail -n 1)" \
	  $(PY) -m pytest tests/e2e $(E2E_ARGS)

# kube-scheduler's own histograms and pods/s with the extender against
# default-scheduler, at 100, 1 000 and 5 000 Node objects, the watcher running and
# paused, and the watcher's CPU per 100 pod lifecycles (tools/bench/e2e.py).
bench-e2e: $(VENV)/.dev-installed
	KSSCHED_E2E_BIN="$$(bash tools/e2e/build-control-plane.sh | tail -n 1)" \
	  $(PY) -m tools.bench.e2e $(BENCH_ARGS)

# Container image (see Dockerfile): make docker-build docker-push IMG=registry/ks-scheduler:tag
IMG ?= ks-scheduler:1.0.0
DOCKER ?= docker

docker-build:
	$(DOCKER) build -t $(IMG) .

docker-push:
	$(DOCKER) push $(IMG)

# Your kustomization for the cluster install (docs/install.md, step 3), written to
# DIR/kustomization.yaml on top of deploy/overlays/OVERLAY with your images, whatever
# this checkout's folder is called; then `kubectl apply -k DIR`:
#   make overlay DIR=../my-ks-scheduler IMG=registry/ks-scheduler:tag \
#     [KUBE_SCHEDULER=registry.k8s.io/kube-scheduler:v1.31.4] [OVERLAY=postgres]
OVERLAY ?= sqlite
overlay:
	@if [ -z "$(DIR)" ]; then \
	  echo "make overlay: set DIR, the directory to write, e.g. make overlay DIR=../my-ks-scheduler IMG=$(IMG)"; \
	  exit 2; fi
	@deploy/render.sh --into "$(DIR)" --overlay "$(OVERLAY)" --image "$(IMG)" \
	  $(if $(KUBE_SCHEDULER),--kube-scheduler "$(KUBE_SCHEDULER)")

# Regenerate deploy/ks-scheduler.yaml from deploy/overlays/sqlite (tests check they agree).
deploy-yaml:
	deploy/render.sh

# Refresh the committed screenshots of the admin (docs/screenshots/) and the
# record of what each shows (shown.json), which the browser tests hold pages to.
screenshots: $(VENV)/.dev-installed
	KSSCHED_SCREENSHOT_DIR=$(CURDIR)/docs/screenshots $(PY) -m pytest -q tests/test_browser.py

clean:
	rm -rf $(VENV) staticfiles .pytest_cache .ruff_cache
