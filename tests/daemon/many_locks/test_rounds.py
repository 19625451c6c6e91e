"""Renewal rounds (elector/daemon/many_locks/rounds.py): the leaders of a daemon due at one grid point are
renewed together, and anything but a plain renewal is left to the election's own cycle."""

from __future__ import annotations

import asyncio
import itertools
import random
from typing import Any

import pytest

from elector.daemon.many_locks.rounds import RenewalRounds
from elector.election import Election, OutcomeKind, State, StepDownReason
from elector.lease import BackendErrorKind, Lease, LeaseBackendError, RenewResult
from tests.election.fake_backend import FakeBackend, FakeStore
from tests.support.election import Recorder, timing

pytestmark = pytest.mark.looptime

LOCKS = 12


class RoundBackend(FakeBackend):
    """A FakeBackend whose renewals can go out in rounds; it counts both paths apart."""

    renews_in_rounds = True

    def __init__(self, store: FakeStore, *, lock: str) -> None:
        super().__init__(store, lock=lock)
        self.in_rounds = 0
        self.own = 0
        #: Renewals sent in rounds and not answered yet; how long each answer takes.
        self.in_flight = 0
        self.delay_s = 0.0
        #: The error of the next renewal sent in a round (once).
        self.fail_next_round: LeaseBackendError | None = None
        #: Set when an answer starts (shared by the backends of a test's daemon).
        self.answering = asyncio.Event()
        self._answers: set[asyncio.Task[None]] = set()

    async def renew(self, lease: Lease, *, priority: int = 0) -> RenewResult:
        self.own += 1  # the election's own cycle sent it
        return await super().renew(lease, priority=priority)

    def renew_soon(self, lease: Lease, *, priority: int = 0) -> asyncio.Future[Any]:
        self.in_rounds += 1
        loop = asyncio.get_running_loop()
        reply: asyncio.Future[Any] = loop.create_future()

        async def answer() -> None:
            self.in_flight += 1
            self.answering.set()
            try:
                await asyncio.sleep(self.delay_s)
                failure, self.fail_next_round = self.fail_next_round, None
                if failure is not None:
                    raise failure
                result = await FakeBackend.renew(self, lease, priority=priority)
            except Exception as exc:
                if not reply.done():
                    reply.set_exception(exc)
            else:
                if not reply.done():
                    reply.set_result(result)
            finally:
                self.in_flight -= 1

        task = loop.create_task(answer())
        self._answers.add(task)
        task.add_done_callback(self._answers.discard)
        return reply

    def renew_result(self, reply: asyncio.Future[Any]) -> RenewResult:
        result: RenewResult = reply.result()
        return result


class Daemon:
    """LOCKS elections sharing one RenewalRounds, as a daemon's locks do."""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.rounds = RenewalRounds(clock=loop.time)
        self.stores = [FakeStore() for _ in range(LOCKS)]
        self.backends = [RoundBackend(store, lock=f"lock-{i}") for i, store in enumerate(self.stores)]
        self.recorders = [Recorder() for _ in range(LOCKS)]
        self.elections = [
            Election(
                backend,
                identity="a",
                timing=timing(),
                hooks=recorder.hooks(),
                renew_jitter_share=0.1,
                # A coarse grid: the renewals of a dozen locks share its points (rounds.py).
                renew_grid_s=0.25,
                rng=random.Random(25),
                renewer=self.rounds,
            )
            for backend, recorder in zip(self.backends, self.recorders, strict=True)
        ]
        self.tasks = [asyncio.create_task(election.run()) for election in self.elections]

    async def stop(self) -> None:
        for election in self.elections:
            election.stop()
        await asyncio.wait_for(asyncio.gather(*self.tasks), timeout=10)


async def test_leases_due_together_are_renewed_in_rounds_on_time_without_their_own_cycles() -> None:
    daemon = Daemon()
    await asyncio.sleep(5 * timing().ttl_s)
    for election, recorder, backend in zip(daemon.elections, daemon.recorders, daemon.backends, strict=True):
        assert election.status().is_leader
        renewals = [o for o in recorder.outcomes if o.kind is OutcomeKind.RENEWED]
        assert len(renewals) >= 5 * timing().ttl_s / timing().renew_interval_s - 2
        # Never later than a renew interval apart, each with its round trip measured.
        times = [recorder.first(OutcomeKind.ACQUIRED).at] + [o.at for o in renewals]
        assert all(b - a <= timing().renew_interval_s + 1e-6 for a, b in itertools.pairwise(times))
        assert all(o.duration_s is not None and o.valid_until is not None for o in renewals)
        assert backend.in_rounds == len(renewals) and backend.own == 0
    # Leases whose renewals fall on the same grid points share those points' rounds.
    assert len(daemon.rounds) < LOCKS
    await daemon.stop()
    assert all(store.lease is None for store in daemon.stores)  # each released


async def test_a_lease_lost_in_a_round_ends_the_term_on_that_answer() -> None:
    daemon = Daemon()
    await asyncio.sleep(timing().ttl_s)
    victim = 3
    assert daemon.elections[victim].status().is_leader
    daemon.stores[victim].overwrite("intruder", ttl_s=60.0)
    await asyncio.sleep(timing().renew_interval_s + 0.1)
    lost = daemon.recorders[victim].first(OutcomeKind.RENEW_LOST)
    assert lost.step_down_reason is StepDownReason.LOST
    # The round's answer was acted on: no second renewal of the lost lease was sent.
    assert daemon.backends[victim].own == 0
    assert not daemon.elections[victim].status().is_leader
    others = [e for i, e in enumerate(daemon.elections) if i != victim]
    assert all(e.status().is_leader for e in others)
    await daemon.stop()


async def test_a_handoff_asked_is_acted_on_from_the_round_answer() -> None:
    daemon = Daemon()
    await asyncio.sleep(timing().ttl_s)
    store = daemon.stores[5]
    store.handoff = ("a", "b", store.now + 60.0)
    await asyncio.sleep(timing().renew_interval_s + 0.1)
    stepped = [o for o in daemon.recorders[5].outcomes if o.step_down_reason is StepDownReason.HANDOFF]
    assert stepped, daemon.recorders[5].kinds()
    assert daemon.backends[5].own == 0
    await daemon.stop()


async def test_a_round_that_gets_no_answer_is_a_timeout_and_the_term_ends_before_its_validity() -> None:
    daemon = Daemon()
    await asyncio.sleep(timing().ttl_s)
    backend, election, recorder = daemon.backends[7], daemon.elections[7], daemon.recorders[7]
    acquired_or_renewed = [o for o in recorder.outcomes if o.valid_until is not None]
    backend.hang = True  # its answers never come, in rounds or not
    original = backend.renew_soon

    def hanging(lease: Lease, *, priority: int = 0) -> asyncio.Future[Any]:
        backend.in_rounds += 1
        return asyncio.get_running_loop().create_future()

    backend.renew_soon = hanging  # type: ignore[method-assign]
    await asyncio.sleep(3 * timing().ttl_s)
    errors = [o for o in recorder.outcomes if o.kind is OutcomeKind.RENEW_ERROR]
    assert errors and errors[0].error == "Redis did not answer in time"
    assert all(o.duration_s is not None and o.duration_s <= timing().request_timeout_s + 1e-6 for o in errors)
    ended = [o for o in recorder.outcomes if o.step_down_reason is StepDownReason.RENEW_DEADLINE]
    assert ended
    last_valid_until = max(o.valid_until for o in recorder.outcomes if o.valid_until is not None)
    assert last_valid_until >= max(o.valid_until or 0 for o in acquired_or_renewed)
    assert ended[0].at <= last_valid_until  # stepped down before the lease could run out
    assert election.status().state is not State.LEADER
    backend.renew_soon = original  # type: ignore[method-assign]
    backend.hang = False
    await daemon.stop()


async def test_an_error_in_a_round_is_retried_by_the_election_and_rounds_resume() -> None:
    daemon = Daemon()
    await asyncio.sleep(timing().ttl_s)
    backend, election, recorder = daemon.backends[2], daemon.elections[2], daemon.recorders[2]
    backend.fail_next_round = LeaseBackendError("down", kind=BackendErrorKind.CONNECTION)
    await asyncio.sleep(timing().renew_interval_s + 0.05)
    assert recorder.first(OutcomeKind.RENEW_ERROR).error_kind == BackendErrorKind.CONNECTION.value
    await asyncio.sleep(timing().retry_delay_s + 0.05)
    assert backend.own == 1  # the retry was the election's own cycle
    in_rounds_before = backend.in_rounds
    await asyncio.sleep(2 * timing().renew_interval_s)
    assert election.status().is_leader
    assert backend.in_rounds > in_rounds_before and backend.own == 1  # back in the rounds
    assert not [o for o in recorder.outcomes if o.step_down_reason is not None]
    await daemon.stop()


async def test_a_stop_while_a_round_is_under_way_waits_for_its_answer_then_releases() -> None:
    daemon = Daemon()
    await asyncio.sleep(timing().ttl_s)
    for backend in daemon.backends:
        backend.delay_s = 0.2  # a slow Redis: the stop comes while answers are awaited
    answering = asyncio.Event()
    for backend in daemon.backends:
        backend.answering = answering
    await answering.wait()
    waiting = [i for i, backend in enumerate(daemon.backends) if backend.in_flight]
    await daemon.stop()
    assert all(store.lease is None for store in daemon.stores)  # each released
    assert all(e.status().state is State.STOPPED for e in daemon.elections)
    for i in waiting:
        recorder = daemon.recorders[i]
        # The renewal under way was answered and counted, not given up on.
        assert not [o for o in recorder.outcomes if o.kind is OutcomeKind.RENEW_ERROR]
        renewals = [o for o in recorder.outcomes if o.kind is OutcomeKind.RENEWED]
        assert len(renewals) == daemon.backends[i].in_rounds
