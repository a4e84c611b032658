# distrl: make help lists the targets.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# the torch requirement pip installs first; pip options may follow (docs/install.md), e.g.
# make install TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help install train test test-long lint docs bench clean

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install $(TORCH)
	$(BIN)/pip install -e ".[dev,sweeps,docs]"
	touch $(STAMP)

install: $(STAMP) ## create .venv: torch first (make install TORCH=...: docs/install.md), then distrl with the dev, sweeps and docs extras

train: $(STAMP) ## distrl train with the defaults (Atari Pong); add ARGS="key=value ..."
	$(BIN)/distrl train $(ARGS)

test: $(STAMP) ## the test suite without the long tier (about 3 min on 2 AVX512-BF16 cores, 5.5 on AVX2-only ones: docs/testing.md)
	$(BIN)/python -m pytest $(ARGS)

test-long: $(STAMP) ## the second tier: end-to-end runs of more than 10 s each (CI runs both)
	$(BIN)/python -m pytest -m long --durations=10 $(ARGS)

lint: $(STAMP) ## ruff
	$(BIN)/ruff check distrl tests scripts examples

docs: $(STAMP) ## the documentation site into site/ (mkdocs build --strict: a broken link or docstring fails it)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: $(STAMP) ## throughput benchmark (scripts/bench.py); add ARGS="env=atari ..."
	$(BIN)/python scripts/bench.py $(ARGS)

clean: ## remove the venv and build files (keeps outputs/)
	rm -rf $(VENV) build site *.egg-info
