# Set-up, demo and test entry points. Override the PyTorch pin with `make TORCH_VERSION=...`.
PYTHON ?= python3
TORCH_VERSION ?= 2.13.0
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(TORCH_VERSION)

.PHONY: demo test generate bench mutation clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "torch==$(TORCH_VERSION)"
	$(BIN)/python -m pip install --quiet -e ".[torch,test,bench]"
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/splitformer derive post-ln --backend all --out generated
	$(BIN)/python -m splitformer.codegen.demo post-ln --out generated

test: $(STAMP)
	$(BIN)/python -m pytest

generate: $(STAMP)
	$(BIN)/splitformer check --plots generated/plots > /dev/null
	$(BIN)/splitformer derive --all-builtins --backend all --out generated
	$(BIN)/splitformer derive pre-ln --activation gelu --backend all --out generated

bench: $(STAMP)
	$(BIN)/python bench/benchmark.py

# A sample of mutants of symbolic/ and codegen/ against `check` plus the fast tests (not part of `make test`).
MUTANTS ?= 40
mutation: $(STAMP)
	$(BIN)/python -m splitformer.codegen.verification.mutation --sample $(MUTANTS)

clean:
	rm -rf $(VENV) .pytest_cache
