# `make` (= `make demo`) sets everything up and runs the demo; `make test` is what CI runs (.ci/run);
# `make check` is the fast loop: lint and the in-process tests, no system package needed.
# Everything runs from .venv, created and kept up to date by scripts/bootstrap.sh.

VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.DEFAULT_GOAL := demo
.PHONY: demo check test test-loaded lint bench bench-setup setup system-deps clean distclean

demo: $(STAMP)
	$(BIN)/elector demo

# Four workers on two cores: most tests wait on lease timers, not on the CPU. Each worker takes
# its ports from a block of its own (elector/testing/redis_server.py), and every timing bound a
# test asserts is derived from what it measured, so the suite holds on a loaded machine.
TEST_WORKERS ?= 4

test: lint system-deps
	$(BIN)/pytest -n $(TEST_WORKERS) --dist worksteal

# The `check` tier: every test whose fixtures need no real component (no redis-server, promtool,
# podman, spin...; tests/support/tiers.py marks the tiers from the fixtures). Bytecode is cached
# even where the environment says not to: collecting rewrites every test module's asserts, and
# from the cache that is a third of the work (this loop is run again and again).
CHECK_WORKERS ?= 4

check: lint
	PYTHONDONTWRITEBYTECODE= $(BIN)/pytest -m check -n $(CHECK_WORKERS) --dist worksteal -q

# `make test` on a busy machine, reproduced anywhere (not part of `make test`): the same suite while
# two busy processes, a disk writer and the fault suite's soak (on OS-chosen ports, clear of the
# workers' port blocks) run beside it for its whole length, stopped when it ends (also on Ctrl-C).
test-loaded: $(STAMP)
	$(BIN)/python scripts/test_loaded.py

# promtool (for the alerting rules' tests), installed with apt when run as root.
system-deps:
	bash scripts/system-deps.sh

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: bench-setup
	$(BIN)/python -m bench

# The peers' servers (Debian packages, as root, only when missing) and clients (the `bench` extra).
bench-setup: $(STAMP)
	$(BIN)/python -m bench.servers.setup

setup: $(STAMP)

$(STAMP): pyproject.toml elector/_version.py scripts/bootstrap.sh
	VENV=$(VENV) bash scripts/bootstrap.sh
	touch $@

clean:
	rm -rf build dist .mypy_cache .ruff_cache .pytest_cache .import_linter_cache ./*.egg-info
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
