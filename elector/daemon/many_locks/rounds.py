"""Rounds of renewals: the leaders of one daemon that fall due at the same grid point are renewed
together, by one callback, without waking the task of each.

A daemon of many locks renews each on a point of its renewal grid (grid.py), so hundreds of
leases fall due at the very same instant. Renewed one election at a time, each renewal woke its
task, went through its cycle, a request timeout, the batcher's coroutine and back: most of a
renewal's CPU, while the batch script call that carries them all costs a few us per lease
(lua/batch.py). In a round, `RenewalRounds` sends the renewals of every lease due at a point in one
go (`RoundRenewable.renew_soon`: the same RENEW, batched as before) and, for each plain answer
(renewed, nothing to report), applies it to its election directly: the very update and outcome its
own leader cycle makes (`Election.renewed_elsewhere`). Anything else goes back to the election's
own task (`Election.hand_back`), which runs its leader cycle on that answer: a lost lease, a
handoff asked, a rival, an identity clash, an error or a timeout are handled exactly as ever.
`RenewalRounds` is the election's `Renewer` and uses only its public renewal interface.

Every rule of a renewal holds: each lease is owner-checked by RENEW itself; its validity counts
from the round's send time; a lease whose validity end or renew deadline has come is not renewed
in a round at all (its own cycle steps down); a round waits for its answers no longer than the
request timeout and the earliest renew deadline among its leases, and an answer that did not come
is that election's timeout. An election is in a round only while its task waits for its next
renewal and nothing else (`Election.waits_for_renewal`); a stop, a resignation or an announcement
wakes its task, which takes its lease out of the rounds, and first waits for an answer already
under way, to use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable
from typing import Any, Protocol, cast

from elector.election import Election, RenewalAnswer, State
from elector.lease import Lease, Renewed, RenewResult


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


class RenewalRounds:
    """The rounds of the elections of one daemon: one loop timer per grid point, one batched
    send per round (see the module doc). `clock` is the elections' clock."""

    def __init__(self, *, clock: Callable[[], float]) -> None:
        self._clock = clock
        #: The elections waiting at each grid point (a dict as an ordered set).
        self._due: dict[float, dict[Election, None]] = {}
        #: The grid point each waiting election is due at.
        self._at: dict[Election, float] = {}
        #: The answers under way, each resolved with its RenewalAnswer (a round resolves every one
        #: within its timeout, whether or not the election still waits in the rounds).
        self._answers: dict[Election, asyncio.Future[RenewalAnswer]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        """The grid points with elections waiting (for tests)."""
        return len(self._due)

    def enter(self, election: Election, when: float) -> None:
        members = self._due.get(when)
        if members is None:
            members = self._due[when] = {}
            asyncio.get_running_loop().call_later(max(0.0, when - self._clock()), self._fire, when)
        members[election] = None
        self._at[election] = when

    def leave(self, election: Election) -> asyncio.Future[RenewalAnswer] | None:
        at = self._at.pop(election, None)
        if at is not None:
            members = self._due.get(at)
            if members is not None:
                members.pop(election, None)
        return self._answers.get(election)

    def _fire(self, when: float) -> None:
        members = self._due.pop(when, None)
        if not members:
            return
        task = asyncio.get_running_loop().create_task(self._round(list(members)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _round(self, members: list[Election]) -> None:
        sent = self._clock()
        sending: list[tuple[Election, RoundRenewable, asyncio.Future[Any]]] = []
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
                if member.waits_for_renewal:
                    member.hand_back(None)
                pending = self._answers.pop(member, None)
                if pending is not None and not pending.done():
                    pending.set_result((sent, self._clock(), TimeoutError()))

    def _send(
        self,
        members: list[Election],
        *,
        sent: float,
        sending: list[tuple[Election, RoundRenewable, asyncio.Future[Any]]],
        unsettled: dict[Election, None],
    ) -> float:
        """Send the renewal of each member that may renew now (the others go back to their own
        cycles); how long the round waits for the answers."""
        loop = asyncio.get_running_loop()
        wait_s = math.inf
        for member in members:
            self._at.pop(member, None)
            if not member.waits_for_renewal:
                # Its task woke after this round was due and before it ran: its own cycle runs.
                del unsettled[member]
                continue
            lease = member.lease_to_renew(sent)
            if lease is None:
                del unsettled[member]
                member.hand_back(None)
                continue
            backend = cast(RoundRenewable, member.backend)
            try:
                reply = backend.renew_soon(lease, priority=member.priority)
            except Exception:  # not sent (say, a refused argument): its own cycle tells why
                del unsettled[member]
                member.hand_back(None)
                continue
            self._answers[member] = loop.create_future()
            wait_s = min(wait_s, member.renewal_sent(sent))
            sending.append((member, backend, reply))
        return wait_s

    def _settle(self, member: Election, answer: RenewalAnswer) -> None:
        """Apply a plain renewal to a member that still waits in the rounds; hand anything else
        back to its task (or give it to the task that left the rounds and waits for it)."""
        pending = self._answers.pop(member, None)
        result = answer[2]
        if not member.waits_for_renewal:  # its task left the rounds: it waits for this answer
            if pending is not None and not pending.done():
                pending.set_result(answer)
        elif isinstance(result, Renewed) and is_plain(result) and member.state is State.LEADER:
            try:
                next_at = member.renewed_elsewhere(answer[0], answer[1], result)
            except Exception:  # a bug must not leave the lease without a cycle: its own runs
                member.hand_back(None)
                raise
            self.enter(member, next_at)
        else:
            member.hand_back(answer)
