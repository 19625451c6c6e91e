"""The expiry check's bounds: measured slack below, none above."""

from __future__ import annotations

import time

import pytest

from tests.support.expiry import assert_remaining_within


def test_time_that_passed_since_the_write_is_allowed_for() -> None:
    written_after_s = time.monotonic() - 0.5  # as if the write went out half a second ago
    assert_remaining_within(2600, set_ms=3000, written_after_s=written_after_s, what="k")


def test_less_left_than_the_time_that_passed_explains_fails() -> None:
    with pytest.raises(AssertionError, match=r"^k: 2000 ms remaining, expected 3000 ms set"):
        assert_remaining_within(2000, set_ms=3000, written_after_s=time.monotonic(), what="k")


def test_more_left_than_was_set_fails_however_long_ago() -> None:
    with pytest.raises(AssertionError):
        assert_remaining_within(3001, set_ms=3000, written_after_s=time.monotonic() - 60, what="k")
