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

.PHONY: demo test lint typecheck pytest bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -U "pip>=24"
	$(BIN)/python -m pip install -q --disable-pip-version-check -e ".[all,dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/demote demo

lint: $(STAMP)
	$(BIN)/ruff check demote langchain_demote llamaindex_demote tests bench
	$(BIN)/ruff format --check demote langchain_demote llamaindex_demote tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/python -m pytest -q

test: lint typecheck pytest

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache demote-demo
