"""The renewal grid a daemon picks by its number of locks (elector/daemon/many_locks/grid.py)."""

from __future__ import annotations

import pytest

from elector.daemon.many_locks.grid import MAX_RENEW_GRID_S, RENEWALS_PER_GRID_POINT, renew_grid_s
from elector.election.policy import RENEW_GRID_S


def test_the_grid_holds_about_the_same_number_of_renewals_a_point_within_its_bounds() -> None:
    assert renew_grid_s(1, renew_interval_s=3.0) == MAX_RENEW_GRID_S
    assert renew_grid_s(100, renew_interval_s=3.0) == MAX_RENEW_GRID_S
    grid = renew_grid_s(1000, renew_interval_s=3.0)
    assert RENEW_GRID_S < grid < MAX_RENEW_GRID_S
    assert grid * 1000 / 3.0 == pytest.approx(RENEWALS_PER_GRID_POINT)
    assert renew_grid_s(10_000, renew_interval_s=3.0) == RENEW_GRID_S
    assert renew_grid_s(100_000, renew_interval_s=3.0) == RENEW_GRID_S
