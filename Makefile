# Two commands for a fresh clone:  `make pipeline` (set up + dvc repro)  and  `make test` (set up + tests).
PY      ?= python3
VENV    := .venv
BIN     := $(CURDIR)/$(VENV)/bin
STAMP   := $(VENV)/.installed
export PATH := $(BIN):$(PATH)

EXTRAS  := pipeline,download,test,slurm,dev

.PHONY: setup lock check-floor gpu-bundle doctor pipeline pipeline-offline stage-offline test test-fast typecheck lint ui dashboard plots \
        screenshots clean-results

setup: $(STAMP)

# pip's own progress (each package, a download bar) where a person watches (stderr a terminal); -q in CI and other
# logs, where that progress would be thousands of lines. Either way a line says first what comes and how long it takes.
PIP_QUIET = $(shell test -t 2 || echo -q)

# the exact tested set (constraints.txt) of the ranges pyproject.toml declares
$(STAMP): pyproject.toml constraints.txt
	@echo "make setup: installing the tested package set (constraints.txt: PyTorch and its CUDA libraries, MLflow," \
	  "Optuna, DVC; about 6.5 GB) into $(VENV): 1 to 4 minutes, once"
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install $(PIP_QUIET) --upgrade pip
	$(BIN)/python -m pip install $(PIP_QUIET) -c constraints.txt -e ".[$(EXTRAS)]"
	$(BIN)/python -m pipeline fit --count-ahead  # the memory model's counts, once: a later `fit` loads no torch
	touch $(STAMP)

lock:                    ## re-resolve pyproject.toml's ranges in a fresh venv and write constraints.txt
	rm -rf .venv-lock && $(PY) -m venv .venv-lock
	.venv-lock/bin/python -m pip install -q --upgrade pip
	.venv-lock/bin/python -m pip install -q -e ".[$(EXTRAS)]"
	{ sed -n '1,/^# do not need/p' constraints.txt; .venv-lock/bin/python -m pip freeze --exclude-editable; } > constraints.new
	mv constraints.new constraints.txt && rm -rf .venv-lock

FLOOR_TORCH       ?= 2.11.0
FLOOR_TORCHVISION ?= 0.26.0
# the PyPI wheel is the CUDA build (its device-property fields are checked too): about 0.5 GB plus CUDA libraries
check-floor:             ## fresh venv with the oldest supported PyTorch, then the project: torch kept, fast tests pass
	rm -rf .venv-floor && $(PY) -m venv .venv-floor
	.venv-floor/bin/python -m pip install -q --upgrade pip
	.venv-floor/bin/python -m pip install -q "torch==$(FLOOR_TORCH)" "torchvision==$(FLOOR_TORCHVISION)"
	.venv-floor/bin/python -m pip install -q -e ".[pipeline,test]"
	.venv-floor/bin/python -c "import torch, sys; v = torch.__version__.split('+')[0]; \
	  print('torch after installing the project:', torch.__version__); sys.exit(v != '$(FLOOR_TORCH)')"
	@echo "every torch attribute a GPU-only branch touches, against torch $(FLOOR_TORCH):"
	.venv-floor/bin/python -m pytest -q tests/architecture/test_torch_floor_signatures.py
	.venv-floor/bin/python -m pytest -m "not slow" -q --deselect tests/architecture/test_torch_floor_signatures.py

gpu-bundle: setup        ## what an air-gapped GPU node needs, in dist/gpu-bundle (+ .tar.gz), size printed
	$(BIN)/python -m pipeline.doctor.bundle --out dist/gpu-bundle

doctor: setup            ## does every strategy run and agree with single-device SGD on this host? (results/doctor/)
	$(BIN)/python -m pipeline doctor

# The stages DVC runs, asked before it starts with the arguments it gets ($(1)): each stage's `[pipeline] stage i/n`
# line and ETA count only those (a stage's own command cannot ask: DVC holds the repository's lock). Where DVC cannot
# say, the pipeline runs as it would without: each stage's ETA then counts every later stage.
PLAN = { plan=$$($(BIN)/python -m pipeline.cli.repro_plan $(1)) && export PARALLAX_STAGE_PLAN="$$plan" || :; }

pipeline: setup          ## download Fashion-MNIST, sweep every strategy, analyse
	@$(call PLAN) && dvc repro

# `dvc exp run -S` writes its value into params.yaml; OFFLINE puts the file back as it was (also on Ctrl-C or a
# failure), so the README's next command, and a later `make pipeline`, see the project's own settings. The synthetic
# setting lives in the experiment (`dvc exp show`); results/ and dvc.lock hold its run.
# $(1): more arguments for DVC (-s STAGE).
OFFLINE_SET = -S data.source=synthetic
OFFLINE = keep=$$(mktemp) && cp params.yaml "$$keep" && trap 'cp "$$keep" params.yaml; rm -f "$$keep"' EXIT && \
	  trap 'exit 130' INT TERM && $(call PLAN,$(OFFLINE_SET) $(1)) && \
	  dvc exp run $(OFFLINE_SET) $(1)
KEPT    = params.yaml is as it was: data.source=synthetic lives in the experiment above (dvc exp show); results/ hold its run, labelled synthetic.

pipeline-offline: setup  ## the same on the explicit synthetic stand-in (no network needed); params.yaml is kept as it was
	@$(call OFFLINE) && \
	  echo "$(KEPT) The answer is above; make ui opens every run (mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db)."

# One stage on the synthetic stand-in, as `make pipeline-offline` ran it: `dvc repro -s STAGE` alone takes params.yaml's
# data.source (fashion-mnist), so it reruns the stage on the real data. DVC reruns the stage only if something it reads
# changed (its code, params or inputs); nothing else runs.
stage-offline: setup     ## rerun one stage offline: make stage-offline STAGE='sweep@ddp' (or analyze, overlap, collectives, ...)
	@test -n "$(STAGE)" || { echo "Name the stage: make stage-offline STAGE='sweep@ddp' (dvc.yaml's stages:" \
	  "download, sweep@STRATEGY, overlap, collectives, analyze; all of them: make pipeline-offline)." >&2; exit 2; }
	@$(call OFFLINE,-s '$(STAGE)') && \
	  echo "$(KEPT)"

test: setup              ## the whole suite (CPU; 10 to 40 minutes on 2 cores: benchmarks/RESULTS.md, "How long the two commands take")
	$(BIN)/python -m pytest

test-fast: setup
	$(BIN)/python -m pytest -m "not slow"

typecheck: setup         ## mypy on the torch-free packages (config, records, analysis, catalog.py: pyproject's [tool.mypy])
	$(BIN)/mypy

lint: setup              ## what CI and pre-commit check before the tests: ruff check, ruff format --check, mypy
	$(BIN)/ruff check --no-cache .
	$(BIN)/ruff format --no-cache --check .
	$(BIN)/mypy

UI_PORT ?= 5000
# A bare `mlflow ui` opens MLflow 3's default ./mlflow.db, not the project's store, and no file in the project changes
# that: `make ui`, or `mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db` from the repository root.
ui: setup                ## MLflow UI on http://127.0.0.1:$(UI_PORT) over mlruns/mlflow.db (a bare `mlflow ui` opens ./mlflow.db, empty: use this, or mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db); prints the link that opens the runs table with our columns
	$(BIN)/python -m pipeline ui --port $(UI_PORT)

DASHBOARD_PORT ?= 8080
# OPTUNA_STORAGE (environment): the sweep.storage URL of a shared study; unset, the sweeps' mlruns/optuna.db. The URL
# reaches the dashboard through the environment, never a command line; `export OPTUNA_STORAGE=...` keeps it out of
# make's own argv and the shell's history too.
dashboard: setup         ## optuna-dashboard on http://127.0.0.1:8080 over the sweeps' Optuna store (mlruns/optuna.db)
	$(BIN)/python -m pipeline.cli.dashboard --port $(DASHBOARD_PORT)

# `dvc plots show` alone writes a page whose scripts come from a CDN: blank offline. This one inlines them (vega,
# vega-lite and vega-embed, vendored in pipeline/analysis/plots/vega/), so it opens anywhere; the PNGs in
# results/analysis/ need nothing at all.
PLOTS_DIR ?= results/dvc_plots
plots: setup             ## DVC's plots of every experiment as one offline HTML page (results/dvc_plots/index.html)
	$(BIN)/python -m pipeline.analysis.plots.dvc_template $(PLOTS_DIR)/offline-template.html
	$(BIN)/dvc plots show --html-template $(PLOTS_DIR)/offline-template.html -o $(PLOTS_DIR)
	@echo "open $(PLOTS_DIR)/index.html (no network needed); compare experiments: dvc plots diff EXP1 EXP2" \
	  "--html-template $(PLOTS_DIR)/offline-template.html -o $(PLOTS_DIR)"

# needs Chromium (apt-get install -y chromium) and Playwright ($(BIN)/pip install playwright); no browser download
screenshots: setup       ## the MLflow UI over mlruns/ in headless Chromium: runs table, a trial, compare, analysis -> docs/screenshots/
	$(BIN)/python tools/screenshots.py

clean-results:           ## forget sweeps and runs (the MLflow/Optuna stores in mlruns/ too)
	rm -rf results runs mlruns/mlflow.db mlruns/optuna.db mlruns/artifacts
