"""`cancel_until_done` ends tasks that lose cancellations, as 3.11's wait_for loses them, and names
the ones that never end; `await_chain` says where a suspended task waits."""

from __future__ import annotations

import asyncio

import pytest

from elector.tasks import await_chain, cancel_until_done


def _drops_cancellations(count: int, dropped: list[int]) -> asyncio.Task[None]:
    """A task that survives its first `count` cancellations, as a Redis call inside 3.11's
    wait_for can (the cancellation is gone, the task goes on)."""

    async def body() -> None:
        while True:
            try:
                await asyncio.sleep(1)
            except asyncio.CancelledError:
                if len(dropped) >= count:
                    raise
                dropped.append(1)
                asyncio.current_task().uncancel()  # type: ignore[union-attr]

    return asyncio.create_task(body())


async def test_tasks_that_drop_cancellations_are_cancelled_again_until_done() -> None:
    first: list[int] = []
    second: list[int] = []
    tasks = [_drops_cancellations(1, first), _drops_cancellations(3, second)]
    await asyncio.sleep(0)
    left = await cancel_until_done(tasks, within_s=10, resend_s=0.01)
    assert left == set()
    assert all(task.cancelled() for task in tasks)
    assert (first, second) == ([1], [1, 1, 1])


async def test_a_task_that_swallows_every_cancellation_is_returned_at_the_bound() -> None:
    released = asyncio.Event()

    async def swallows_every_one() -> None:
        while not released.is_set():
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                asyncio.current_task().uncancel()  # type: ignore[union-attr]

    stubborn = asyncio.create_task(swallows_every_one())
    polite = _drops_cancellations(0, [])
    await asyncio.sleep(0)
    left = await cancel_until_done([stubborn, polite], within_s=0.3, resend_s=0.05)
    assert left == {stubborn}
    assert polite.cancelled()
    released.set()  # it ends by itself, before the loop does
    await asyncio.wait_for(stubborn, timeout=10)


async def test_done_tasks_are_left_as_they_are() -> None:
    async def returns() -> int:
        return 7

    task = asyncio.create_task(returns())
    await task
    assert await cancel_until_done([task], within_s=1) == set()
    assert task.result() == 7


@pytest.mark.parametrize(("within_s", "resend_s"), [(0, 0.05), (1, 0), (-1, 0.05)])
async def test_bounds_must_be_positive(within_s: float, resend_s: float) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        await cancel_until_done([], within_s=within_s, resend_s=resend_s)


async def test_the_await_chain_names_each_coroutine_then_the_future_it_sleeps_on() -> None:
    event = asyncio.Event()

    async def innermost_wait_here() -> None:
        await event.wait()

    async def middle() -> None:
        await innermost_wait_here()

    task = asyncio.create_task(middle())
    await asyncio.sleep(0)
    try:
        chain = await_chain(task)
    finally:
        event.set()
        await task
    names = [line.rsplit(" in ", 1)[-1] for line in chain[:-1]]
    assert names == ["middle", "innermost_wait_here", "wait"], chain
    assert chain[0].startswith(f"{__file__}:"), chain
    assert chain[-1].startswith("awaiting <Future pending"), chain
