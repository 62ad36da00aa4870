# dpfl: the two commands a fresh machine needs are `make demo` and `make test`.
# Each creates .venv when missing and installs what it needs; nothing is installed globally.

PYTHON     ?= python3
VENV       ?= .venv
# PyTorch is installed first, from this spec. On the project's machines it is the CPU wheel on
# disk; a GPU silo overrides it, e.g. `make demo TORCH_SPEC="torch==2.13.0" PIP_EXTRA="--index-url ..."`.
TORCH_SPEC ?= torch==2.13.0
PIP_EXTRA  ?=
BIN        := $(VENV)/bin
PY         := $(BIN)/python
PIP        := $(PY) -m pip --disable-pip-version-check
PYTEST_ARGS ?=
DEMO_ARGS  ?=

.PHONY: demo test test-fast lint protos bench install install-dev browser clean help image image-test podman

help:
	@echo "make demo    - create .venv, install dpfl, run DP-FedAvg on the embedded digits data set"
	@echo "make test    - create .venv, install dpfl[dev], run lint and the whole test suite on every core"
	@echo "               (PYTEST_WORKERS=N: N pytest-xdist workers, 0: one process)"
	@echo "make test-fast - the unit tests not marked slow, on every core (no lint, no browser):"
	@echo "               about 130 s of CPU, so about 75 s on 2 idle cores; longer on a busy machine"
	@echo "make lint    - ruff on everything, mypy --strict on every dpfl package"
	@echo "make protos  - regenerate the checked-in gRPC code from protos/dpfl/v1/*.proto"
	@echo "make bench   - run every benchmark in benchmarks/ (each prints one JSON line)"
	@echo "make image   - build the coordinator and agent images with podman (no registry needed)"
	@echo "make image-test - a federation in containers: PostgreSQL, coordinator, three agents"

$(PY):
	$(PYTHON) -m venv $(VENV)

# Stamps re-run the install when pyproject.toml changes.
$(VENV)/.torch: | $(PY)
	$(PIP) install -q $(PIP_EXTRA) "$(TORCH_SPEC)"
	touch $@

$(VENV)/.installed: pyproject.toml $(VENV)/.torch
	$(PIP) install -q -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml $(VENV)/.torch
	$(PIP) install -q -e ".[dev]"
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

demo: $(VENV)/.installed
	$(BIN)/dpfl demo $(DEMO_ARGS)

# Debian's chromium for the dashboard browser test; skipped quietly where apt is unavailable
# (the test itself then says that it was skipped and why).
browser:
	@if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
		|| echo "warning: could not install chromium; the browser test will be skipped"; \
	fi

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(PY) scripts/typecheck.py

protos: $(VENV)/.installed-dev
	$(PY) scripts/gen_protos.py

# pytest-xdist workers: one per core, at most 4 (each worker holds torch and its own fixtures;
# tests/conftest.py gives each one native thread). --dist loadfile keeps a test file on one
# worker, so its module fixtures are built once; --no-loadscope-reorder hands out the files in
# collection order, where tests/conftest.py puts the files with slow tests first.
# PYTEST_WORKERS=0 runs in this process.
PYTEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && n=4; echo $$n)
XDIST = $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder)

test: $(VENV)/.installed-dev browser
	$(MAKE) lint
	$(BIN)/pytest $(XDIST) $(PYTEST_ARGS)

# The inner loop: tests/unit without the tests marked slow; `make test` still runs everything.
test-fast: $(VENV)/.installed-dev
	$(BIN)/pytest tests/unit -m "not slow" -q $(XDIST) $(PYTEST_ARGS)

bench: $(VENV)/.installed-dev
	@for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

# The images (docs/deploy.md, "Building the images"): podman from apt when missing, then
# scripts/images.py. BASE=registry|local forces the base; TORCH_INDEX_URL selects the wheel's
# index (a GPU silo: TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128).
BASE            ?= auto
TORCH_INDEX_URL ?= https://download.pytorch.org/whl/cpu

podman:
	@if ! command -v podman >/dev/null 2>&1 || ! command -v mmdebstrap >/dev/null 2>&1 \
		|| { ! command -v iptables >/dev/null 2>&1 && [ ! -x /usr/sbin/iptables ]; }; then \
		if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive nice -n 15 apt-get install -y -qq \
				podman buildah runc mmdebstrap uidmap netavark aardvark-dns iptables >/dev/null; \
		else echo "podman, mmdebstrap and iptables are needed: apt-get install podman runc mmdebstrap iptables"; exit 1; fi; \
	fi

image: podman | $(PY)
	$(PY) scripts/images.py --base $(BASE) --torch-spec "$(TORCH_SPEC)" --torch-index-url "$(TORCH_INDEX_URL)"

image-test: image $(VENV)/.installed-dev
	$(PY) scripts/image_test.py

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
