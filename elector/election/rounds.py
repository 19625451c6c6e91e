"""Rounds of renewals: the leaders of one daemon that fall due at the same grid point are renewed
together, by one callback, without waking the task of each.

A daemon of many locks renews each on a point of its renewal grid (cadence.py), so hundreds of
leases fall due at the very same instant. Renewed one election at a time, each renewal woke its
task, went through its cycle, a request timeout, the batcher's coroutine and back: most of a
renewal's CPU, while the batch script call that carries them all costs a few us per lease
(lua/batch.py). In a round, `RenewalRounds` sends the renewals of every lease due at a point in one
go (`RoundRenewable.renew_soon`: the same RENEW, batched as before) and, for each plain answer
(renewed, nothing to report), applies it to its election directly: the very update and outcome its
own leader cycle makes (`Election._renewed`). Anything else goes back to the election's own task,
which runs its leader cycle on that answer (`Election._leader_cycle`, `prefetched`): a lost lease,
a handoff asked, a rival, an identity clash, an error or a timeout are handled exactly as ever.

Every rule of a renewal holds: each lease is owner-checked by RENEW itself; its validity counts
from the round's send time; a lease whose validity end or renew deadline has come is not renewed
in a round at all (its own cycle steps down); a round waits for its answers no longer than the
request timeout and the earliest renew deadline among its leases, and an answer that did not come
is that election's timeout. An election is in a round only while its task waits for its next
renewal and nothing else (`Election._hold_for_rounds`); a stop, a resignation or an announcement
wakes its task, which takes its lease out of the rounds, and first waits for an answer already
under way, to use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable
from typing import Any, Protocol, cast

from elector.election.announcements import AnnouncementListener
from elector.election.core import RoundResult
from elector.election.outcome import State, StepDownReason
from elector.election.policy import should_yield
from elector.lease import Candidate, Handoff, Lease, Renewed, RenewResult


class RoundRenewable(Protocol):
    """A backend whose renewals can go out in rounds (the Redis backends with a batcher)."""

    @property
    def renews_in_rounds(self) -> bool: ...

    def renew_soon(self, lease: Lease, *, priority: int = 0) -> asyncio.Future[Any]: ...

    def renew_result(self, reply: asyncio.Future[Any]) -> RenewResult: ...


def is_plain(result: RenewResult | BaseException) -> bool:
    """A renewal with nothing to report: no handoff, no rival, no clash (a round applies it)."""
    return (
        isinstance(result, Renewed)
        and result.handoff is None
        and result.best_rival is None
        and not result.identity_clash
    )


class RoundMember(AnnouncementListener):
    """What a renewal's answer means for the term, and an election's side of the rounds (part of
    `Election`, machine.py)."""

    async def _hold_for_rounds(self, when: float, rounds: RenewalRounds) -> None:
        """Wait, as a leader, while the rounds renew the lease from `when` on; return when the task
        must run a cycle: a round handed it back (with its answer in `_prefetched`, or none: its
        own cycle then renews or steps down), a stop, a resignation, a lifted hold, or an
        announcement that calls for a renewal now."""
        rounds.enter(self, when)
        self._round_held = True
        try:
            while not self._stop_requested and self._resign_stand_back_s is None and not self._hold_lifted:
                if self._handed_back or self._handle_announcements():
                    break
                self._wakeup.clear()
                if self._events or self._resubscribed:
                    continue
                await self._wakeup.wait()
        finally:
            self._round_held = False
            self._handed_back = False
            rounds.leave(self)
        pending = self._round_result
        if pending is not None:
            # A renewal of ours is under way: its answer is this cycle's (a round resolves every
            # such future within its timeout).
            self._prefetched = await asyncio.shield(pending)

    def _apply_renewal(self, sent: float, result: Renewed) -> StepDownReason | None:
        """A renewal sent at `sent` succeeded: the lease is ours until `sent` + validity. Whether
        it should end the term anyway (a handoff asked, a better rival)."""
        self._last_renew_sent_at = sent
        self._valid_until = sent + self._timing.validity_s
        self._holder_expires_at = sent + self._timing.ttl_s
        return self._should_yield(result.handoff, result.best_rival, now=sent)

    def _should_yield(
        self, handoff: Handoff | None, rival: Candidate | None, *, now: float
    ) -> StepDownReason | None:
        """Whether a successful renewal should end our term (policy.should_yield)."""
        verdict = should_yield(
            handoff,
            rival,
            now=now,
            identity=self._identity,
            priority=self._priority,
            led_since=self._led_since,
            rival_seen_since=self._rival_seen_since,
            preempt_after_s=self._preempt_after_s,
            ttl_s=self._timing.ttl_s,
        )
        self._pending_handoff_to = verdict.hand_over_to
        self._rival_seen_since = verdict.rival_seen_since
        return verdict.reason

    def _may_renew_in_round(self, now: float) -> bool:
        """Whether a round may renew the lease now: a leader well within its validity and renew
        deadline (otherwise its own cycle steps down)."""
        return (
            self._state is State.LEADER
            and self._lease is not None
            and now < self._valid_until
            and now < self._last_renew_sent_at + self._timing.renew_deadline_s
        )

    def _renewed_in_round(self, sent: float, received: float, result: Renewed) -> float:
        """Apply a round's plain renewal as the leader cycle does; the next renewal's due time."""
        raise NotImplementedError  # Election (machine.py)

    def _hand_back(self, result: RoundResult | None) -> None:
        """Wake the task to run its own leader cycle (on `result`, when a round has one)."""
        self._prefetched = result
        self._handed_back = True
        self._wakeup.set()


class RenewalRounds:
    """The rounds of the elections of one daemon: one loop timer per grid point, one batched
    send per round (see the module doc). `clock` is the elections' clock."""

    def __init__(self, *, clock: Callable[[], float]) -> None:
        self._clock = clock
        #: The members waiting at each grid point (a dict as an ordered set).
        self._due: dict[float, dict[RoundMember, None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        """The grid points with members waiting (for tests)."""
        return len(self._due)

    def enter(self, member: RoundMember, when: float) -> None:
        members = self._due.get(when)
        if members is None:
            members = self._due[when] = {}
            asyncio.get_running_loop().call_later(max(0.0, when - self._clock()), self._fire, when)
        members[member] = None
        member._round_at = when

    def leave(self, member: RoundMember) -> None:
        at = member._round_at
        if at is not None:
            member._round_at = None
            members = self._due.get(at)
            if members is not None:
                members.pop(member, None)

    def _fire(self, when: float) -> None:
        members = self._due.pop(when, None)
        if not members:
            return
        task = asyncio.get_running_loop().create_task(self._round(list(members)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _round(self, members: list[RoundMember]) -> None:
        sent = self._clock()
        sending: list[tuple[RoundMember, RoundRenewable, asyncio.Future[Any]]] = []
        #: The members this round has not settled yet: whatever happens to the round (a bug, a
        #: cancellation), each is handed back to its own task in the end, never left waiting.
        unsettled = dict.fromkeys(members)
        try:
            wait_s = self._send(members, sent=sent, sending=sending, unsettled=unsettled)
            if not sending:
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await asyncio.wait([reply for _, _, reply in sending])
            received = self._clock()
            for member, backend, reply in sending:
                result: RenewResult | BaseException
                if reply.done():
                    try:
                        result = backend.renew_result(reply)
                    except Exception as exc:
                        result = exc
                else:
                    reply.cancel()  # the batcher drops it, or discards its answer
                    result = TimeoutError()
                del unsettled[member]
                self._settle(member, (sent, received, result))
        finally:
            for member in unsettled:
                if member._round_held:
                    member._hand_back(None)
                pending, member._round_result = member._round_result, None
                if pending is not None and not pending.done():
                    pending.set_result((sent, self._clock(), TimeoutError()))

    def _send(
        self,
        members: list[RoundMember],
        *,
        sent: float,
        sending: list[tuple[RoundMember, RoundRenewable, asyncio.Future[Any]]],
        unsettled: dict[RoundMember, None],
    ) -> float:
        """Send the renewal of each member that may renew now (the others go back to their own
        cycles); how long the round waits for the answers."""
        loop = asyncio.get_running_loop()
        wait_s = math.inf
        for member in members:
            member._round_at = None
            if not member._round_held:
                # Its task woke after this round was due and before it ran: its own cycle runs.
                del unsettled[member]
                continue
            if not member._may_renew_in_round(sent):
                del unsettled[member]
                member._hand_back(None)
                continue
            backend = cast(RoundRenewable, member._backend)
            assert member._lease is not None
            try:
                reply = backend.renew_soon(member._lease, priority=member._priority)
            except Exception:  # not sent (say, a refused argument): its own cycle tells why
                del unsettled[member]
                member._hand_back(None)
                continue
            member._round_result = loop.create_future()
            member._last_attempt_at = sent
            member._cycle_due_by = sent + member._timing.request_timeout_s
            deadline_s = member._last_renew_sent_at + member._timing.renew_deadline_s - sent
            wait_s = min(wait_s, member._timing.request_timeout_s, deadline_s)
            sending.append((member, backend, reply))
        return wait_s

    def _settle(self, member: RoundMember, answer: RoundResult) -> None:
        """Apply a plain renewal to a member that still waits in the rounds; hand anything else
        back to its task (or give it to the task that left the rounds and waits for it)."""
        pending, member._round_result = member._round_result, None
        result = answer[2]
        if not member._round_held:  # its task left the rounds: it waits for this answer
            if pending is not None and not pending.done():
                pending.set_result(answer)
        elif isinstance(result, Renewed) and is_plain(result) and member._state is State.LEADER:
            try:
                next_at = member._renewed_in_round(answer[0], answer[1], result)
            except Exception:  # a bug must not leave the lease without a cycle: its own runs
                member._hand_back(None)
                raise
            self.enter(member, next_at)
        else:
            member._hand_back(answer)
