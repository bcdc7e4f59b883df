# Two entry points for a fresh machine: `make demo` and `make test`.
# Each creates the virtual environment in .venv and installs what it needs on first use:
# the demo only the service and its local broker and Redis; the tests everything else too
# (Spark, Helm's engine, the browser driver, the fuzzers).

PYTHON ?= $(shell command -v python3.11 || command -v python3.12 || command -v python3.13 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: demo test check lint bench soak clean

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
		|| { echo "Python 3.11 or newer is required (found $$($(PYTHON) --version))" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# The demo does not need the SDK's compiled core: it skips the half minute compiling takes.
$(VENV)/.installed-demo: pyproject.toml | $(BIN)/python
	KAFKA_GATE_PURE_CORE=1 $(BIN)/python -m pip install --quiet -e '.[local]'
	@touch $@

# The engine's core is compiled at install (setup.py): editing it reinstalls, so the tests
# run the compiled core built from the sources they see.
CORE_SOURCES := setup.py $(addprefix sdk/engine/,_core.py _intake.py _results.py _buffer.py \
	_partition.py _scheduler.py _shards.py _record.py)

$(VENV)/.installed-dev: pyproject.toml $(CORE_SOURCES) | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $@ $(VENV)/.installed-demo

demo: $(VENV)/.installed-demo
	$(BIN)/gate demo

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# pytest exits 5 when it collected no test: that is a failure here, never a pass. The core's
# tests run twice: on the compiled core (with everything else), then on the pure-Python one.
CORE_TESTS := tests/sdk/test_core_properties.py tests/sdk/test_shell_machine.py \
	tests/sdk/test_shell_regressions.py tests/sdk/test_sizing.py tests/sdk/test_record.py
# The suite runs in 3 processes (pytest-xdist): a file's tests stay together in one, and so do
# the Spark tests and the fault scenarios (tests/conftest.py). PYTEST_WORKERS=0 runs it in this
# one process.
PYTEST_WORKERS ?= 3
test: lint
	@$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS); status=$$?; \
	if [ $$status -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi; \
	if [ $$status -ne 0 ]; then exit $$status; fi; \
	KAFKA_GATE_PURE_CORE=1 $(BIN)/python -m pytest $(CORE_TESTS); status=$$?; \
	if [ $$status -eq 5 ]; then echo "pytest collected no core tests: failing" >&2; exit 1; fi; \
	exit $$status

# The fast tier for every edit: lint, then the unit and property tests of the pure cores (the
# watermark, statuses and verdicts, the engine's scheduling and commit rules, offset maps, the
# shell's state machine over a simulated consumer), the configuration fuzzing and the layout
# test; nothing that starts a broker, Redis, Spark or a browser. `make test` runs all of them
# too.
CHECK_TESTS := tests/gate/test_config.py tests/gate/test_cycles.py \
	tests/gate/test_incremental.py tests/gate/test_lag.py tests/gate/test_operator_log.py \
	tests/gate/test_redis_layout.py tests/gate/test_report.py tests/gate/test_service.py \
	tests/gate/test_status.py tests/gate/test_true_from_the_start.py \
	tests/gate/test_verdict_truth.py tests/gate/test_watermark.py \
	tests/sdk/test_core_properties.py tests/sdk/test_offsets.py tests/sdk/test_record.py \
	tests/sdk/test_shell_machine.py tests/sdk/test_shell_regressions.py \
	tests/sdk/test_sizing.py tests/fuzz/test_config_fuzz.py tests/test_layout.py
# One process per core (pytest-xdist): these tests share nothing but the CPU.
check: lint
	@$(BIN)/python -m pytest -q -n auto $(CHECK_TESTS); status=$$?; \
	if [ $$status -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi; \
	exit $$status

bench: $(VENV)/.installed-dev
	$(BIN)/python -m bench.gate_bench
	$(BIN)/python -m bench.engine_bench
	$(BIN)/python -m bench.produce_bench
	$(BIN)/python -m bench.gating_bench
	$(BIN)/python -m bench.spark_bench
	$(BIN)/python -m bench.spark_small_batches

# The three-service scenario on real processes for SOAK_SECONDS (default 600), on each broker.
SOAK_SECONDS ?= 600
soak: $(VENV)/.installed-dev
	$(BIN)/python -m bench.soak --duration $(SOAK_SECONDS) --broker tansu
	$(BIN)/python -m bench.soak --duration $(SOAK_SECONDS) --broker noida

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
