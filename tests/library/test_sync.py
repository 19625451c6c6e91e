"""The sync API (elector.sync) in one process, against a real redis-server: bodies in threads."""

from __future__ import annotations

import itertools
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio

import elector
import elector.sync
from elector import ElectorConfigError, LeadershipLost, LeadershipTimeout, StepDownReason
from elector.election.clock import boottime
from tests.support.waiting import wait_until

LOCK = "jobs"
KEY = f"elector:{{{LOCK}}}:lease"


@pytest.fixture
def make(redis_url: str, seeded: redis.Redis) -> Iterator[Any]:
    made: list[elector.sync.Elector] = []

    def _make(identity: str, **kwargs: Any) -> elector.sync.Elector:
        kwargs.setdefault("ttl_s", 1.0)
        made.append(elector.sync.Elector(LOCK, redis=redis_url, identity=identity, **kwargs))
        made[-1].start()
        return made[-1]

    yield _make
    for e in made:
        e.close()


def test_two_sync_electors_take_turns_and_their_bodies_never_overlap(make) -> None:
    journal: list[tuple[str, int, float, float]] = []
    stop = threading.Event()

    def work(e: elector.sync.Elector) -> None:
        while not stop.is_set():
            try:
                with e.leadership(timeout=0.5, stand_back_s=0.3) as lease:
                    entered = boottime()
                    for _ in range(20):
                        lease.check()
                        time.sleep(0.005)
                    journal.append((e.identity, lease.fencing_token, entered, boottime()))
            except LeadershipTimeout:
                pass

    electors = [make("a"), make("b")]
    threads = [threading.Thread(target=work, args=(e,)) for e in electors]
    for thread in threads:
        thread.start()
    wait_until(lambda: {entry[0] for entry in journal} == {"a", "b"}, timeout_s=15)
    stop.set()
    for thread in threads:
        thread.join(timeout=10)
    ordered = sorted(journal, key=lambda entry: entry[2])
    assert all(one[3] <= other[2] for one, other in itertools.pairwise(ordered)), ordered
    tokens = [entry[1] for entry in ordered]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)


def test_a_term_lost_under_a_sync_body_is_seen_by_check_and_by_the_end_of_the_block(
    make, seeded: redis.Redis
) -> None:
    e = make("a")

    def looking_body() -> None:
        with e.leadership() as lease:
            assert lease.remaining() > 0
            lease.check()
            seeded.delete(KEY)
            wait_until(lambda: not lease.active, timeout_s=5)
            assert lease.remaining() == 0.0
            lease.check()

    def body_that_never_looks() -> None:
        with e.leadership():
            seeded.delete(KEY)
            wait_until(lambda: not e.is_leader, timeout_s=5)

    with pytest.raises(LeadershipLost) as info:
        looking_body()
    assert info.value.reason is StepDownReason.LOST
    with pytest.raises(LeadershipLost):  # told at the end of its block
        body_that_never_looks()


def test_a_sync_body_slower_than_stop_work_s_withholds_the_release_and_is_not_led_beside(
    make, seeded: redis.Redis
) -> None:
    e = make("a")
    e.wait_for_leadership(timeout=5)
    other = make("b")
    waiting = []

    def slow_body() -> None:
        with e.leadership():
            seeded.delete(KEY)  # lost at the next renewal; the body ignores it for 2 ttl
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                waiting.append(e.status().waiting_for_own_work)
                time.sleep(0.01)
            assert not e.is_leader

    with pytest.raises(LeadershipLost):
        slow_body()
    assert e.releases_withheld == 1
    assert any(waiting)  # it stood back while its own body ran
    # The lapsed lease went to the other Elector meanwhile.
    assert other.wait_for_leadership(timeout=5).identity == "b"


def test_an_acquire_timeout_never_cuts_the_body_short(make) -> None:
    e = make("a")
    e.wait_for_leadership(timeout=5)
    with e.leadership(timeout=0.2) as lease:
        time.sleep(0.6)  # longer than the timeout: only the wait to lead was bounded
        lease.check()
    b = make("b")
    b.wait_for_leadership(timeout=5)  # a resigned
    with b.leadership(resign_on_exit=False):
        c = make("c")
        with pytest.raises(LeadershipTimeout) as info, c.leadership(timeout=0.3):
            pytest.fail("c cannot lead while b does")
    assert info.value.redis_reached
    assert info.value.holder == "b"


class Interrupted(Exception):
    pass


def test_an_interrupted_wait_to_lead_leaves_nothing_behind(make) -> None:
    holder = make("b")
    holder.wait_for_leadership(timeout=5)
    e = make("a")

    def interrupt(signum: int, frame: object) -> None:
        raise Interrupted  # as Ctrl-C or SIGTERM under elector.sync.run would

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(Interrupted), e.leadership():
            pytest.fail("b holds the lock")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    holder.close()
    e.wait_for_leadership(timeout=5)
    e.close()  # no body of the interrupted wait is waited for: released at once, not withheld
    assert e.releases_withheld == 0


def test_a_sync_elector_takes_a_url_not_a_client(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        with pytest.raises(ElectorConfigError, match=r"takes a URL, got Redis"):
            elector.sync.Elector(LOCK, redis=client)  # type: ignore[arg-type]
        with pytest.raises(ElectorConfigError, match="on_overrun"):
            elector.sync.Elector(LOCK, redis=redis_url, on_overrun="kill")  # type: ignore[arg-type]
    finally:
        client.close()


async def test_each_fenced_store_refuses_the_other_kind_of_client_naming_the_right_class(
    redis_url: str,
) -> None:
    sync_client = redis.Redis.from_url(redis_url)
    async_client = redis.asyncio.Redis.from_url(redis_url)
    try:
        with pytest.raises(TypeError, match=r"for a redis\.client\.Redis use elector\.sync\.FencedStore"):
            elector.FencedStore(sync_client)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"use elector\.FencedStore"):
            elector.sync.FencedStore(async_client)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"needs a redis\.Redis or redis\.RedisCluster client, got str"):
            elector.sync.FencedStore("redis://")  # type: ignore[arg-type]
    finally:
        sync_client.close()
        await async_client.aclose()


def test_the_sync_fenced_store_refuses_a_stale_token(plain: redis.Redis) -> None:
    store = elector.sync.FencedStore(plain)
    assert store.set("{jobs}:report", "new", fencing_token=7).accepted
    assert not store.set("{jobs}:report", "old", fencing_token=6).accepted
    with pytest.raises(elector.StaleFencingTokenError):
        store.set_or_raise("{jobs}:report", "old", fencing_token=6)
    with pytest.raises(elector.StaleFencingTokenError):
        store.delete_or_raise("{jobs}:report", fencing_token=5)
    assert store.raise_fence("{jobs}:report", fencing_token=9).highest_token == 9
    assert store.highest_token("{jobs}:report") == 9
    assert plain.get("{jobs}:report") == b"new"
    plain.set("{jobs}:broken:fence", "x")
    with pytest.raises(elector.CorruptFenceKeyError):
        store.set("{jobs}:broken", "v", fencing_token=1)


def test_sync_callbacks_run_in_a_worker_thread(make) -> None:
    seen: list[tuple[str, object, str]] = []
    e = make(
        "a",
        on_started_leading=lambda lease: seen.append(
            ("started", lease.fencing_token, threading.current_thread().name)
        ),
        on_stopped_leading=lambda reason: seen.append(("stopped", reason, threading.current_thread().name)),
    )
    with e.leadership():
        pass
    wait_until(lambda: len(seen) == 2, timeout_s=5)
    assert [entry[0] for entry in seen] == ["started", "stopped"]
    assert seen[1][1] is StepDownReason.RESIGNED
    assert not any(name.startswith("elector:") for _, _, name in seen)  # never on the loop's thread


def test_a_closed_sync_elector_says_it_was_closed(redis_url: str, seeded: redis.Redis) -> None:
    e = elector.sync.Elector(LOCK, redis=redis_url, ttl_s=1.0)
    with pytest.raises(RuntimeError, match="not started"):
        e.wait_for_leadership()
    with e:
        e.wait_for_leadership(timeout=5)
    with pytest.raises(RuntimeError, match="was closed"):
        e.wait_for_leadership()
    assert seeded.exists(KEY) == 0  # released at close
