# THORN: `make run` and `make test` are all a fresh machine needs.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-setup test-deploy test-kernel lint openapi bench bench-failover bench-scale venv test-deps dashboard clean

# The dashboard (Vite + TypeScript), rebuilt when its sources or the API document change.
DASH := services/gateway/dashboard
DASH_SOURCES := $(DASH)/package.json $(DASH)/package-lock.json $(DASH)/index.html \
	$(DASH)/vite.config.ts $(DASH)/tsconfig.json $(wildcard $(DASH)/src/*.ts $(DASH)/src/*.css) \
	openapi/openapi.json

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

$(DASH)/dist/index.html: $(DASH_SOURCES)
	@command -v npm >/dev/null || (apt-get update -qq && apt-get install -y -qq nodejs npm)
	cd $(DASH) && npm ci --no-audit --no-fund --loglevel=error && npm run build
	touch $@

## dashboard: build the web dashboard that the entry point serves at /
dashboard: $(DASH)/dist/index.html

## run: the embedded controller (SQLite, embedded NATS, all services) on http://127.0.0.1:8080
run: venv dashboard
	$(BIN)/thorn-run

## test-deps: system packages the test lanes need (strace: golden netlink captures of tc;
## frr: bfdd as the BFD interop peer of the fabric lane; bird2: the BFD authentication
## interop peer (FRR 8.4 has none); chromium: the browser tests;
## postgresql: initdb and pg_ctl for the server the restart tests start, stop and kill)
test-deps:
	@command -v psql >/dev/null || (apt-get update -qq && apt-get install -y -qq postgresql-client)
	@ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq postgresql)
	@command -v strace >/dev/null || (apt-get update -qq && apt-get install -y -qq strace)
	@test -x /usr/lib/frr/bfdd || (apt-get update -qq && apt-get install -y -qq frr)
	@test -x /usr/sbin/bird || (apt-get update -qq && apt-get install -y -qq bird2)
	@test -x /usr/bin/chromium || (apt-get update -qq && apt-get install -y -qq chromium)

## lint: ruff and mypy over the whole tree
lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

## test: every lane (lint, unit, integration with NATS + SQLite + PostgreSQL, deploy, the
## fabric lane: network namespaces on this kernel, as root, the browser lane: the dashboard
## in Debian's headless chromium, the deploy lane: docker-compose.yml started for real with
## podman, and the kernel lane)
## Lanes overlap where one mostly waits: the kernel lane's installs (network, disk) run
## beside pytest; the kernel lane itself (qemu: CPU) beside the deploy lane (image builds
## from local files, containers' waits), its output printed when both are done.
test: test-setup
	@mkdir -p .cache
	@$(BIN)/python tests/kernel/lane.py --lane-install-only > .cache/kernel-lane-install.log 2>&1 & installing=$$!; \
	$(BIN)/pytest -q --durations=25 tests/unit tests/integration tests/deploy tests/fabric tests/browser; rc=$$?; \
	wait $$installing || echo "kernel lane: installing failed (.cache/kernel-lane-install.log); the lane tries again"; \
	exit $$rc
	@$(BIN)/python tests/kernel/lane.py > .cache/kernel-lane.log 2>&1 & kernel=$$!; \
	$(BIN)/pytest -q tests/deploy_lane; rc=$$?; \
	wait $$kernel; kernel_rc=$$?; cat .cache/kernel-lane.log; \
	[ $$rc -eq 0 ] && exit $$kernel_rc || exit $$rc

## test-setup: what the lanes need; the venv (pip) and the system packages (apt) side by side
test-setup:
	$(MAKE) -j2 --no-print-directory venv test-deps
	$(MAKE) --no-print-directory dashboard lint

## test-deploy: the deploy lane alone: the compose file's cluster profile started with podman
## and podman-compose (installed by apt and pip), every image built here on a debootstrap
## base (cached between runs), nothing pulled from a registry
test-deploy: venv dashboard
	$(BIN)/pytest -q tests/deploy_lane

## test-kernel: the kernel lane alone: Debian's kernel under qemu (TCG) via virtme-ng, with
## cls_flower, act_tunnel_key and Soft-RoCE; installs qemu, the kernel, rdma tools (apt)
test-kernel: venv
	$(BIN)/python tests/kernel/lane.py

## openapi: write the merged OpenAPI document of all services
openapi: venv
	$(BIN)/python openapi/generate.py --write

## bench: benchmarks; results go to docs/benchmarks.md
bench: venv dashboard
	@command -v wrk >/dev/null || (apt-get update -qq && apt-get install -y -qq wrk)
	$(BIN)/python tests/bench/bench_topology.py --write docs/benchmarks.md
	$(BIN)/python tests/bench/bench_pathcomp.py --write docs/benchmarks.md
	$(BIN)/python tests/bench/bench_datapath.py --report docs/benchmarks.md
	$(BIN)/python tests/bench/bench_health.py --write docs/benchmarks.md
	$(BIN)/python tests/bench/bench_carrier.py --write docs/benchmarks.md
	$(BIN)/python tests/bench/bench_bfd.py --write docs/benchmarks.md
	$(BIN)/python tests/bench/bench_roce.py --write docs/benchmarks.md
	$(BIN)/python tests/bench/bench_dashboard.py --write docs/benchmarks.md
	$(BIN)/python tests/bench/bench_api_responsive.py --write docs/benchmarks.md
	$(BIN)/python tests/bench/bench_topology_change.py --write docs/benchmarks.md

## bench-failover: random single failures on a lab under all-to-all traffic (root), THORN
## beside FRR (test-deps installs it) and a static path; the gap distribution goes to
## docs/benchmarks.md, JSON and a CDF plot to docs/images/
bench-failover: venv test-deps
	@$(BIN)/python -c "import matplotlib" 2>/dev/null || $(BIN)/python -m pip install --quiet matplotlib
	$(BIN)/python tests/bench/bench_failover.py --failures 100 --write docs/benchmarks.md

## bench-scale: 1,000 simulated agents (the programmer's own agent code, a null datapath)
## against topology, health and pathcomp on the embedded nats-server and a 3-server cluster:
## link failure and topology change to every agent's document, health's ingest, CPU and
## memory, on a k=16 fat-tree and then on k=32's 8,192 hosts (embedded NATS); results go to
## docs/benchmarks.md
bench-scale: venv
	$(BIN)/python tests/bench/bench_scale.py --write docs/benchmarks.md
	$(BIN)/python tests/bench/bench_scale.py --k 32 --nats embedded --failures 5 \
		--agents-per-process 500 --write docs/benchmarks.md

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .cache  # .thorn (store, token) is kept
