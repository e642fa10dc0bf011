# Each target creates .venv and installs what it needs by itself (idempotent: the stamp
# file is rebuilt only when pyproject.toml changes).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

export MEM0_TELEMETRY := False
export LANGSMITH_TRACING := false
export LANGCHAIN_TRACING_V2 := false
export ANONYMIZED_TELEMETRY := False

.PHONY: demo test lint typecheck pytest docs docs-strict bench fuzz clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -U "pip>=24"
	$(BIN)/python -m pip install -q --disable-pip-version-check -e ".[all,dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/demote demo

lint: $(STAMP)
	$(BIN)/ruff check demote langchain_demote llamaindex_demote tests bench docs tools
	$(BIN)/ruff format --check demote langchain_demote llamaindex_demote tests bench docs tools

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/python -m pytest -q

# The documentation site (docs/, Sphinx): open docs/_build/html/index.html.
docs: $(STAMP)
	$(BIN)/sphinx-build -q -b html docs docs/_build/html
	@echo "docs: docs/_build/html/index.html"

# What `make test` runs: from scratch, warnings are errors, every reference must resolve.
docs-strict: $(STAMP)
	$(BIN)/sphinx-build -q -E -W --keep-going -n -b html docs docs/_build/html

test: lint typecheck docs-strict pytest

bench: $(STAMP)
	$(BIN)/python -m bench

# The planner, engine and adapter property tests in random mode (CI's runs are
# derandomized): FUZZ_EXAMPLES examples per planner test on each seed, a share of it for
# the costlier tests. Prints each failure with its minimal example, or "no failures";
# fails on a find. See docs/development.md.
FUZZ_EXAMPLES ?= 500
FUZZ_SEEDS    ?= 1 2 3 4
fuzz: $(STAMP)
	$(BIN)/python -m tests.fuzz --examples $(FUZZ_EXAMPLES) --seeds $(FUZZ_SEEDS)

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache demote-demo docs/_build
