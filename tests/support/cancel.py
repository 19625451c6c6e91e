"""Cancel a task and wait for its end, also on CPython 3.11, where one cancellation can be lost
(elector/tasks.py says why and what was measured). A test helper that cancelled once and then
awaited hung until pytest's timeout (loaded run #25, tests/kube/test_operator_lease.py; its task
"cancelling" and still renewing)."""

from __future__ import annotations

import asyncio
from typing import Any

from elector.tasks import await_chain, cancel_until_done


async def cancel_and_wait(task: asyncio.Task[Any], *, within_s: float = 30.0) -> None:
    """Cancel `task` until it is done (each lost cancellation is sent again); its outcome is left
    to the caller. An AssertionError if it still runs after `within_s` (a bound on a hang)."""
    if await cancel_until_done([task], within_s=within_s):
        raise AssertionError(
            f"{task!r} still runs {within_s} s after its cancellation; it waits at "
            + "; ".join(await_chain(task))
        )
