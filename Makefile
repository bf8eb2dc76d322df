# The two entry points: `make demo` and `make test`. Both build .venv from nothing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test lint typecheck unit docs dist lint-docs-dist bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml integrations/langchain/pyproject.toml integrations/llama-index/pyproject.toml
	$(BIN)/python -m pip install --quiet \
		-e ".[redis,postgres,pandas,cli,prices]" \
		-e "integrations/langchain[demo,agents]" \
		-e "integrations/llama-index" \
		--group dev \
		--group integrations/langchain/pyproject.toml:dev \
		--group integrations/llama-index/pyproject.toml:dev
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/llm-resilience demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache

typecheck: $(STAMP)
	$(BIN)/mypy

# Two pytest-xdist workers (the suite is CPU-bound): each takes its own Redis database
# (conftest.py), the PostgreSQL tests each their own schema. --dist loadfile keeps each
# test file on one worker, so a module fixture (the packaging builds, the notebooks' run)
# runs once. PYTEST_WORKERS=0 runs the suite in one process.
PYTEST_WORKERS ?= 2
unit: $(STAMP)
	$(UNIT_ENV) $(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile

# First the checks, mypy (one core for a minute or two) beside lint, docs and dist in
# turn, each one's output printed whole when it ends; any failing stops make. Then the
# suite on both cores. The docs build before the suite, and tests/test_docs_site.py reads
# that site instead of building its own (it builds one when run any other way). dist never
# runs beside the suite: tests/test_packaging.py builds the same sdists, whose release
# trees setuptools makes in the source folder.
test: $(STAMP)
	$(MAKE) --no-print-directory --output-sync=target -j2 typecheck lint-docs-dist
	$(MAKE) --no-print-directory unit UNIT_ENV=LLM_RESILIENCE_DOCS_SITE=build/site

lint-docs-dist: $(STAMP)
	$(MAKE) --no-print-directory lint
	$(MAKE) --no-print-directory docs
	$(MAKE) --no-print-directory dist

# Not --quiet: it hides the warnings from --strict too, and the build then passes with them.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir build/site

# The three distributions (each sdist, then its wheel built from the sdist) in build/dist,
# checked as PyPI will: long description renders, metadata complete. The three build at
# once (each in its own isolated environment); any one failing fails the target.
dist: $(STAMP)
	rm -rf build/dist
	$(BIN)/python -m build --quiet --outdir build/dist . & core=$$!; \
	$(BIN)/python -m build --quiet --outdir build/dist integrations/langchain & langchain=$$!; \
	$(BIN)/python -m build --quiet --outdir build/dist integrations/llama-index & llama=$$!; \
	failed=0; for pid in $$core $$langchain $$llama; do wait $$pid || failed=1; done; \
	exit $$failed
	$(BIN)/twine check --strict build/dist/*

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info integrations/*/*.egg-info
