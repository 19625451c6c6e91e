"""`elector handoff`: ask the current leader of a lock to hand it over, and wait until it has.

The leader is asked through Redis (a handoff key plus an announcement on the lock's channel):
it stops its work and releases. Meanwhile the handoff excludes the old leader from the lock,
and with `--to` every candidate but the named one, for `window` (so the target wins the race).
This command then waits, listening to the announcements and looking at the lock with back-off,
until the lock is held by the target (or, without `--to`, by anyone but the old leader).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

from elector.backend import HandoffRefusedError, RedisLeaseBackend
from elector.backoff import Backoff
from elector.control.client import ControlError, lock_backend, printable, redis_settings, run_command, who
from elector.lease import Handoff, Holder, LeaseBackendError, LeaseEventKind, LeaseEventSubscription

#: Default stand-back window: long enough for a leader to notice, stop its work and release.
DEFAULT_WINDOW_S = 10.0
#: Longest window accepted: while it lasts a vanished target keeps everyone else waiting.
MAX_WINDOW_S = 600.0
#: Back-off of the looks at the lock while waiting (announcements usually come first).
_FIRST_LOOK_S = 0.05
_MAX_LOOK_S = 1.0


class HandoffError(ControlError):
    """The handoff could not be asked for. `usage` marks bad settings (exit 2)."""


@dataclasses.dataclass(frozen=True, slots=True)
class HandoffResult:
    """What happened: `done` (exit 0) or not (exit 1), and a line saying so."""

    done: bool
    message: str


def default_window_s(timeout_s: float) -> float:
    """The window when none is given: DEFAULT_WINDOW_S, but no longer than we wait."""
    return min(DEFAULT_WINDOW_S, timeout_s)


def _completed(holder: Holder | None, *, previous: Holder, to: str | None) -> bool:
    if holder is None:
        return False
    if to is not None:
        return holder.identity == to
    return holder.identity != previous.identity


async def _subscribe(backend: RedisLeaseBackend) -> LeaseEventSubscription | None:
    # Announcements only make the wait shorter; without channel rights we rely on the looks.
    try:
        return await backend.subscribe(keepalive_s=60.0)
    except LeaseBackendError:
        return None


async def hand_over(
    backend: RedisLeaseBackend,
    *,
    to: str | None,
    timeout_s: float,
    window_s: float,
    progress: Callable[[str], None],
) -> HandoffResult:
    """Ask for the handoff and wait for it; raises LeaseBackendError when Redis fails us."""
    lock = backend.lock
    if to is not None:
        live = await backend.candidates()
        if to not in {c.identity for c in live}:
            listed = ", ".join(f"{printable(c.identity)} (priority {c.priority})" for c in live)
            return HandoffResult(
                done=False,
                message=f"lock {lock}: {printable(to)} is not a live candidate; live candidates: "
                + (listed or "none"),
            )
    started = time.monotonic()
    deadline = started + timeout_s
    # Subscribe before asking, so the target's "acquired" cannot slip by between the two.
    subscription = await _subscribe(backend)
    try:
        try:
            handoff = await backend.request_handoff(to=to, window_ms=max(1, round(window_s * 1000)))
        except HandoffRefusedError as exc:
            return HandoffResult(done=False, message=f"lock {lock}: {exc}")
        if handoff is None:
            return HandoffResult(done=False, message=f"lock {lock}: nothing to hand off (no leader)")
        previous = await _previous_holder(backend, handoff)
        target = "anyone else" if to is None else printable(to)
        progress(
            f"lock {lock}: asked {printable(handoff.from_identity)} to hand over to {target}; "
            f"waiting up to {timeout_s:g}s"
        )
        holder = await _wait(backend, subscription, previous=previous, to=to, deadline=deadline)
    finally:
        if subscription is not None:
            await subscription.close()
    elapsed = time.monotonic() - started
    if holder is not None and _completed(holder, previous=previous, to=to):
        return HandoffResult(
            done=True,
            message=f"lock {lock}: handed over from {printable(previous.identity)} to {who(holder)} "
            f"in {elapsed:.2f}s",
        )
    if holder is None:
        seen = "the lock is free"
    elif holder.identity == previous.identity:
        seen = f"still held by {who(holder)} (did the leader get the request? is it an older elector?)"
    else:
        seen = f"held by {who(holder)}"
    return HandoffResult(
        done=False, message=f"lock {lock}: the handoff did not complete within {timeout_s:g}s: {seen}"
    )


async def _previous_holder(backend: RedisLeaseBackend, handoff: Handoff) -> Holder:
    observation = await backend.observe()
    if observation.holder is not None and observation.holder.identity == handoff.from_identity:
        return observation.holder
    # It changed hands already (the token only matters for the messages).
    return Holder(identity=handoff.from_identity, fencing_token=0)


async def _wait(
    backend: RedisLeaseBackend,
    subscription: LeaseEventSubscription | None,
    *,
    previous: Holder,
    to: str | None,
    deadline: float,
) -> Holder | None:
    """Wait until the handoff completed or `deadline`; returns the last holder seen."""
    pauses = Backoff(base_s=_FIRST_LOOK_S, cap_s=_MAX_LOOK_S)
    while True:
        holder = (await backend.observe()).holder
        now = time.monotonic()
        if _completed(holder, previous=previous, to=to) or now >= deadline:
            return holder
        wake = min(deadline, now + pauses.failed())  # one more look that did not see it done
        while subscription is not None and (remaining_s := wake - time.monotonic()) > 0:
            try:
                event = await subscription.next_event(remaining_s)
            except LeaseBackendError:
                subscription = None  # keep waiting on the looks alone
                break
            # An announcement is only a hint: the look at the top of the loop confirms it.
            if (
                event is not None
                and event.kind is LeaseEventKind.ACQUIRED
                and _completed(event.holder, previous=previous, to=to)
            ):
                break
        if subscription is None:
            await asyncio.sleep(max(0.0, wake - time.monotonic()))


def run_handoff(
    redis_url: str,
    *,
    password_file: Path | None,
    lock: str,
    to: str | None,
    timeout_s: float,
    window_s: float | None,
    request_timeout_s: float = 2.0,
    progress: Callable[[str], None],
) -> HandoffResult:
    """The `elector handoff` command; raises HandoffError for bad settings or Redis failures."""
    settings = redis_settings(
        redis_url,
        password_file=password_file,
        request_timeout_s=request_timeout_s,
        timeout_flag=None,  # --timeout is the wait for the handoff, not a request's
        error=HandoffError,
    )
    window = default_window_s(timeout_s) if window_s is None else window_s

    async def go() -> HandoffResult:
        async with lock_backend(settings, lock=lock, purpose="handoff") as backend:
            return await hand_over(backend, to=to, timeout_s=timeout_s, window_s=window, progress=progress)

    return run_command(go(), redis_url=redis_url, error=HandoffError)
