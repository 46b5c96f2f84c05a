# The README's two commands are `make serve` and `make test`; CI runs `make test` through .ci/run.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.mcpipe-installed
RUST_SRC := $(shell find rust -name '*.rs') Cargo.toml pyproject.toml

.PHONY: setup serve test lint pytest cargo-test conformance bench fuzz soak fmt clean wheel kafka-tansu console-screenshots \
	mcpg-goldens mcpg-diff mcpg-json-errors noetl-oracle image image-test bench-peers bench-peer-noetl \
	bench-peer-mcpg

setup: $(STAMP)

$(VENV)/bin/python:
	@echo "== make: creating $(VENV)"
	$(PY) -m venv $(VENV)

# An editable install: Python sources are used in place, the Rust extension is rebuilt when rust/ changes.
# Everything the tests need (the [test] extra); it covers what `make serve` needs too.
$(STAMP): $(VENV)/bin/python $(RUST_SRC)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@ $(SERVE_STAMP)

# `make serve` installs only what the server needs (pyproject's dependencies, no extras), and does its slow
# parts at once: cargo fetching the core's crates while the venv is created; then uv (from PyPI, into the
# venv) installing the dependencies while pip and maturin build the Rust core (the editable install of mcpipe
# itself). Each line says which part it comes from; README.md and docs/performance.md have the time it takes
# from a fresh clone.
SERVE_STAMP := $(VENV)/.mcpipe-serve
SERVE_REQS := $(VENV)/serve-requirements.txt
$(SERVE_STAMP): SHELL := /bin/bash
$(SERVE_STAMP): $(RUST_SRC)
	@cargo fetch --quiet & fetch=$$!; \
	if [ ! -x $(BIN)/python ]; then echo "== make: creating $(VENV) (and fetching the Rust core's crates meanwhile)"; \
	  $(PY) -m venv $(VENV) || exit 1; fi; \
	wait $$fetch || echo "make: cargo fetch failed: the build below says why" >&2
	@$(BIN)/python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' > $(SERVE_REQS)
	@echo "== make: installing the server's dependencies (pyproject's $$(wc -l < $(SERVE_REQS)), with theirs) and building the Rust core, side by side"
	@$(BIN)/pip install --disable-pip-version-check -q uv && $(BIN)/uv pip install -q --python $(BIN)/python 'maturin>=1.7,<2'
	@set -o pipefail; \
	export PYTHONUNBUFFERED=1; \
	( $(BIN)/uv pip install --python $(BIN)/python --no-progress -r $(SERVE_REQS) 2>&1 \
	  | $(BIN)/python scripts/progress_lines.py '[deps]' '^(Resolved|Prepared|Installed|Uninstalled|error)' ) & deps=$$!; \
	$(BIN)/pip install --disable-pip-version-check -v --no-build-isolation --no-deps -e . 2>&1 \
	  | $(BIN)/python scripts/progress_lines.py '[core]' 'Installing build dependencies|Compiling |Finished |Successfully installed|[Ee]rror'; \
	core=$$?; wait $$deps; deps=$$?; \
	if [ $$core -ne 0 ] || [ $$deps -ne 0 ]; then \
	  echo "make: the install failed (deps: $$deps, core: $$core); its whole output: $(BIN)/pip install -e ." >&2; exit 1; fi
	@touch $@
	@echo "== make: installed; starting mcpipe serve"

serve: $(SERVE_STAMP)
	$(BIN)/mcpipe serve $(ARGS)

lint: setup
	$(BIN)/ruff check python tests benches scripts examples
	$(BIN)/ruff format --check python tests benches scripts examples
	$(BIN)/mypy
	$(BIN)/python scripts/check_layers.py
	$(BIN)/python scripts/check_formats.py
	$(BIN)/python scripts/check_deploy.py
	cargo fmt --check
	cargo clippy --all-targets -q -- -D warnings
	cargo clippy --all-targets -q --no-default-features -- -D warnings
	cargo clippy --all-targets -q --features abi3 -- -D warnings

cargo-test:
	cargo test -q --no-default-features

pytest: setup
	$(BIN)/python -m pytest -q $(PYTEST_ARGS) || [ $$? -eq 5 ]  # 5: no tests collected

# The official MCP conformance suite (../shared/conformance, node 20) against tests/conformance's
# everything-server directly and through `mcpipe serve` (HTTP and stdio downstream, both eras), mcpipe alone,
# and every tasks-* scenario (the tasks extension) against mcpipe's run queue.
conformance: setup
	$(BIN)/python tests/conformance/harness.py $(MODES)

# `make wheel` too: about 1-2 minutes after the others (a rebuild of pyo3 and the core with abi3).
test: lint cargo-test pytest conformance wheel

# The real NoETL 4.26.0 (the ../shared/noetl-oracle kit: its server and worker from PyPI, PostgreSQL and NATS on
# 127.0.0.1) runs the golden playbooks of tests/formats/noetl/golden/4.26.0 and records its answers there
# (outside CI: a first run installs about 1.3 GB and takes a few minutes). NOETL_ORACLE_KIT, NOETL_ORACLE_DIR.
noetl-oracle: setup
	$(BIN)/python scripts/noetl_oracle.py $(CASES)

# The peers side by side on this host (outside CI): each part starts its peer, checks that both answer alike,
# and prints a table (docs/performance.md). A list of parts: add a peer's as bench-peer-NAME.
# noetl: the real NoETL 4.26.0 (the oracle kit: a first run installs about 1.3 GB) against mcpipe on five of
# NoETL's golden playbooks, at concurrency 1 and 16. NOETL_PEER_ARGS: e.g. --rounds 1 --runs 3.
# mcpg: the real mcpg (.mcpg/bin/mcpg, when it is there: this repository holds no recipe that builds fetched
# code, docs/formats/mcpg.md "The oracle") and mcpipe, each in front of the same SDK downstream over
# streamable HTTP, loaded by benches/loadgen (Rust, std only, built with cargo on first use into
# target/loadgen); without mcpg its rows are left out and said so.
# MCPG_PEER_ARGS: e.g. --rounds 3 --calls 2000 --base ../other/.venv/bin/python (an A/B against another tree).
PEER_PARTS := noetl mcpg
bench-peers: $(addprefix bench-peer-,$(PEER_PARTS))

bench-peer-noetl: setup
	$(BIN)/python benches/noetl_peer.py $(NOETL_PEER_ARGS)

bench-peer-mcpg: setup
	$(BIN)/python benches/proxy_peer.py $(MCPG_PEER_ARGS)

bench: setup
	$(BIN)/python -m pytest benches --benchmark-enable --benchmark-only -q $(PYTEST_ARGS)

# One abi3 wheel in dist/ (CPython 3.11 and later, no Rust toolchain needed to install it), then checked:
# it installs into a fresh virtualenv with no cargo on PATH, imports, and runs a pipeline. On Linux it is
# tagged manylinux_2_34 (glibc 2.34 or later: Debian 12, Ubuntu 22.04, RHEL 9), and maturin's own
# auditwheel check refuses the build if the library needs a newer glibc symbol or an unlisted library.
# manylinux_2_28 would need a build on an older glibc (a manylinux container or zig): see README.md.
WHEEL_ARGS := --features abi3 $(if $(filter Linux,$(shell uname -s)),--compatibility manylinux_2_34 --auditwheel check)
wheel: setup
	rm -f dist/mcpipe-*.whl
	MATURIN_PEP517_ARGS="$(WHEEL_ARGS)" $(BIN)/pip wheel -q --no-deps -w dist .
	$(BIN)/python scripts/check_wheel.py dist

# The console's screenshots and drawings in docs/console/, taken again by its browser tests (Debian's chromium and
# chromium-driver under Selenium) and `mcpipe explain --format svg` (docs/console.md).
console-screenshots: setup
	MCPIPE_CONSOLE_SHOTS=docs/console $(BIN)/python -m pytest -q tests/console/test_browser.py tests/console/test_explain.py

# The container image (deploy/container/Containerfile, docs/deployment.md "Container"). Base images cannot be
# pulled here, so by default the base is a Debian trixie root filesystem made from Debian's packages
# (deploy/container/debian-base.sh: mmdebstrap, then podman import), built once; BASE_IMAGE names any other
# (docker.io/library/python:3.13-slim-trixie where it can be pulled). EXTRAS: postgres,duckdb,grpc,otlp...
# crun cannot start containers on a host with hybrid cgroups (this one): runc where it is installed; and
# podman's default limits are above this host's hard ones. 1-3 minutes after a change (the Rust build is
# cached); from nothing not timed. `make image-test` then runs tests/deploy (the image under podman, compose
# with podman-compose, the Kubernetes pods) against it. Needs podman, runc and mmdebstrap (Debian).
IMAGE ?= localhost/mcpipe:dev
BASE_IMAGE ?= localhost/mcpipe-debian:trixie
EXTRAS ?=
HARD_NOFILE := $(shell n=$$(ulimit -Hn); [ "$$n" = unlimited ] || [ "$$n" -gt 65536 ] && n=65536; echo $$n)
PODMAN_FLAGS ?= $(if $(shell command -v runc),--runtime runc) --ulimit nofile=$(HARD_NOFILE):$(HARD_NOFILE) \
	--ulimit nproc=4096:4096
image:
	@case "$(BASE_IMAGE)" in localhost/*) podman image exists $(BASE_IMAGE) || deploy/container/debian-base.sh $(BASE_IMAGE);; esac
	podman build $(PODMAN_FLAGS) --format docker --build-arg BASE=$(BASE_IMAGE) --build-arg EXTRAS=$(EXTRAS) \
	  -f deploy/container/Containerfile -t $(IMAGE) .
	@podman image inspect $(IMAGE) --format '$(IMAGE): {{.Size}} bytes'

# deploy/compose's Redis: the public image where it can be pulled, else Debian's redis-server made the same way.
REDIS_IMAGE ?= localhost/mcpipe-redis:trixie
image-test: setup image
	@case "$(REDIS_IMAGE)" in localhost/*) podman image exists $(REDIS_IMAGE) || \
	  DEBIAN_INCLUDE=redis-server deploy/container/debian-base.sh $(REDIS_IMAGE);; esac
	MCPIPE_IMAGE=$(IMAGE) MCPIPE_REDIS_IMAGE=$(REDIS_IMAGE) MCPIPE_PODMAN_FLAGS="$(PODMAN_FLAGS)" \
	  $(BIN)/python -m pytest -q tests/deploy $(PYTEST_ARGS)

# The hostile-input properties of tests/hostile, long (the normal suite runs them quick).
fuzz: setup
	MCPIPE_FUZZ_PROFILE=fuzz $(BIN)/python -m pytest tests/hostile/test_fuzz.py -q $(PYTEST_ARGS)

# 100 clients of mixed pipelines against a real `mcpipe serve` for a few minutes: p99, RSS, memory flat.
soak: setup
	$(BIN)/python tests/kit/soak.py --seconds $${MCPIPE_SOAK_S:-180}

# The Kafka tests against tansu (the Rust crate), an Apache-2.0 Kafka-compatible broker, instead of the
# tests' own broker (tests/kit/kafkabroker.py). tansu is built once into .tansu/ (its in-memory storage needs
# the `dynostore` feature): about 14 min on 2 cores, which is why `make test` (CI) does not run this.
TANSU_VERSION := 0.6.0
TANSU := .tansu/bin/tansu
KAFKA_TESTS := tests/backends/test_kafka_client.py tests/backends/test_kafka_steps.py \
	tests/backends/test_kafka_interop.py tests/backends/test_mcpg_services.py
$(TANSU):
	cargo install tansu --version $(TANSU_VERSION) --locked --features dynostore --root .tansu
kafka-tansu: setup $(TANSU)
	MCPIPE_KAFKA=tansu MCPIPE_TANSU=$(abspath $(TANSU)) $(BIN)/python -m pytest -q $(KAFKA_TESTS) $(PYTEST_ARGS)

# The mcpg oracle (docs/formats/mcpg.md, "Evidence"): the real mcpg gateway in .mcpg/ (git-ignored; built
# from source outside this repository, which commits no recipe that builds fetched code), the goldens of
# tests/formats/mcpg/golden/ recorded from it, and mcpipe and mcpg run side by side on them. Not CI.
MCPG_UPSTREAM ?= tests/formats/mcpg/upstream

mcpg-goldens: setup
	$(BIN)/python scripts/mcpg_oracle/record.py --upstream $(MCPG_UPSTREAM) $(CASES)

mcpg-diff: setup
	$(BIN)/python scripts/mcpg_oracle/diff.py --write-not-yet $(CASES)

# How mcpg's JSON crates word their errors (serde_json, jsonschema, at mcpg's versions, built offline).
mcpg-json-errors: setup
	$(BIN)/python scripts/mcpg_oracle/json_errors.py

fmt: setup
	$(BIN)/ruff format python tests benches scripts examples
	$(BIN)/ruff check --fix python tests benches scripts examples
	cargo fmt

clean:
	rm -rf $(VENV) target build dist
