# `make` (= `make demo`) sets everything up and runs the demo; `make test` is what CI runs (.ci/run).
# Everything runs from .venv, created and kept up to date by scripts/bootstrap.sh.

VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.DEFAULT_GOAL := demo
.PHONY: demo test lint bench setup system-deps clean distclean

demo: $(STAMP)
	$(BIN)/elector demo

test: lint system-deps
	$(BIN)/pytest

# promtool (for the alerting rules' tests), installed with apt when run as root.
system-deps:
	bash scripts/system-deps.sh

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: $(STAMP)
	$(BIN)/python -m bench

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/bootstrap.sh
	VENV=$(VENV) bash scripts/bootstrap.sh
	touch $@

clean:
	rm -rf build dist .mypy_cache .ruff_cache .pytest_cache .import_linter_cache ./*.egg-info
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
