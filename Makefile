# The two commands a newcomer needs: `make run` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
EXTRAS ?= test,fast,mcp
PORT ?= 8765

.PHONY: setup run test lint typecheck unit bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[$(EXTRAS)]'
	$(BIN)/python -m compileall -q src
	touch $(STAMP)

# Node MCP peers for the tests (the reference "everything" server, the TypeScript SDK client).
NODE_STAMP := node_modules/.package-lock.json
$(NODE_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error

setup: $(STAMP) $(NODE_STAMP)

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
