"""The spin model of the lease protocol: the real model has no counterexample within its bounds,
and every mutant (one safety mechanism removed) has one. docs/model.md describes both.

spin and gcc are required: a missing one FAILS these tests with the install command (never a skip).
"""

from __future__ import annotations

import pytest

from tests.model.spin_runner import MUTANTS, REAL, Config, ToolMissing, check, require_tools
from tests.support.tiers import SPIN, needs


@pytest.fixture(scope="module")
@needs(SPIN)
def spin_tools() -> None:
    try:
        require_tools()
    except ToolMissing as exc:
        pytest.fail(str(exc))


# An exhaustive search is CPU work: on a loaded 2-core machine its wall time grows with the load
# (four configurations took over 120 s each beside other test runs). The bound is the runner's own
# budget per step (spin, gcc, pan: `check(timeout_s=600)`), not the suite's default per-test 120 s.
@pytest.mark.timeout(3 * 600 + 60)
@pytest.mark.parametrize("config", REAL, ids=[c.name for c in REAL])
@pytest.mark.usefixtures("spin_tools")
def test_model_holds(config: Config) -> None:
    result = check(config)
    assert result.errors == 0, f"{config.name}: {result.violation}\n{result.trail}"
    # A search cut short by the depth limit would prove nothing about the states it skipped.
    assert result.complete, f"{config.name}: the search did not complete"
    assert result.states > 1000, "suspiciously few states: the model does not run"


@pytest.mark.timeout(3 * 600 + 60)
@pytest.mark.parametrize("config", MUTANTS, ids=[c.name for c in MUTANTS])
@pytest.mark.usefixtures("spin_tools")
def test_mutant_is_caught(config: Config) -> None:
    # Mutants stop at their first counterexample: a cheaper build is enough.
    result = check(config, optimise="-O1")
    assert result.errors > 0, f"{config.name}: spin found no counterexample ({config.about})"
    assert result.violation.startswith("assertion violated"), result.violation
    assert result.trail, "the counterexample could not be replayed"
