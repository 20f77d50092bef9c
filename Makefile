# Two commands for a fresh clone:  `make pipeline` (set up + dvc repro)  and  `make test` (set up + tests).
PY      ?= python3
VENV    := .venv
BIN     := $(CURDIR)/$(VENV)/bin
STAMP   := $(VENV)/.installed
export PATH := $(BIN):$(PATH)

.PHONY: setup pipeline pipeline-offline test test-fast ui clean-results

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $(STAMP)

pipeline: setup          ## download Fashion-MNIST, sweep every strategy, analyse
	dvc repro

pipeline-offline: setup  ## the same on the explicit synthetic stand-in (no network needed)
	dvc exp run -S data.source=synthetic

test: setup              ## the whole suite (CPU, a few minutes)
	$(BIN)/python -m pytest

test-fast: setup
	$(BIN)/python -m pytest -m "not slow"

ui: setup                ## MLflow UI on http://127.0.0.1:5000
	$(BIN)/python -m pipeline ui

clean-results:           ## forget sweeps and runs (the MLflow/Optuna stores in mlruns/ too)
	rm -rf results runs mlruns/mlflow.db mlruns/optuna.db mlruns/artifacts
