"""Callbacks through which the election tells the rest of the program what happened."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable

from elector.election.outcome import CycleOutcome, StepDownReason
from elector.lease import Holder, Lease


def _ignore_outcome(outcome: CycleOutcome) -> None:
    return None


def _ignore_holder(holder: Holder | None) -> None:
    return None


async def _ignore_lease(lease: Lease) -> None:
    return None


async def _ignore_reason(reason: StepDownReason) -> None:
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class ElectionHooks:
    """What the election calls. Every hook is optional.

    `on_started_leading` is awaited right after a grant; `on_stopped_leading` is awaited at the
    start of every step-down, before the lease is released, so leader work is stopped while the
    lease is still ours. A hook that raises is logged by the caller's wrapper, never fatal to
    the election.
    """

    on_outcome: Callable[[CycleOutcome], None] = _ignore_outcome
    on_new_leader: Callable[[Holder | None], None] = _ignore_holder
    on_started_leading: Callable[[Lease], Awaitable[None]] = _ignore_lease
    on_stopped_leading: Callable[[StepDownReason], Awaitable[None]] = _ignore_reason
