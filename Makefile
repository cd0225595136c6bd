# slurm-spot: `make demo` and `make test` do all set-up on a fresh Debian/Ubuntu machine (root).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# torch is pinned: 2.13.0 is the CPU wheel; an unpinned torch can pull a multi-GB CUDA build.
TORCH := torch==2.13.0
PYTEST_ARGS ?=
# The suite runs on pytest-xdist workers, each in a private network namespace with its own local
# cluster (tests/parallel.py, tests/netns.py): end-to-end tests mostly wait on Slurm, so more
# workers than CPUs pay (BENCHMARKS.md, "make test"). TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 3
PARALLEL := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder)

.PHONY: all setup system-deps venv lint typecheck unit e2e test demo demo-elastic demo-ft bench bench-smoke clean slurm-roots test-slurm

all: test

# mariadb-server + slurmdbd: the local cluster's accounting (sacct); `local up` starts a private
# server in its state dir, never the system service.
system-deps:
	@if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null \
	    || ! test -x /usr/sbin/slurmdbd || ! test -x /usr/sbin/mariadbd; then \
	  echo ">> installing slurm-wlm, munge, slurmdbd and mariadb-server (Debian packages)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends slurm-wlm munge slurmdbd mariadb-server python3-venv >/dev/null; \
	fi

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH)"
	$(PIP) install -q -e ".[aws,gcp,train,examples,dev,plot,ft]"
	touch $@

venv: $(VENV)/.installed

setup: system-deps venv

lint: setup
	$(VENV)/bin/ruff check slurm_spot tests examples benchmarks

typecheck: setup
	$(VENV)/bin/mypy

unit: setup
	$(PY) -m pytest -m "not e2e" -q $(PARALLEL) $(PYTEST_ARGS)

e2e: setup
	$(PY) -m pytest -m e2e -q $(PARALLEL) $(PYTEST_ARGS)

# The whole suite: lint, types, unit and end-to-end tests (a real local Slurm).
test: setup lint typecheck
	$(PY) -m pytest -q -p no:cacheprovider --durations=15 $(PARALLEL) $(PYTEST_ARGS)

# The version matrix's Debian roots with Debian's Slurm 22.05/24.11/26.05 (tests/slurmroots.py):
# built once from the Debian mirror of this machine's apt sources, cached in
# /var/cache/slurm-spot/roots. `make test` builds what it needs by itself.
slurm-roots: setup
	$(PY) -m tests.slurmroots build all

# The whole end-to-end suite on one Slurm of the matrix, in its root: make test-slurm VERSION=24.11
test-slurm: setup
	@test -n "$(VERSION)" || { echo "usage: make test-slurm VERSION=22.05|24.11|26.05" >&2; exit 2; }
	$(PY) -m tests.slurmroots test $(VERSION) $(PYTEST_ARGS)

# Every benchmark, then BENCHMARKS.md rewritten (machine, versions, method, medians, baselines
# side by side); under 20 minutes on a 2-CPU machine. BENCH_ARGS=--no-cluster leaves out the
# three that need the local Slurm cluster.
BENCH_ARGS ?=
bench: setup
	$(PY) benchmarks/run.py $(BENCH_ARGS)

# Each benchmark once, tiny, nothing written (the test suite runs this too).
bench-smoke: setup
	$(PY) benchmarks/run.py --smoke

# A real local Slurm, spot nodes, a torchrun job that is interrupted twice and finishes.
demo: setup
	$(VENV)/bin/slurm-spot demo

# Elastic training: 1 on-demand coordinator + 3 spot workers, one reclaimed with notice and one
# without; the survivors go on, replacements join, the job is never requeued.
demo-elastic: setup
	$(VENV)/bin/slurm-spot demo --elastic

# Fault-tolerant training (torchft): a lighthouse on 1 on-demand node + 3 replica groups on spot
# nodes, one reclaimed with notice and one killed; the others train on, replacements heal from a peer.
demo-ft: setup
	$(VENV)/bin/slurm-spot demo --fault-tolerant

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
