"""Ending asyncio tasks that may lose a cancellation, and saying where a stuck one waits.

CPython 3.11's `asyncio.wait_for` returns the inner result and drops the outer task's cancellation
when both land in the same loop iteration (python/cpython#86296; 3.12 rebuilt wait_for on
asyncio.timeout). redis-py wraps every write in wait_for when the client has a socket timeout, as
all of elector's clients do: with a real redis-server, most tasks cancelled while renewing go on
as if never cancelled (docs/design.md, "Measured figures behind the code"). So whatever
stops a task that may be inside a Redis call sends the cancellation again until the task is done,
within a bound, and names what is still running at the bound (`cancel_until_done`), rather than
cancelling once and awaiting: that await can have no end.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

#: How long one cancellation is given before it is sent again.
RESEND_S = 0.05
#: How deep `await_chain` follows awaits (a chain is a handful; this only bounds a cycle).
MAX_AWAIT_DEPTH = 64

_FRAME_ATTRIBUTES = ("cr_frame", "gi_frame", "ag_frame")
_AWAITED_ATTRIBUTES = ("cr_await", "gi_yieldfrom", "ag_await")


async def cancel_until_done(
    tasks: Iterable[asyncio.Task[Any]], *, within_s: float, resend_s: float = RESEND_S
) -> set[asyncio.Task[Any]]:
    """Cancel each task, again every `resend_s` while it runs, for at most `within_s`; the tasks
    still running then (each swallowed every cancellation) are returned, for the caller to name
    and leave behind. Outcomes are left to the caller: a task's exception is not retrieved here."""
    if within_s <= 0 or resend_s <= 0:
        raise ValueError(f"within_s ({within_s}) and resend_s ({resend_s}) must be positive")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        remaining_s = deadline - loop.time()
        if remaining_s <= 0:
            break
        _, pending = await asyncio.wait(pending, timeout=min(resend_s, remaining_s))
    return pending


def await_chain(task: asyncio.Task[Any]) -> list[str]:
    """Where a suspended task waits: each coroutine in its chain of awaits as `file:line in name`,
    outermost first, then what the innermost awaits (the future it sleeps on). `Task.get_stack()`
    shows only the outermost frame: a suspended coroutine's frame has no f_back. Read from another
    thread while the loop runs, it is a report, not a snapshot (a task may move on meanwhile)."""
    where: list[str] = []
    current: Any = task.get_coro()
    for _ in range(MAX_AWAIT_DEPTH):
        frame = next((f for f in (getattr(current, a, None) for a in _FRAME_ATTRIBUTES) if f), None)
        if frame is not None:
            code = frame.f_code
            where.append(f"{code.co_filename}:{frame.f_lineno} in {code.co_name}")
        awaited = next((n for n in (getattr(current, a, None) for a in _AWAITED_ATTRIBUTES) if n), None)
        if awaited is None:
            if frame is None:
                # A future's iterator or a C-level step: the task's own waiter says more. A private
                # attribute, read with a default, for a report only.
                waiter = getattr(task, "_fut_waiter", None)
                where.append(f"awaiting {waiter if waiter is not None else current!r}"[:400])
            break
        current = awaited
    return where
