"""The one back-off formula (elector/backoff.py) that every retry loop of elector uses."""

from __future__ import annotations

import random

import pytest

from elector.backoff import Backoff, backoff_delay_s


def test_the_delay_doubles_from_the_base_with_each_failure_in_a_row() -> None:
    delays = [backoff_delay_s(n, base_s=0.05, cap_s=100.0) for n in range(1, 6)]
    assert delays == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.8])


def test_no_failure_yet_waits_the_base() -> None:
    assert backoff_delay_s(0, base_s=0.4, cap_s=30.0) == pytest.approx(0.4)


def test_another_factor_grows_by_that_factor() -> None:
    delays = [backoff_delay_s(n, base_s=1.0, cap_s=100.0, factor=3.0) for n in range(1, 5)]
    assert delays == pytest.approx([1.0, 3.0, 9.0, 27.0])


def test_the_delay_stops_at_the_cap_even_after_days_of_failures() -> None:
    assert backoff_delay_s(7, base_s=1.0, cap_s=60.0) == 60.0  # 64 s would be past the cap
    assert backoff_delay_s(10**9, base_s=1.0, cap_s=60.0) == 60.0  # no overflow for a huge count


def test_jitter_draws_from_the_upper_share_of_the_delay_and_never_past_the_cap() -> None:
    rng = random.Random(42)
    delays = [backoff_delay_s(3, base_s=1.0, cap_s=3.0, jitter=0.5, rng=rng) for _ in range(2000)]
    assert all(1.5 <= d <= 3.0 for d in delays)  # 4 s capped to 3, then drawn from [1.5, 3]
    # Spread over the whole range, not stuck at one end: replicas must not retry in lock-step.
    assert min(delays) < 1.6 and max(delays) > 2.9


def test_jitter_is_reproducible_with_a_seeded_rng() -> None:
    first = [backoff_delay_s(n, base_s=0.1, cap_s=2.0, jitter=0.5, rng=random.Random(7)) for n in range(1, 8)]
    again = [backoff_delay_s(n, base_s=0.1, cap_s=2.0, jitter=0.5, rng=random.Random(7)) for n in range(1, 8)]
    assert first == again


def test_full_jitter_may_reach_zero_and_no_jitter_is_exact() -> None:
    rng = random.Random(1)
    delays = [backoff_delay_s(1, base_s=1.0, cap_s=1.0, jitter=1.0, rng=rng) for _ in range(500)]
    assert all(0.0 <= d <= 1.0 for d in delays) and min(delays) < 0.05
    assert backoff_delay_s(2, base_s=1.0, cap_s=10.0, jitter=0.0, rng=rng) == 2.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"base_s": -1.0, "cap_s": 1.0}, "non-negative"),
        ({"base_s": 1.0, "cap_s": -1.0}, "non-negative"),
        ({"base_s": 1.0, "cap_s": 1.0, "jitter": 1.5}, "jitter"),
        ({"base_s": 1.0, "cap_s": 1.0, "jitter": -0.1}, "jitter"),
    ],
)
def test_bad_values_are_refused_by_the_formula_and_the_class(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        backoff_delay_s(1, **kwargs)
    with pytest.raises(ValueError, match=message):
        Backoff(**kwargs)


def test_a_backoff_counts_failures_and_a_success_starts_it_over() -> None:
    backoff = Backoff(base_s=1.0, cap_s=60.0)
    assert [backoff.failed() for _ in range(8)] == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    backoff.succeeded()
    assert backoff.failures == 0
    assert backoff.failed() == 1.0


def test_a_run_that_lasted_reset_after_s_counts_as_a_success() -> None:
    backoff = Backoff(base_s=1.0, cap_s=60.0, reset_after_s=60.0)
    assert [backoff.after_run(5.0) for _ in range(3)] == [1.0, 2.0, 4.0]
    assert backoff.after_run(59.9) == 8.0  # not quite long enough: still growing
    assert backoff.after_run(60.0) == 1.0  # a healthy run: from the base again
    assert backoff.after_run(0.1) == 2.0


def test_without_reset_after_s_no_run_is_long_enough() -> None:
    backoff = Backoff(base_s=1.0, cap_s=60.0)
    assert [backoff.after_run(10**6) for _ in range(3)] == [1.0, 2.0, 4.0]


def test_a_backoff_with_jitter_uses_its_rng() -> None:
    one = Backoff(base_s=0.4, cap_s=30.0, jitter=0.5, rng=random.Random(3))
    two = Backoff(base_s=0.4, cap_s=30.0, jitter=0.5, rng=random.Random(3))
    delays = [one.failed() for _ in range(10)]
    assert delays == [two.failed() for _ in range(10)]
    assert all(0.5 * min(30.0, 0.4 * 2**n) <= d <= min(30.0, 0.4 * 2**n) for n, d in enumerate(delays))
