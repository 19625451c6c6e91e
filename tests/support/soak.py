"""Tests that repeat in the soak profile: once in CI, `RUNS_IN_SOAK` times with --faults-profile=soak.

A module opts in with `pytest_generate_tests = repeat_run_in_soak`; its tests that take a `run`
argument are then parametrized with the run numbers (1, 2, ...).
"""

from __future__ import annotations

import pytest

#: How often a daemon-level run repeats in the soak profile (the bugs they guard were intermittent).
RUNS_IN_SOAK = 3


def repeat_run_in_soak(metafunc: pytest.Metafunc) -> None:
    """Daemon-level repeats: once in CI; RUNS_IN_SOAK times with --faults-profile=soak."""
    if "run" in metafunc.fixturenames:
        soak = metafunc.config.getoption("--faults-profile") == "soak"
        metafunc.parametrize("run", range(1, (RUNS_IN_SOAK if soak else 1) + 1))
