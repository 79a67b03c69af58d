# Hubbub — every command a developer or CI needs. `make run` and `make test` work on a fresh
# Debian machine with only python3, python3-venv, make and git: they install the rest.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
UV_VERSION := 0.13.9
TOOLS := .tools
UV := $(TOOLS)/bin/uv
VENV := .venv
STAMP := $(VENV)/.synced
export UV_PYTHON_DOWNLOADS := never
export UV_PROJECT_ENVIRONMENT := $(VENV)
# Trust the machine's CA store (corporate proxies, mirrors), like pip and apt do.
export UV_SYSTEM_CERTS := 1
# Debian packages the test suite drives for real (binary or file:package); the emoji font
# lets Chromium draw the page's reactions in its screenshots.
DEB_TEST_DEPS := etcd:etcd-server openssl:openssl curl:curl node:nodejs npm:npm redis-server:redis-server promtool:prometheus nginx:nginx kubectl:kubernetes-client chromium:chromium pg_ctlcluster:postgresql valgrind:valgrind /usr/share/fonts/truetype/noto/NotoColorEmoji.ttf:fonts-noto-color-emoji

.PHONY: help install run test bench bench-core bench-redis bench-scale bench-ceiling device-bundle bench-search bench-sse bench-tracing bench-moderation bench-tokens bench-rejoin bench-100k chaos attack k8s-deps k8s-check lint typecheck check deb-deps node-deps s3-deps otel-deps docs-config dashboard chart-files clean

help:  ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(UV):
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

$(STAMP): pyproject.toml uv.lock | $(UV)
	$(UV) sync --frozen --python $(PYTHON)
	touch $@

install: $(STAMP)  ## create .venv with the locked dependencies

deb-deps:  ## install the Debian packages the tests need, when missing (needs root)
	@missing=""; for pair in $(DEB_TEST_DEPS); do \
	  case $${pair%%:*} in /*) test -e $${pair%%:*};; *) command -v $${pair%%:*} >/dev/null;; esac \
	    || missing="$$missing $${pair##*:}"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

run: $(STAMP)  ## serve the chat on http://127.0.0.1:8000 (memory broker, SQLite store in data/, guests)
	CHAT_AUTH_MODE=$${CHAT_AUTH_MODE:-guest} CHAT_DATABASE_URL=$${CHAT_DATABASE_URL:-sqlite:///data/hubbub.db} \
	  $(VENV)/bin/python -m app

# Node projects the tests build or run (the TypeScript SDK, the AsyncAPI checker, axe-core for
# the page's accessibility audit): each installed from its package-lock.json, again only when
# the lock changed.
NODE_PROJECTS := clients/js scripts/asyncapi tests/a11y

node-deps: deb-deps  ## npm ci in each Node project that has a package-lock.json
	@for dir in $(NODE_PROJECTS); do \
	  if [ -f $$dir/package-lock.json ] && ! [ $$dir/node_modules/.installed -nt $$dir/package-lock.json ]; then \
	    echo "npm ci in $$dir"; \
	    (cd $$dir && npm ci --no-audit --no-fund --loglevel=error >/dev/null) && touch $$dir/node_modules/.installed || exit 1; \
	  fi; \
	done

# The S3 store the file-attachment tests run (SeaweedFS, not packaged by Debian): built once into
# .tools/bin/weed from its pinned Go module, fetching a Go toolchain if needed (a few minutes).
s3-deps:  ## build .tools/bin/weed (SeaweedFS, the tests' S3 server), when missing
	@bash scripts/seaweedfs.sh

test: $(STAMP) deb-deps node-deps s3-deps k8s-deps otel-deps  ## install everything the tests need, then run the whole suite
	$(VENV)/bin/python -m pytest

bench: $(STAMP) deb-deps  ## every load-test scenario vs the baseline, and issue 34's rows vs Centrifugo (~28 min); rewrites docs/benchmarks.md
	$(VENV)/bin/python -m loadtest.bench

# The rows of the send and delivery path (issue 42): a change to it is not done before this
# has run with no regression (or the regression is accepted, with --accept, and explained).
BENCH_CORE := fanout-saturation fanout-100k fanout-1000 small-rooms small-rooms-saturation rtt-closed rtt-2000

bench-core: $(STAMP) deb-deps  ## the send/delivery rows only (~9 min), same verdict; records only them
	$(VENV)/bin/python -m loadtest.bench --only $(BENCH_CORE) $(BENCH_ARGS)

bench-redis: $(STAMP) deb-deps  ## Redis CPU per message, server CPU per delivery and per join, Hubbub vs Centrifugo (~8 min); writes docs/bench/redis-cost.json
	$(VENV)/bin/python -m loadtest.redis_bench --json docs/bench/redis-cost.json

bench-scale: $(STAMP) deb-deps  ## deliveries/s with W = 1, 2, 4, 8… workers on one Redis, Hubbub vs Centrifugo, 10,000 clients (as the cores allow); writes docs/bench/scale.json
	$(VENV)/bin/python -m loadtest.scale --json docs/bench/scale.json $(SCALE_ARGS)

bench-ceiling: $(STAMP) deb-deps  ## messages/s one Redis core carries on the publish calls each target sends it, recorded and replayed, Hubbub vs Centrifugo (~5 min); writes docs/bench/redis-ceiling.json
	$(VENV)/bin/python -m loadtest.redis_ceiling --json docs/bench/redis-ceiling.json

device-bundle: $(STAMP) deb-deps  ## pack .device/ (wheels for Python 3.12, redis-server, Centrifugo) for scripts/device-scale.sh on a lent many-core machine
	scripts/device-bundle.sh

bench-search: $(STAMP) deb-deps  ## search p50/p95 over 1,000,000 stored messages and archiving with and without the index, SQLite and PostgreSQL (~10 min); writes docs/bench/search.json
	$(VENV)/bin/python -m loadtest.search --json docs/bench/search.json

bench-sse: $(STAMP) deb-deps  ## the HTTP fallback against WebSockets on one worker: deliveries/s, latency, CPU, memory per connection (~25 min); writes docs/bench/sse.json
	$(VENV)/bin/python -m loadtest.sse_bench --json docs/bench/sse.json

bench-tracing: $(STAMP) deb-deps otel-deps  ## closed-loop throughput with tracing off, at 1 % and at 100 % to a real collector (~4 min); writes docs/bench/tracing.json
	$(VENV)/bin/python -m loadtest.tracing_cost --json docs/bench/tracing.json

bench-moderation: $(STAMP) deb-deps  ## closed-loop throughput with the moderation hook off and on (a real endpoint on loopback, ~3 min); writes docs/bench/moderation.json
	$(VENV)/bin/python -m loadtest.moderation_cost --json docs/bench/moderation.json

bench-tokens: $(STAMP)  ## server CPU a connection, a reconnection and a bearer request, tokens checked in full vs remembered, HS256 and ES256 (~4 min); writes docs/bench/token-cost-*.json
	$(VENV)/bin/python -m loadtest.token_cost --algorithm HS256 --rounds 5 --json docs/bench/token-cost-hs256.json
	$(VENV)/bin/python -m loadtest.token_cost --algorithm ES256 --rounds 5 --json docs/bench/token-cost-es256.json

bench-rejoin: $(STAMP) deb-deps  ## a reconnect storm through Redis, presence's grace on and off: server CPU and presence frames a reconnect (~3 min); writes docs/bench/rejoin-cost.json
	$(VENV)/bin/python -m loadtest.rejoin_cost --json docs/bench/rejoin-cost.json

bench-100k: $(STAMP) deb-deps  ## hold 100,000 WebSockets for 5 min (gunicorn + Redis, ~10 min); writes docs/bench/hold-100k.json
	$(VENV)/bin/python -m loadtest.hold --json docs/bench/hold-100k.json

# The OpenTelemetry collector and trace store the tracing tests send spans to and read back
# (Jaeger v2, not packaged by Debian): built once into .tools/bin/jaeger (~4 min).
otel-deps:  ## build .tools/bin/jaeger (Jaeger, the tracing tests' collector), when missing
	@bash scripts/jaeger.sh

# The Kubernetes tools the deployment tests run (etcd, kube-apiserver, kubectl, helm): built once
# into .tools/k8s/bin from their pinned Go modules (~6 min the first time).
k8s-deps: deb-deps  ## build .tools/k8s/bin (kube-apiserver, kubectl, helm), when missing
	@bash scripts/k8s-tools.sh

k8s-check: $(STAMP) deb-deps k8s-deps  ## k8s/ and the Helm chart: helm lint, and a server-side dry run on a real kube-apiserver under Pod Security restricted
	$(VENV)/bin/python -m pytest -p no:cacheprovider -q tests/test_deploy_files.py tests/test_helm.py \
	  -k "server_side_dry_run or helm"

chaos: $(STAMP) deb-deps  ## clients chat through Redis, worker and PostgreSQL faults (~4 min); fails on a silent loss or an acked message not stored
	$(VENV)/bin/python -m loadtest.chaos --store

attack: $(STAMP) deb-deps  ## every identity that may not read a private room tries every path into it, on 3 deployments (~1 min); fails on any leak
	$(VENV)/bin/python -m loadtest.attack

lint: $(STAMP)  ## ruff format check + ruff lint
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .

typecheck: $(STAMP) node-deps  ## mypy --strict, and tsc --strict on the TypeScript SDK
	$(VENV)/bin/mypy
	cd clients/js && npm run --silent typecheck

check: lint typecheck test  ## everything CI runs

docs-config: $(STAMP)  ## regenerate the settings table in docs/configuration.md
	$(VENV)/bin/python -m app.settings --write-docs docs/configuration.md

dashboard: $(STAMP)  ## regenerate deploy/grafana/dashboards/hubbub.json from its builder (and the chart's copy)
	$(VENV)/bin/python deploy/grafana/build_dashboard.py
	$(MAKE) --no-print-directory chart-files

# The Helm chart can only read files inside itself: it carries copies of the dashboard and the
# alerts (tests/test_helm.py fails when they differ).
chart-files:  ## copy the dashboard and the alert rules into the Helm chart (deploy/helm/hubbub/files)
	cp deploy/grafana/dashboards/hubbub.json deploy/helm/hubbub/files/hubbub-dashboard.json
	cp deploy/prometheus/alerts.yml deploy/helm/hubbub/files/alerts.yml

clean:  ## remove the virtualenvs and caches
	rm -rf $(VENV) $(TOOLS) .pytest_cache .mypy_cache .ruff_cache
