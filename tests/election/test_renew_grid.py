"""The renewal grid a daemon picks by its number of locks (cadence.renew_grid_s)."""

from __future__ import annotations

import random

import pytest

from elector.election.cadence import (
    MAX_RENEW_GRID_S,
    RENEW_GRID_S,
    RENEWALS_PER_GRID_POINT,
    next_renewal_at,
    renew_grid_s,
)


def test_the_grid_holds_about_the_same_number_of_renewals_a_point_within_its_bounds() -> None:
    assert renew_grid_s(1, renew_interval_s=3.0) == MAX_RENEW_GRID_S
    assert renew_grid_s(100, renew_interval_s=3.0) == MAX_RENEW_GRID_S
    grid = renew_grid_s(1000, renew_interval_s=3.0)
    assert RENEW_GRID_S < grid < MAX_RENEW_GRID_S
    assert grid * 1000 / 3.0 == pytest.approx(RENEWALS_PER_GRID_POINT)
    assert renew_grid_s(10_000, renew_interval_s=3.0) == RENEW_GRID_S
    assert renew_grid_s(100_000, renew_interval_s=3.0) == RENEW_GRID_S


@pytest.mark.parametrize("grid_s", [RENEW_GRID_S, 0.09, MAX_RENEW_GRID_S])
def test_renewals_fall_on_the_grid_never_later_than_the_interval(grid_s: float) -> None:
    rng = random.Random(7)
    for i in range(500):
        sent = 1000.0 + i * 0.0137
        for first in (True, False):
            due = next_renewal_at(sent, interval_s=3.0, jitter_share=0.1, first=first, rng=rng, grid_s=grid_s)
            assert due <= sent + 3.0
            assert due >= sent + 3.0 * (1 - (0.9 if first else 0.1)) - 1e-9
            assert due / grid_s == pytest.approx(round(due / grid_s), abs=1e-6)
