"""The asyncio library API's logic on the in-memory lease (tests/election/fake_backend.py), in
virtual time (looptime): step-downs, resigning, preemption, callbacks, cancellation, logs, timeouts.

What these tests assert is the library's own logic, not Redis's: they ran against redis-server
before and assert exactly what they asserted there (tests/backend/test_fake_contract.py holds the
fake to the real scripts). Times are the loop's virtual times, which the Electors' validity is
counted on too; what is about Redis itself (tampering with the key, cut connections, clients,
URLs, topologies) stays in test_api.py and test_api_failures.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from elector import Elector, Leadership, LeadershipLost, LeadershipTimeout, State, StepDownReason
from elector.lease import LeaseBackendError
from tests.election.fake_backend import FakeBackend, FakeStore, unreachable
from tests.support.bodies import wait_entered
from tests.support.waiting import until

pytestmark = pytest.mark.looptime

# The same ttl and bounds as the real-Redis tests these came from (test_api.py).
TTL_S = 2.0
LOCK = "jobs"
OTHER_LOCK = "reports"


#: A request's round trip to a local Redis, in virtual time: a release and the successor's grant
#: come after the step-down that sent them, never at the same instant.
ROUND_TRIP_S = 0.001


class LocalRedis(FakeBackend):
    """The in-memory lease, answering after a local round trip."""

    async def _request(self, name: str) -> None:
        await asyncio.sleep(ROUND_TRIP_S)
        await super()._request(name)


@pytest.fixture
async def make() -> AsyncIterator[Callable[..., Elector]]:
    """`make("a", lock=..., fail_with=..., **kwargs)`: an Elector on the in-memory lease of its
    lock (one store per lock, used before: no new-lock quiet period), closed after the test."""
    clock = asyncio.get_running_loop().time
    stores: dict[str, FakeStore] = {}
    made: list[Elector] = []

    def _make(
        identity: str, *, lock: str = LOCK, fail_with: LeaseBackendError | None = None, **kwargs: Any
    ) -> Elector:
        kwargs.setdefault("ttl_s", TTL_S)
        store = stores.setdefault(lock, FakeStore(clock=clock))
        backend = LocalRedis(store, lock=lock)
        backend.fail_with = fail_with  # every request fails so (Redis unreachable, say)
        made.append(Elector(lock, identity=identity, _backend=backend, _clock=clock, **kwargs))
        return made[-1]

    _make.stores = stores  # type: ignore[attr-defined]
    yield _make
    for item in made:
        async with asyncio.timeout(5):
            await item.aclose()


def lease_left(make: Callable[..., Elector], lock: str = LOCK) -> bool:
    """Whether the lock's key is still there (a PTTL above zero, on Redis)."""
    store: FakeStore = make.stores[lock]  # type: ignore[attr-defined]
    return store.current() is not None


def delete_key(make: Callable[..., Elector], lock: str = LOCK) -> None:
    """The lock's key deleted behind the holder's back (a DEL on Redis): no announcement."""
    store: FakeStore = make.stores[lock]  # type: ignore[attr-defined]
    store.lease = None


def records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "elector.api" and r.levelno == level]


@pytest.mark.parametrize("unwind_s", [0.1, 0.4])
async def test_a_step_down_waits_for_the_body_up_to_stop_work_s(
    spawn, make, caplog: pytest.LogCaptureFixture, unwind_s: float
) -> None:
    waited = unwind_s < 0.25
    a = make("a", stop_work_s=0.25)
    await a.start()
    leader = spawn(a, unwind_s=unwind_s)
    await wait_entered(leader)
    b = make("b")
    await b.start()
    follower = spawn(b)
    await asyncio.sleep(0.1)
    closing = asyncio.create_task(a.aclose())
    lost = await leader.lost()
    if not waited:
        # Still running past stop_work_s: the release is withheld, the key stays until its ttl.
        await asyncio.sleep(0.3)
        assert lease_left(make)
        assert not follower.entered.is_set()
    await wait_entered(follower)
    await closing
    assert lost.reason is StepDownReason.SHUTDOWN
    # Never beside the old body: the successor starts only once it unwound, either way.
    assert leader.unwound_at < follower.entered_at
    if waited:  # released once the body was done, and handed over at once
        # A lapsed lease would take at least ttl - renew interval (1.4 s); half the ttl leaves a
        # loaded machine room and still tells a release from a lapse.
        assert follower.entered_at < leader.unwound_at + a.timing.ttl_s / 2
        assert a.releases_withheld == 0
    else:  # the lease lapsed by its ttl: a second or so after the last renewal, not at once
        assert follower.entered_at - leader.cancelled_at > a.timing.stop_work_s
        assert a.releases_withheld == 1
        assert "still running 0.250s (stop_work_s)" in caplog.text


async def test_with_stop_work_s_zero_a_body_that_unwinds_at_once_is_still_released(spawn, make) -> None:
    stopped: list[StepDownReason] = []

    async def on_stopped_leading(reason: StepDownReason) -> None:
        stopped.append(reason)  # returns at once, but runs in the callbacks' own task

    a = make("a", stop_work_s=0, on_stopped_leading=on_stopped_leading)
    await a.start()
    leader = spawn(a)  # unwinds as soon as it is cancelled, without awaiting anything
    await wait_entered(leader)
    b = make("b")
    await b.start()
    follower = spawn(b)
    await asyncio.sleep(0.1)
    await a.aclose()
    await wait_entered(follower)
    assert a.releases_withheld == 0  # released, not left to lapse
    assert follower.entered_at - leader.unwound_at < a.timing.ttl_s / 2  # handed over at once
    assert stopped == [StepDownReason.SHUTDOWN]


async def test_a_body_that_returns_resigns_and_the_other_elector_takes_over(spawn, make) -> None:
    a, b = make("a"), make("b")
    await a.start()
    first = spawn(a, hold_s=0.3)
    await wait_entered(first)
    await b.start()
    second = spawn(b, resign_on_exit=False)
    async with asyncio.timeout(2):
        await first.task  # returns after the release went out
    assert not a.is_leader
    await wait_entered(second)
    # The release announcement, not the ttl: a lapse would take at least ttl - renew interval.
    assert second.entered_at - first.exited_at < TTL_S / 2
    assert first.lease is not None and second.lease is not None
    assert second.lease.fencing_token > first.lease.fencing_token
    await asyncio.sleep(TTL_S)  # a stands back and does not grab the lock from b
    assert b.is_leader and not a.is_leader and not second.task.done()


async def test_a_higher_priority_elector_preempts_the_leaders_body(spawn, make) -> None:
    low, high = make("low"), make("high", priority=5)
    await low.start()
    leader = spawn(low)
    await wait_entered(leader)
    await high.start()
    rival = spawn(high)
    lost = await leader.lost()
    await wait_entered(rival)
    assert lost.reason is StepDownReason.PREEMPTED
    # Released to the rival at once: a lapse would take at least ttl - renew interval (1.4 s).
    assert rival.entered_at - leader.cancelled_at < TTL_S / 2
    assert leader.lease is not None and rival.lease is not None
    assert rival.lease.fencing_token > leader.lease.fencing_token


async def test_keeping_the_lead_after_the_block_and_new_terms_with_higher_tokens(make) -> None:
    a = make("a")
    await a.start()
    async with a.leadership(resign_on_exit=False) as first:
        pass
    assert a.is_leader and first.active
    async with a.leadership(stand_back_s=0.05) as same:
        assert same is first  # still the same term
    assert not first.active and first.end_reason is StepDownReason.RESIGNED
    async with asyncio.timeout(2):
        later = await a.wait_for_leadership()  # nobody else: leads again after standing back
    assert later.fencing_token > first.fencing_token


async def test_callbacks_come_in_order_once_per_term_and_failures_are_contained(
    make, caplog: pytest.LogCaptureFixture
) -> None:
    events: list[tuple[str, object]] = []

    def new_leader(identity: str | None) -> None:
        events.append(("new_leader", identity))
        raise RuntimeError("a broken callback")

    async def started(lease: Leadership) -> None:
        await asyncio.sleep(0.01)
        events.append(("started", lease.fencing_token))

    async def stopped(reason: StepDownReason) -> None:
        events.append(("stopped", reason))

    a = make("a", on_new_leader=new_leader, on_started_leading=started, on_stopped_leading=stopped)
    await a.start()
    async with a.leadership(stand_back_s=0.05):
        pass
    async with a.leadership(resign_on_exit=False):
        pass
    await a.aclose()
    tokens = [arg for kind, arg in events if kind == "started"]
    assert len(tokens) == 2 and tokens[0] < tokens[1]
    assert [kind for kind, _ in events if kind != "new_leader"] == ["started", "stopped"] * 2
    assert [arg for kind, arg in events if kind == "stopped"] == [
        StepDownReason.RESIGNED,
        StepDownReason.SHUTDOWN,
    ]
    for index, (kind, _) in enumerate(events):
        if kind == "started":
            assert events[index - 1] == ("new_leader", "a")  # told who leads, then that it is us
    assert "on_new_leader callback failed" in caplog.text


async def test_on_stopped_leading_is_called_exactly_once_at_close_when_never_led(make) -> None:
    a = make("a", ttl_s=3.0)
    await a.start()
    await a.wait_for_leadership()
    calls: list[object] = []
    b = make(
        "b", ttl_s=3.0, on_stopped_leading=calls.append, on_started_leading=calls.append,
        on_new_leader=calls.append,
    )  # fmt: skip
    await b.start()
    await until(lambda: calls, timeout_s=10.0)  # a bound on a hang
    await b.aclose()
    await b.aclose()  # a second close adds nothing
    assert calls == ["a", StepDownReason.SHUTDOWN]


async def test_on_stopped_leading_is_called_once_when_redis_was_never_reached(make) -> None:
    calls: list[StepDownReason] = []
    e = make("a", fail_with=unreachable(), on_stopped_leading=calls.append)
    await e.start()
    await asyncio.sleep(0.3)  # a few failed tries
    assert calls == [] and not e.is_leader
    await e.aclose()
    assert calls == [StepDownReason.SHUTDOWN]


async def test_an_outside_cancellation_propagates_as_cancelled_error(spawn, make) -> None:
    a, b = make("a"), make("b")
    await a.start()
    body = spawn(a)
    await wait_entered(body)
    await b.start()
    body.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await body.task
    assert body.task.cancelled()
    async with asyncio.timeout(0.5):
        await b.wait_for_leadership()  # the cancelled body resigned as it left


async def test_an_outside_cancellation_during_a_loss_still_propagates(spawn, make) -> None:
    holder: list[asyncio.Task[None]] = []
    a = make("a", on_stopped_leading=lambda reason: holder[0].cancel())
    await a.start()
    body = spawn(a, unwind_s=0.2)  # still unwinding when the callback cancels it as well
    holder.append(body.task)
    await wait_entered(body)
    delete_key(make)
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(3):
            await body.task
    assert not math.isnan(body.cancelled_at) and math.isnan(body.unwound_at)


async def test_electors_of_several_locks_share_one_registry(make) -> None:
    registry = CollectorRegistry()
    first, second = make("a", registry=registry), make("a", lock=OTHER_LOCK, registry=registry)
    await first.start()
    await second.start()
    for lock in (LOCK, OTHER_LOCK):
        assert registry.get_sample_value("elector_release_withheld_total", {"lock": lock}) == 0
    same_lock = make("b", registry=registry)
    with pytest.raises(ValueError, match="already registered"):
        await same_lock.start()
    await first.aclose()
    assert registry.get_sample_value("elector_release_withheld_total", {"lock": LOCK}) is None
    again = make("c", registry=registry)  # the lock's series were removed: it may come back
    await again.start()
    assert registry.get_sample_value("elector_release_withheld_total", {"lock": LOCK}) == 0


async def test_the_happy_path_logs_transitions_at_info_with_lock_identity_and_token(
    make, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="elector")
    # The claim is that a quiet term logs its two edges only.
    async with make("a", ttl_s=3.0) as e:
        async with e.leadership() as lease:
            await asyncio.sleep(2.2)  # two renewals (every 1 s): silent
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    info = [r.getMessage() for r in records(caplog, logging.INFO)]
    token = lease.fencing_token
    assert info == [
        f"lock 'jobs': leading as 'a', fencing token {token}",
        f"lock 'jobs': stepped down (resigned) as 'a', fencing token {token}; released",
    ]
    assert all(r.lock == LOCK and r.identity == "a" for r in records(caplog, logging.INFO))  # type: ignore[attr-defined]


async def test_an_acquire_timeout_bounds_the_wait_never_the_body(make) -> None:
    async with make("a", ttl_s=3.0) as a:
        await a.wait_for_leadership(timeout=5)
        async with a.leadership(timeout=0.2) as lease:
            await asyncio.sleep(0.6)  # longer than the timeout: not cancelled
            assert lease.active
            async with make("b", ttl_s=3.0) as b:
                with pytest.raises(LeadershipTimeout, match="held by 'a'") as info:
                    async with b.leadership(timeout=1.5):
                        pytest.fail("b cannot lead while a does")
    assert info.value.redis_reached
    assert info.value.holder == "a"
    assert isinstance(info.value, TimeoutError)


async def test_errors_after_aclose_say_the_elector_was_closed(make) -> None:
    e = make("a", ttl_s=1.0)
    with pytest.raises(RuntimeError, match="not started"):
        await e.wait_for_leadership()
    async with e:
        pass
    with pytest.raises(RuntimeError, match=r"was closed \(aclose\(\)"):
        async with e.leadership():
            pass


async def lead_again_and_again(
    e: Elector, journal: list[tuple[int, float, float]], entered: list[float], *, unwind_s: float
) -> None:
    """Term after term, a body that needs `unwind_s` to stop once cancelled (say, a slow flush)."""
    while True:
        with contextlib.suppress(LeadershipLost):
            async with e.leadership(resign_on_exit=False) as lease:
                entered_at = asyncio.get_running_loop().time()
                entered.append(entered_at)
                try:
                    await asyncio.Event().wait()
                finally:
                    try:
                        await asyncio.sleep(unwind_s)  # outlives stop_work_s and the lease itself
                    finally:
                        journal.append((lease.fencing_token, entered_at, asyncio.get_running_loop().time()))


async def test_an_elector_stands_back_until_its_own_late_body_exited(make) -> None:
    registry = CollectorRegistry()
    journal: list[tuple[int, float, float]] = []
    entered: list[float] = []
    e = make("a", ttl_s=1.0, registry=registry)
    await e.start()
    unwind_s = 2.5  # more than twice the ttl: on the old code a new term starts meanwhile
    workers = [asyncio.create_task(lead_again_and_again(e, journal, entered, unwind_s=unwind_s))]
    try:
        async with asyncio.timeout(5):
            await e.wait_for_leadership()
        delete_key(make)  # the lease is lost at the next renewal: the body overruns
        await until(lambda: e.status().state is State.FOLLOWER, timeout_s=5, every_s=0.005)
        # Another task of the program waits to lead, while the first body still unwinds.
        workers.append(asyncio.create_task(lead_again_and_again(e, journal, entered, unwind_s=0.0)))
        waiting_seen = gauge_seen = False
        async with asyncio.timeout(15):
            while len(entered) < 2:  # a second term's body entered
                waiting_seen |= getattr(e.status(), "waiting_for_own_work", False)
                gauge = registry.get_sample_value("elector_waiting_for_own_work", {"lock": LOCK})
                gauge_seen |= gauge == 1.0
                await asyncio.sleep(0.01)
        assert e.releases_withheld == 1
    finally:
        for worker in workers:
            worker.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        await e.aclose()
    # Every body journaled its interval (the last ones when cancelled at the end): the old
    # term's body left before any body of the new term entered. (Bodies of one term may overlap.)
    assert len({token for token, _, _ in journal}) >= 2, journal  # two terms
    overlapping = [
        (one, other) for one in journal for other in journal if one[0] < other[0] and other[1] < one[2]
    ]
    assert overlapping == [], journal
    # And while it stood back, it said so.
    assert waiting_seen and gauge_seen
    assert not e.status().waiting_for_own_work
