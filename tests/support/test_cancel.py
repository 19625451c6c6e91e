"""`cancel_and_wait` ends a task that lost a cancellation, as 3.11's wait_for loses them."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.cancel import cancel_and_wait


async def test_a_task_that_drops_a_cancellation_is_cancelled_again() -> None:
    dropped: list[int] = []

    async def drops_the_first() -> None:
        while True:
            try:
                await asyncio.sleep(1)
            except asyncio.CancelledError:
                if dropped:
                    raise
                dropped.append(1)  # what wait_for does on 3.11: the cancellation is gone
                asyncio.current_task().uncancel()  # type: ignore[union-attr]

    task = asyncio.create_task(drops_the_first())
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_and_wait(task), timeout=10)
    assert task.cancelled() and dropped == [1]


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
