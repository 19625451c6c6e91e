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

    `on_stopped_leading` is "always, once", as client-go's OnStoppedLeading:

    * each term (each `on_started_leading`) is closed by exactly one call, with the reason it
      ended: at its step-down, or with `SHUTDOWN` when the run ends (or is cancelled) while it
      is open;
    * a run that ends without ever leading makes one call with `SHUTDOWN` as it ends, so cleanup
      written in the hook always runs; a run that led makes no extra call at its end (its terms'
      calls closed it). So every run that ended has called it at least once. A caller must
      therefore accept a call with no term open (nothing to stop);
    * a call that raises counts as made: the work may still run, so that step-down does not
      release the lease (outcome RELEASE_WITHHELD; see machine.py) and the hook is not called
      again for that term. A raise from the call that closes a run that never led is only logged;
    * the one exception to "once": a call cut short by cancelling the run (it never returned) is
      made again, with `SHUTDOWN`, by the run's cleanup, so that the work is still told to stop.
    """

    on_outcome: Callable[[CycleOutcome], None] = _ignore_outcome
    on_new_leader: Callable[[Holder | None], None] = _ignore_holder
    on_started_leading: Callable[[Lease], Awaitable[None]] = _ignore_lease
    on_stopped_leading: Callable[[StepDownReason], Awaitable[None]] = _ignore_reason
