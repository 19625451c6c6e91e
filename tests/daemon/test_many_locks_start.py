"""How a daemon of many locks starts them (`start_spacing_s`) and picks its metrics mode."""

from __future__ import annotations

import pytest

from elector.daemon.service import MIN_START_SPACING_S, start_spacing_s
from elector.daemon.settings import SettingsError, build_settings


def test_a_single_lock_starts_at_once() -> None:
    assert start_spacing_s(1, ttl_s=10.0, renew_interval_s=3.0) == 0.0


def test_locks_are_spread_over_one_renew_interval() -> None:
    assert start_spacing_s(1000, ttl_s=10.0, renew_interval_s=3.0) * 1000 == pytest.approx(3.0)
    assert start_spacing_s(2, ttl_s=10.0, renew_interval_s=3.0) == pytest.approx(1.5)


def test_many_locks_start_no_faster_than_the_minimum_spacing_within_one_ttl() -> None:
    assert start_spacing_s(5000, ttl_s=10.0, renew_interval_s=3.0) == pytest.approx(MIN_START_SPACING_S)
    # Never longer than one ttl in all: start-up to all acquired stays within 2 ttl.
    assert start_spacing_s(10_000, ttl_s=2.0, renew_interval_s=0.6) * 10_000 == pytest.approx(2.0)


def test_metrics_are_per_lock_for_one_lock_and_aggregate_for_many_by_default() -> None:
    assert build_settings(lock="jobs", identity="a", redis_url="redis://h:6379/0").per_lock_metrics
    many = [f"l{i}" for i in range(101)]
    assert not build_settings(lock=many, identity="a", redis_url="redis://h:6379/0").per_lock_metrics
    assert build_settings(
        lock=many, identity="a", redis_url="redis://h:6379/0", metrics_per_lock="always"
    ).per_lock_metrics


def test_an_unknown_metrics_mode_names_its_flag() -> None:
    with pytest.raises(SettingsError) as caught:
        build_settings(lock="jobs", identity="a", redis_url="redis://h:6379/0", metrics_per_lock="x")
    assert caught.value.setting == "--metrics-per-lock"
