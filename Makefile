# Set-up, demo and test entry points. Override the PyTorch pin with `make TORCH_VERSION=...`.
PYTHON ?= python3
TORCH_VERSION ?= 2.13.0
TIMM_VERSION ?= 1.0.31
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(TORCH_VERSION)
# constraints.txt pins the environment of the default torch; another TORCH_VERSION may need other versions (torch 2.5
# and 2.6 require sympy 1.13.1) and installs what pip resolves.
CONSTRAINTS := $(if $(filter 2.13.0,$(TORCH_VERSION)),-c constraints.txt)

.PHONY: lock demo test generate bench bench-gpu gpu-wheels bench-backward train-demo latex-check mutation clean

# timm's tests run without torchvision (tests/timm_import.py stubs it): timm is installed alone,
# never with its torchvision requirement, which needs a CUDA torch. constraints.txt holds the versions the suite
# last passed with (`make lock` writes it): a fresh clone installs those, not whatever the index offers that day
# (NumPy 2.4.6's sin moved one Taylor test's step in session 46).
$(STAMP): pyproject.toml constraints.txt
	@echo "Installing splitformer with torch $(TORCH_VERSION) (CPU), transformers, timm and the test tools into $(VENV)" \
		"(about 2 minutes, once; pip is quiet)"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "torch==$(TORCH_VERSION)"
	$(BIN)/python -m pip install --quiet $(CONSTRAINTS) -e ".[torch,test,bench,docs]"
	$(BIN)/python -m pip install --quiet --no-deps "timm==$(TIMM_VERSION)"
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

# Each package's version in the environment the suite passed in ($(VENV)), but torch and timm (pinned above) and
# splitformer.
# Rewritten only where a version changed (a new file would reinstall .venv at the next make).
lock:
	@test -x $(BIN)/python || { echo "make lock: no $(VENV) to read (make test builds it)"; exit 2; }
	$(BIN)/python -m pip freeze --exclude-editable > $(VENV)/freeze.txt
	{ echo "# The versions \`make\` installs (pip constraints). Written by \`make lock\` from the suite's environment."; \
	  grep -v -i -E '^(torch|timm|splitformer)==' $(VENV)/freeze.txt; } > $(VENV)/constraints.txt
	cmp -s $(VENV)/constraints.txt constraints.txt || cp $(VENV)/constraints.txt constraints.txt

demo: $(STAMP)
	$(BIN)/splitformer derive post-ln --backend all --out generated
	$(BIN)/python tools/demo.py post-ln --out generated

# The suite runs on every core (pytest-xdist); TEST_JOBS=0 runs it in this process. Its Python processes keep
# their bytecode (__pycache__, ignored by git) even where the environment sets PYTHONDONTWRITEBYTECODE: each
# command the tests start, and each generated module they import again, would compile its sources anew.
# Workers steal queued tests from each other (--dist worksteal), since a few tests take 10-30 s: 696.7 s of pytest
# against 724.3 s with the default split in session 48 (one run each; runs vary by a few per cent).
TEST_JOBS ?= auto
test: $(STAMP)
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -n $(TEST_JOBS) --dist worksteal

generate: $(STAMP)
	$(BIN)/splitformer check --plots generated/plots > /dev/null
	$(BIN)/splitformer derive --all-builtins --backend all --out generated
	$(BIN)/splitformer derive pre-ln --activation gelu --backend all --out generated
	$(BIN)/splitformer derive post-ln --activation gelu --backend all --out generated

# NumPy-only training with the derived adjoint, checked against torch.autograd (one BLAS thread:
# the arrays are small, and idle BLAS threads only slow a shared machine down).
train-demo: $(STAMP)
	OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(BIN)/python tools/train_demo.py

# Training step of the generated Block: derived backward against autograd (one process per figure).
bench-backward: $(STAMP)
	$(BIN)/python bench/backward.py

# Every row of the performance issue in one table (bench/rows.py); shorten with
# `make bench BENCH_ARGS="--pairs 2 --seconds 0.5 --rows 'post-ln/*'"`.
BENCH_ARGS ?=
bench: $(STAMP)
	$(BIN)/python bench/decoding.py --check
	$(BIN)/python bench/benchmark.py $(BENCH_ARGS)

# The torch rows on a CUDA device (bench/gpu.py; it says so where none is present), with a Python whose torch is a
# CUDA build and splitformer installed in it (docs/reference/performance.md, GPU): `make bench-gpu GPU_PYTHON=python3`.
GPU_PYTHON ?= $(BIN)/python
bench-gpu:
	$(GPU_PYTHON) bench/gpu.py $(GPU_ARGS)

# What bench-gpu needs on a lent GPU machine without network whose Python (3.12) has torch but another transformers:
# splitformer's wheel and transformers' (the pinned version, with the packages it needs but numpy) in .whl/.
GPU_WHEEL_TAGS = --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
	--platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
gpu-wheels: $(STAMP)
	rm -rf .whl
	$(BIN)/python -m pip wheel --quiet --no-deps --no-build-isolation -w .whl .
	$(BIN)/python -m pip download --quiet $(GPU_WHEEL_TAGS) -d .whl "transformers==$$($(BIN)/python -c \
		'import transformers; print(transformers.__version__)')"
	rm -f .whl/numpy-*.whl
	du -sh .whl

# Render every emitted LaTeX form with KaTeX (needs node and npm; the suite's structural
# LaTeX checks run without them).
latex-check: $(STAMP)
	mkdir -p .cache/katex && cd .cache/katex && npm install --silent --no-save katex@0.16
	SPLITFORMER_KATEX=$(CURDIR)/.cache/katex $(BIN)/python -m pytest tests/test_cli_usage.py tests/test_api.py \
		-k "latex or render or repr"

# Mutants of every area but the verification code (MUTANTS per seed, drawn area by area) against
# `check` plus each area's fast tests; report in .cache/mutation/report.{md,json} (not part of `make test`).
MUTANTS ?= 40
SEEDS ?= 0
MUTATION_JOBS ?= 2
mutation: $(STAMP)
	$(BIN)/python tools/mutation.py --sample $(MUTANTS) --seeds $(SEEDS) --jobs $(MUTATION_JOBS)

clean:
	rm -rf $(VENV) .pytest_cache
