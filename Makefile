# agentrun — developer entry points. The README's first two commands are `make demo` and
# `make test`; both create the virtualenv and install everything they need: the runtime
# (`agentrun`, this directory) and its dev tooling (`agentrun-dev`, `devtools/`: the local
# stack behind `agentrun dev …`, the binary builds, the test fixtures' services).

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo demo-cluster test lint typecheck pytest mutate bench bench-quick bench-all bench-ab bench-cluster down status clean image release system-packages node-packages

$(STAMP): pyproject.toml devtools/pyproject.toml
	@echo 'installing agentrun and its dev tooling into $(VENV) (a few minutes the first time)…'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]' -e ./devtools
	touch $(STAMP)

## demo: the full local stack (kube-apiserver + etcd, nats-server, mock model, operator,
## two workers), the example AgentRuns, and their terminal reasons. `make down` stops it.
demo: $(STAMP)
	$(BIN)/agentrun dev demo

## demo-cluster: the examples on a real single node (containerd, kubelet, kube-proxy, CoreDNS,
## controller-manager, scheduler; needs root) through `helm install` of charts/agentrun: the
## images built here and imported, NATS, the mock model, the operator and the workers as pods;
## then everything is stopped by pid and the host cleaned (`agentrun dev demo --chart` without
## --down keeps it up; `make down` stops it).
demo-cluster: $(STAMP) system-packages node-packages
	$(BIN)/agentrun dev demo --chart --down

## node-packages: the Debian packages the node needs, installed only when missing.
node-packages:
	.ci/node-packages

down: $(STAMP)
	$(BIN)/agentrun dev down

status: $(STAMP)
	$(BIN)/agentrun dev status

## test: lint, type-check, then the whole suite (unit, integration, e2e on real services).
test: lint typecheck pytest

# ruff; then the import contracts of pyproject.toml (lint-imports on an installed copy: a broken
# one names the two modules) and a warning for each module over 400 lines (agentrun_dev.layout).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m agentrun_dev.layout

# Type-check the installed packages: `mypy operator/` would see the stdlib `operator`.
typecheck: $(STAMP)
	rm -rf $(VENV)/typecheck
	$(BIN)/pip install --quiet --no-deps --target $(VENV)/typecheck . ./devtools
	rm -rf build devtools/build
	cd $(VENV) && MYPYPATH=typecheck ../$(BIN)/mypy --strict -p agentrun -p agentrun_dev

# The suite in four tiers (.ci/pytest-tiers says how): the tests that need no Go-built binary run
# while those binaries (the control plane first, then helm, Prometheus, syft and the nats CLI,
# then the node's), then the real model's server (llama.cpp), build niced in the background
# (cold: about 25 and 5 minutes on 2 cores; warm, cache hits); then the control plane's tests,
# then the tools' beside the node's. Exit status 1 when a tier or a build failed. --durations: the slowest
# tests of each tier, printed for whoever trims the suite's time next.
pytest: $(STAMP) system-packages node-packages
	.ci/pytest-tiers $(BIN) --durations=30

## image: the agentrun and NATS container images (buildah, from Debian packages and this
## repository's wheel), as docker-archive tarballs for `ctr -n k8s.io images import`. Cached:
## unchanged inputs are not rebuilt. Needs root.
image: $(STAMP) system-packages
	$(BIN)/python -m agentrun_dev.image .

## release: dist/agentrun-<version>/ — the chart package, both image archives, a CycloneDX
## SBOM of each (syft, built once from the Go module proxy), SHA256SUMS, and with
## SIGNING_KEY=<ssh private key> its signature (ssh-keygen -Y sign). Needs root (images).
release: $(STAMP) system-packages
	$(BIN)/python -m agentrun_dev.dist . --out dist $(if $(SIGNING_KEY),--signing-key $(SIGNING_KEY))

# Debian packages the image build needs (as root), installed only when missing (binutils:
# `strip`, for the native extensions' debug sections).
IMAGE_PACKAGES := buildah runc binutils
system-packages:
	@missing=""; for p in $(IMAGE_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing$$missing"; \
	  apt-get -o DPkg::Lock::Timeout=600 update -q && \
	  apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends $$missing; \
	fi

## mutate: mutation testing of the pure core (kernel and the ledger's pure modules; mutmut,
## configured in pyproject.toml [tool.mutmut]): prints the score per package and every
## surviving mutant not explained in tests/mutants-equivalent.txt (then exits 1). Slow
## (about two hours from scratch on two busy cores; a re-run tests only what changed), so not
## part of `make test`; the suite checks the configuration (tests/devenv/test_mutation_config.py).
MUTATE_JOBS ?= 2
mutate: $(STAMP)
	$(BIN)/python -m agentrun_dev.mutation --jobs $(MUTATE_JOBS) .

## bench: agentrun beside the NATS floor (nats-py on loopback) and the in-process peer (the
## OpenAI Agents SDK's Runner, in a virtualenv of its own) on one machine in one invocation:
## overhead per turn, throughput, CPU per turn of every process, and the ratios
## (bench/bench_compare.py; bench/README.md says how long it takes and how to read it).
bench: $(STAMP)
	cd bench && ../$(BIN)/python bench_compare.py

## bench-quick: the same, small (20 runs x 10 turns): a change's cost at a glance.
bench-quick: $(STAMP)
	cd bench && ../$(BIN)/python bench_compare.py --quick

## bench-all: `make bench`, then every other benchmark of bench/ that needs no node.
bench-all: bench
	cd bench && ../$(BIN)/python bench_overhead.py
	cd bench && ../$(BIN)/python bench_throughput.py
	cd bench && ../$(BIN)/python bench_operator_memory.py
	cd bench && ../$(BIN)/python bench_kernel.py
	cd bench && ../$(BIN)/python bench_instrumentation.py
	cd bench && ../$(BIN)/python bench_ledger.py
	cd bench && ../$(BIN)/python bench_cpu.py
	cd bench && ../$(BIN)/python bench_fairness.py

## bench-ab REF=<git rev> [BENCH=bench_cpu.py] [N=3] [ARGS='--runs 20'] [OWN=1]: this tree
## against REF (built once per commit in the cache with its own virtualenv), the bench run in
## both alternately N times each; medians of every figure and this/REF. OWN=1 runs REF's own
## bench scripts (needed for refs before the closed bus).
BENCH ?= bench_cpu.py
N ?= 3
bench-ab: $(STAMP)
	@test -n "$(REF)" || { echo 'usage: make bench-ab REF=<git rev> [BENCH=bench_cpu.py] [N=3] [ARGS=...] [OWN=1]' >&2; exit 2; }
	cd bench && ../$(BIN)/python bench_ab.py --ref '$(REF)' --bench '$(BENCH)' --repeat $(N) $(if $(OWN),--own-bench) -- $(ARGS)

## bench-cluster: the chart on a real node (root): image size, time to a Ready node,
## helm install → first run Succeeded, pod memory with 1,000 AgentRuns.
bench-cluster: $(STAMP) system-packages node-packages
	$(BIN)/agentrun dev binaries --node
	cd bench && ../$(BIN)/python bench_cluster.py

clean: down
	rm -rf $(VENV) build devtools/build *.egg-info devtools/*.egg-info .pytest_cache .mypy_cache .ruff_cache
