"""Check a key's remaining time against the expiry a write set, with slack measured, not guessed.

A test that checks "the write set a 3 s expiry" reads PTTL after the write. Between the write and
the read, time passes on the server's clock: on an idle machine a millisecond, on a loaded one
(run #19 of `make test-loaded`) 131 ms, so a fixed slack such as `2900 < pttl <= 3000` is a guess
that load breaks. The time the server can have counted is at most the time this process measured
from before it sent the write to after the read's reply, so the lower bound is derived from that:

    set_ms - elapsed_ms - ROUNDING_MS  <=  pttl  <=  set_ms

The upper bound stays exact: no amount of load makes a key live longer than it was set to.
"""

from __future__ import annotations

import time

import redis.asyncio

#: Redis keeps expiries as whole milliseconds and rounds both the write's clock and the read's.
ROUNDING_MS = 2


def started_s() -> float:
    """The moment to measure from: take it *before* sending the write that sets the expiry."""
    return time.monotonic()


async def assert_expiry_set(
    raw: redis.asyncio.Redis, key: str, *, set_ms: int, written_after_s: float
) -> int:
    """Assert `key`'s PTTL is what a write of `set_ms`, sent after `written_after_s`, leaves now.

    Returns the PTTL read, for a caller that checks more.
    """
    remaining_ms = int(await raw.pttl(key))
    assert_remaining_within(remaining_ms, set_ms=set_ms, written_after_s=written_after_s, what=key)
    return remaining_ms


def assert_remaining_within(remaining_ms: int, *, set_ms: int, written_after_s: float, what: str) -> None:
    """The same rule for a remaining time a reply reported (not read with PTTL here)."""
    elapsed_ms = (time.monotonic() - written_after_s) * 1000
    lowest_ms = set_ms - elapsed_ms - ROUNDING_MS
    assert lowest_ms <= remaining_ms <= set_ms, (
        f"{what}: {remaining_ms} ms remaining, expected {set_ms} ms set at most {elapsed_ms:.0f} ms ago"
    )
