"""`cancel_and_wait`'s own behaviour: a task that never ends fails the test, naming where it waits.

That it ends a task which lost a cancellation is `cancel_until_done`'s (tests/test_tasks.py)."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.cancel import cancel_and_wait


async def test_a_task_that_never_ends_is_reported() -> None:
    released = asyncio.Event()

    async def ignores_every_cancellation() -> None:
        while not released.is_set():
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                asyncio.current_task().uncancel()  # type: ignore[union-attr]

    task = asyncio.create_task(ignores_every_cancellation())
    await asyncio.sleep(0)
    with pytest.raises(AssertionError, match=r"still runs 0\.3 s after its cancellation"):
        await cancel_and_wait(task, within_s=0.3)
    released.set()  # it ends by itself, before the loop does
    await asyncio.wait_for(task, timeout=10)
