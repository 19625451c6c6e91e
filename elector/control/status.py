"""`elector status`: who holds a lock and who contends for it, read without contending.

`--watch` follows the lock live: one line per transition, from the lock's announcements
(acquired, released, handoff requested) and from a look every WATCH_POLL_S, which also catches
what announcements miss (an expired lease, a lost message, candidates joining or leaving).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from elector.backend import RedisLeaseBackend, RedisSettings
from elector.control.client import ControlError, lock_backend, printable, redis_settings, run_command, who
from elector.lease import Candidate, Holder, LeaseBackendError, LeaseEvent, LeaseEventKind, Observation

#: How often `--watch` looks at the lock itself, besides listening to its announcements.
WATCH_POLL_S = 1.0


class StatusError(ControlError):
    """The status could not be read. `usage` marks bad settings (exit 2) apart from Redis errors."""


async def observe(settings: RedisSettings, *, lock: str) -> tuple[Observation, list[Candidate]]:
    async with lock_backend(settings, lock=lock, purpose="status") as backend:
        return await _look(backend)


def candidate_document(candidate: Candidate) -> dict[str, object]:
    return {
        "identity": candidate.identity,
        "priority": candidate.priority,
        "last_seen_ms_ago": candidate.last_seen_ms_ago,
    }


def status_document(
    observation: Observation, *, lock: str, candidates: Sequence[Candidate] = ()
) -> dict[str, object]:
    holder = observation.holder
    return {
        "lock": lock,
        "held": holder is not None or observation.unrecognised_value or bool(observation.unknown_protocol),
        "holder": None if holder is None else holder.identity,
        "fencing_token": None if holder is None else holder.fencing_token,
        "remaining_ms": observation.remaining_ms,
        "unrecognised_value": observation.unrecognised_value,
        "last_fencing_token": observation.last_fencing_token,
        "quiet_period_remaining_ms": observation.quiet_remaining_ms,
        "unknown_protocol": observation.unknown_protocol,
        "candidates": [candidate_document(c) for c in candidates],
    }


def _headline(observation: Observation, *, lock: str) -> str:
    holder = observation.holder
    remaining = observation.remaining_ms
    expiry = "no expiry" if remaining is None else f"expires in {remaining / 1000:.3f}s unless renewed"
    if holder is not None:
        return f"lock {lock}: held by {who(holder)}, {expiry}"
    if observation.unrecognised_value:
        return f"lock {lock}: held by a value elector did not write ({expiry})"
    if observation.unknown_protocol:
        return f"lock {lock}: held (its data is from an elector protocol this release does not speak)"
    return f"lock {lock}: free"


def format_status(observation: Observation, *, lock: str, candidates: Sequence[Candidate] = ()) -> str:
    lines = [_headline(observation, lock=lock)]
    if observation.unknown_protocol:
        lines.append(
            f"  unknown protocol: {printable(observation.unknown_protocol)}; this release leaves the "
            "lock alone and counts it as held: upgrade it (docs/protocol.md)"
        )
    if observation.quiet_remaining_ms:
        lines.append(
            f"  quiet period: no grants for {observation.quiet_remaining_ms / 1000:.3f}s "
            "(Redis lost its data or the lock is new)"
        )
    last = observation.last_fencing_token
    counter = (
        "missing (a new lock, or Redis lost its data)"
        if last is None
        else f"{last} (the next grant gets more)"
    )
    lines.append(f"  fencing counter: {counter}")
    if not candidates:
        lines.append("  candidates: none registered")
    else:
        lines.append(f"  candidates ({len(candidates)}, highest priority first):")
        width = max(len(printable(c.identity)) for c in candidates)
        lines.extend(
            f"    {printable(c.identity):<{width}}  priority {c.priority:<4}  "
            f"last seen {c.last_seen_ms_ago / 1000:.1f}s ago"
            for c in candidates
        )
    return "\n".join(lines)


def _settings(redis_url: str, *, password_file: Path | None, timeout_s: float) -> RedisSettings:
    return redis_settings(
        redis_url,
        password_file=password_file,
        request_timeout_s=timeout_s,
        timeout_flag="--timeout",
        error=StatusError,
    )


def read_status(
    redis_url: str, *, password_file: Path | None, lock: str, timeout_s: float, as_json: bool
) -> str:
    settings = _settings(redis_url, password_file=password_file, timeout_s=timeout_s)
    observation, candidates = run_command(
        observe(settings, lock=lock), redis_url=redis_url, error=StatusError
    )
    if as_json:
        return json.dumps(status_document(observation, lock=lock, candidates=candidates))
    return format_status(observation, lock=lock, candidates=candidates)


# -- --watch -------------------------------------------------------------------------------------


class _Watcher:
    """Turns announcements and periodic looks into one line per transition (text or JSON)."""

    def __init__(self, *, lock: str, as_json: bool, emit: Callable[[str], None]) -> None:
        self._lock = lock
        self._as_json = as_json
        self._emit = emit
        self._holder: Holder | None = None
        self._unrecognised = False
        self._priorities: dict[str, int] = {}
        self._failing = False

    def _line(self, event: str, text: str, **fields: object) -> None:
        now = datetime.datetime.now().astimezone()
        if self._as_json:
            document = {"at": now.isoformat(timespec="milliseconds"), "lock": self._lock, "event": event}
            self._emit(json.dumps({**document, **fields}))
        else:
            self._emit(f"{now:%H:%M:%S}.{now.microsecond // 1000:03d} {text}")

    def _holder_fields(self, holder: Holder | None) -> dict[str, object]:
        return {
            "holder": None if holder is None else holder.identity,
            "fencing_token": None if holder is None else holder.fencing_token,
        }

    def start(self, observation: Observation, candidates: Sequence[Candidate]) -> None:
        self._holder, self._unrecognised = observation.holder, observation.unrecognised_value
        self._priorities = {c.identity: c.priority for c in candidates}
        listed = ", ".join(f"{printable(c.identity)} ({c.priority})" for c in candidates) or "none"
        document = status_document(observation, lock=self._lock, candidates=candidates)
        del document["lock"]
        self._line("state", f"{_headline(observation, lock=self._lock)}; candidates: {listed}", **document)

    def announced(self, event: LeaseEvent) -> None:
        holder = event.holder
        fields = {**self._holder_fields(holder), "source": "announcement"}
        if event.kind is LeaseEventKind.HANDOFF:
            self._line("handoff", f"handoff requested: {who(holder)} is asked to hand over", **fields)
        elif event.kind is LeaseEventKind.ACQUIRED:
            if self._holder is None or holder.fencing_token > self._holder.fencing_token:
                self._holder, self._unrecognised = holder, False
                self._line("acquired", f"acquired by {who(holder)}", **fields)
        elif event.kind is LeaseEventKind.RELEASED and self._holder == holder:
            self._holder = None
            self._line("released", f"released by {who(holder)}", **fields)

    def polled(self, observation: Observation, candidates: Sequence[Candidate]) -> None:
        if self._failing:
            self._failing = False
            self._line("recovered", "Redis answers again")
        holder, unrecognised = observation.holder, observation.unrecognised_value
        if (holder, unrecognised) != (self._holder, self._unrecognised):
            previous = self._holder
            self._holder, self._unrecognised = holder, unrecognised
            fields = {**self._holder_fields(holder), "source": "poll"}
            if holder is not None:
                self._line("holder", f"now held by {who(holder)}", **fields)
            elif unrecognised:
                self._line("holder", "now held by a value elector did not write", **fields)
            else:
                ended = "" if previous is None else f" ({printable(previous.identity)}'s lease ended)"
                self._line("holder", f"now free{ended}", **fields)
        self._candidates_changed({c.identity: c.priority for c in candidates})

    def _candidates_changed(self, now: dict[str, int]) -> None:
        before, self._priorities = self._priorities, now
        for name in sorted(now.keys() - before.keys()):
            text = f"candidate joined: {printable(name)} (priority {now[name]})"
            self._line("candidate_joined", text, candidate=name, priority=now[name])
        for name in sorted(before.keys() - now.keys()):
            self._line("candidate_left", f"candidate left: {printable(name)}", candidate=name)
        for name in sorted(now.keys() & before.keys()):
            if now[name] != before[name]:
                text = f"candidate {printable(name)}: priority {before[name]} -> {now[name]}"
                self._line("candidate_priority", text, candidate=name, priority=now[name])

    def failed(self, exc: LeaseBackendError) -> None:
        if not self._failing:
            self._failing = True
            self._line("error", f"error: {exc} (still watching)", error=str(exc))


async def _look(backend: RedisLeaseBackend) -> tuple[Observation, list[Candidate]]:
    return await backend.observe(), await backend.candidates()


async def watch(settings: RedisSettings, *, lock: str, as_json: bool, emit: Callable[[str], None]) -> None:
    """Follow the lock until cancelled. The first look's error is raised; later ones are shown."""
    async with lock_backend(settings, lock=lock, purpose="status-watch") as backend:
        subscription = None
        try:
            watcher = _Watcher(lock=lock, as_json=as_json, emit=emit)
            watcher.start(*await _look(backend))
            next_look = time.monotonic() + WATCH_POLL_S
            while True:
                if subscription is None:
                    try:
                        subscription = await backend.subscribe(keepalive_s=30.0)
                    except LeaseBackendError as exc:
                        watcher.failed(exc)  # the periodic look still catches every change
                wait_s = max(0.0, next_look - time.monotonic())
                if subscription is None:
                    await asyncio.sleep(wait_s)
                else:
                    try:
                        event = await subscription.next_event(wait_s)
                    except LeaseBackendError as exc:
                        watcher.failed(exc)
                        await subscription.close()
                        subscription = None
                    else:
                        if event is not None:
                            watcher.announced(event)
                if time.monotonic() >= next_look:
                    next_look = time.monotonic() + WATCH_POLL_S
                    try:
                        watcher.polled(*await _look(backend))
                    except LeaseBackendError as exc:
                        watcher.failed(exc)
        finally:
            if subscription is not None:
                await subscription.close()


def watch_status(
    redis_url: str,
    *,
    password_file: Path | None,
    lock: str,
    timeout_s: float,
    as_json: bool,
    emit: Callable[[str], None],
) -> None:
    """`status --watch`: returns on SIGINT or SIGTERM; raises StatusError if the first look fails."""
    settings = _settings(redis_url, password_file=password_file, timeout_s=timeout_s)

    async def until_signalled() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        watching = asyncio.create_task(watch(settings, lock=lock, as_json=as_json, emit=emit))
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait({watching, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not watching.done():
            watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching  # re-raises the first look's error

    run_command(until_signalled(), redis_url=redis_url, error=StatusError)
