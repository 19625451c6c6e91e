"""Candidate registration, priorities and handoffs in the lease scripts, against a real redis-server."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable

import pytest
import redis.asyncio
from redis.crc import key_slot

from elector.backend import HandoffRefusedError, RedisLeaseBackend, RedisSettings, make_client
from elector.backend.lua import lease as scripts
from elector.lease import (
    BackendErrorKind,
    Candidate,
    Granted,
    Handoff,
    Held,
    Lease,
    LeaseBackendError,
    LeaseEventKind,
    QuietPeriod,
    Renewed,
    StandBack,
)
from tests.support.expiry import assert_expiry_set, assert_remaining_within, started_s
from tests.support.seed import seed_used_lock_async

TTL_MS = 2000
KEYS = scripts.LockKeys("jobs")


@pytest.fixture
async def raw(raw: redis.asyncio.Redis) -> redis.asyncio.Redis:
    await seed_used_lock_async(raw)  # skip the new-lock quiet period
    return raw


@pytest.fixture
async def backend_for(
    redis_url: str, raw: redis.asyncio.Redis
) -> AsyncIterator[Callable[..., RedisLeaseBackend]]:
    clients: list[redis.asyncio.Redis] = []

    def make(lock: str = "jobs") -> RedisLeaseBackend:
        client = make_client(RedisSettings(url=redis_url, request_timeout_s=1.0))
        clients.append(client)
        return RedisLeaseBackend(client, lock=lock)

    yield make
    for client in clients:
        await client.aclose()


@pytest.fixture
def backend(backend_for: Callable[..., RedisLeaseBackend]) -> RedisLeaseBackend:
    return backend_for()


async def grant(
    backend: RedisLeaseBackend, identity: str, *, ttl_ms: int = TTL_MS, priority: int = 0
) -> Lease:
    result = await backend.acquire(identity, ttl_ms=ttl_ms, priority=priority)
    assert isinstance(result, Granted), result
    return result.lease


async def server_ms(raw: redis.asyncio.Redis) -> int:
    seconds, micros = await raw.time()
    return int(seconds) * 1000 + int(micros) // 1000


def names(candidates: list[Candidate]) -> list[str]:
    return [c.identity for c in candidates]


# -- registration --------------------------------------------------------------------------------


async def test_every_acquire_attempt_and_renewal_registers_the_candidate(backend, raw) -> None:
    lease = await grant(backend, "a", priority=5)
    held = await backend.acquire("b", ttl_ms=TTL_MS, priority=7)  # a failed attempt registers too
    assert isinstance(held, Held)
    entry = json.loads(await raw.hget(KEYS.candidates, "b"))
    assert entry["priority"] == 7 and abs(entry["seen_ms"] - await server_ms(raw)) < 1000
    expiry = await raw.zscore(KEYS.candidate_expiry, "b")
    assert expiry == entry["seen_ms"] + 3 * TTL_MS  # lapses after three ttls
    listed = await backend.candidates()
    assert [(c.identity, c.priority) for c in listed] == [("b", 7), ("a", 5)]
    assert all(0 <= c.last_seen_ms_ago < 1000 for c in listed)
    await asyncio.sleep(0.05)
    before = json.loads(await raw.hget(KEYS.candidates, "a"))["seen_ms"]
    assert isinstance(await backend.renew(lease, priority=9), Renewed)  # the renewal refreshes it
    after = json.loads(await raw.hget(KEYS.candidates, "a"))
    assert after["priority"] == 9 and after["seen_ms"] >= before + 40
    listed = await backend.candidates()
    assert names(listed) == ["a", "b"] and listed[0].last_seen_ms_ago < 100


async def test_candidates_are_sorted_by_priority_then_identity(backend) -> None:
    for identity, priority in (("c", 1), ("b", 3), ("a", 1), ("d", -2)):
        await backend.acquire(identity, ttl_ms=TTL_MS, priority=priority)
    assert [(c.identity, c.priority) for c in await backend.candidates()] == [
        ("b", 3),
        ("a", 1),
        ("c", 1),
        ("d", -2),
    ]


async def test_an_entry_lapses_after_three_ttls_without_a_refresh(backend, raw) -> None:
    # Each look is placed from what this process measured around the write, with a ttl of its
    # own slack: the first past one ttl and 1.8 s before the lapse, the second after it. A 0.3 s
    # ttl with fixed sleeps left 0.4 s for a loaded loop's lateness.
    await backend.acquire("a", ttl_ms=1000, priority=1)
    written_by = time.monotonic()
    await asyncio.sleep(1.2)
    assert names(await backend.candidates()) == ["a"]  # past one ttl, under three: still live
    await asyncio.sleep(max(0.0, written_by + 3.05 - time.monotonic()))
    assert await backend.candidates() == []  # 3 ttls: lapsed, and pruned by that very call
    assert await raw.hlen(KEYS.candidates) == 0 and await raw.zcard(KEYS.candidate_expiry) == 0


async def test_each_call_prunes_at_most_a_bounded_number_of_lapsed_entries(backend, raw) -> None:
    past = await server_ms(raw) - 1000
    lapsed = {f"old-{i}": past for i in range(250)}
    await raw.zadd(KEYS.candidate_expiry, lapsed)
    await raw.hset(KEYS.candidates, mapping=dict.fromkeys(lapsed, '{"priority":0,"seen_ms":1}'))
    await backend.acquire("a", ttl_ms=TTL_MS)
    assert await raw.zcard(KEYS.candidate_expiry) == 250 - scripts.PRUNE_LIMIT + 1
    assert await raw.hlen(KEYS.candidates) == 250 - scripts.PRUNE_LIMIT + 1
    await backend.acquire("a", ttl_ms=TTL_MS)
    await backend.acquire("a", ttl_ms=TTL_MS)
    assert await raw.zcard(KEYS.candidate_expiry) == 1  # drained over a few calls
    assert names(await backend.candidates()) == ["a"]


async def test_beyond_the_cap_new_identities_are_not_registered_but_still_granted(backend, raw) -> None:
    future = await server_ms(raw) + 60_000
    crowd = {f"c{i:04d}": future for i in range(scripts.MAX_CANDIDATES)}
    await raw.zadd(KEYS.candidate_expiry, crowd)
    await raw.hset(KEYS.candidates, mapping=dict.fromkeys(crowd, '{"priority":0,"seen_ms":1}'))
    lease = await grant(backend, "newcomer", priority=3)  # the grant logic does not care
    assert await raw.hget(KEYS.candidates, "newcomer") is None
    assert await raw.zcard(KEYS.candidate_expiry) == scripts.MAX_CANDIDATES
    assert isinstance(await backend.renew(lease), Renewed)
    await backend.acquire("c0007", ttl_ms=TTL_MS, priority=4)  # a registered one is still refreshed
    assert json.loads(await raw.hget(KEYS.candidates, "c0007"))["priority"] == 4
    assert len(await backend.candidates()) == scripts.MAX_CANDIDATES


async def test_withdraw_removes_the_entry(backend, raw) -> None:
    await backend.acquire("a", ttl_ms=TTL_MS)
    await backend.acquire("b", ttl_ms=TTL_MS)
    await backend.withdraw("a")
    await backend.withdraw("never-registered")  # not an error
    assert names(await backend.candidates()) == ["b"]
    assert await raw.hexists(KEYS.candidates, "a") == 0
    assert await raw.zscore(KEYS.candidate_expiry, "a") is None


async def test_identities_with_quotes_and_unicode_round_trip(backend) -> None:
    odd = 'pod "ü" /\\ 😀'
    lease = await grant(backend, odd, priority=2)
    assert names(await backend.candidates()) == [odd]
    await backend.acquire("b", ttl_ms=TTL_MS, priority=1)
    handoff = await backend.request_handoff(to="b", window_ms=5000)
    assert handoff == Handoff(from_identity=odd, to_identity="b", remaining_ms=5000)
    renewed = await backend.renew(lease, priority=2)
    assert isinstance(renewed, Renewed) and renewed.handoff is not None
    assert renewed.handoff.from_identity == odd
    await backend.withdraw(odd)
    assert names(await backend.candidates()) == ["b"]


async def test_a_bad_priority_is_a_backend_error_and_writes_nothing(backend, raw) -> None:
    # The LeaseBackend protocol promises LeaseBackendError only: an election that passes a bad
    # priority gets a failed request (DATA, as the script's own refusal), never a crash.
    lease = await grant(backend, "a", priority=1)
    for bad in (10**9 + 1, -(10**9) - 1, True, 1.5, "1"):
        with pytest.raises(LeaseBackendError, match=r"^acquire: priority must be an integer .*got") as caught:
            await backend.acquire("b", ttl_ms=TTL_MS, priority=bad)
        assert caught.value.kind is BackendErrorKind.DATA
        with pytest.raises(LeaseBackendError, match=r"^renew: priority must be an integer .*got") as caught:
            await backend.renew(lease, priority=bad)
        assert caught.value.kind is BackendErrorKind.DATA
    assert names(await backend.candidates()) == ["a"]  # "b" was never registered
    assert (await backend.candidates())[0].priority == 1  # nor was a's entry rewritten
    assert await raw.pttl(KEYS.lease) > 0  # the lease stayed a's (not renewed, not lost)
    assert isinstance(await backend.renew(lease, priority=10**9), Renewed)  # the bounds are inclusive


async def test_the_scripts_refuse_a_bad_priority(raw) -> None:
    keys = [KEYS.lease, KEYS.fencing, KEYS.quiet, KEYS.server, KEYS.candidates, KEYS.candidate_expiry]
    for bad in ("1.5", "abc", "1e10"):
        with pytest.raises(redis.exceptions.ResponseError, match="priority must be an integer"):
            await raw.eval(scripts.ACQUIRE, 7, *keys, KEYS.handoff, '"a"', "t", "1000", KEYS.channel, bad)
    assert await raw.exists(KEYS.lease) == 0


def test_every_new_key_is_in_the_lock_slot() -> None:
    keys = [KEYS.lease, KEYS.candidates, KEYS.candidate_expiry, KEYS.handoff, KEYS.channel]
    assert len({key_slot(k.encode()) for k in keys}) == 1
    assert (KEYS.candidates, KEYS.candidate_expiry, KEYS.handoff) == (
        "elector:{jobs}:candidates",
        "elector:{jobs}:candidates:expiry",
        "elector:{jobs}:handoff",
    )


# -- best rival ----------------------------------------------------------------------------------


async def test_renew_reports_the_best_live_rival(backend, raw) -> None:
    lease = await grant(backend, "leader", priority=5)
    renewed = await backend.renew(lease, priority=5)
    assert renewed == Renewed(handoff=None, best_rival=None)  # alone: no rival
    await backend.acquire("low", ttl_ms=TTL_MS, priority=1)
    await backend.acquire("high", ttl_ms=TTL_MS, priority=8)
    await backend.acquire("mid", ttl_ms=TTL_MS, priority=6)
    await asyncio.sleep(0.05)
    renewed = await backend.renew(lease, priority=5)
    assert isinstance(renewed, Renewed) and renewed.best_rival is not None
    assert (renewed.best_rival.identity, renewed.best_rival.priority) == ("high", 8)
    assert 40 <= renewed.best_rival.last_seen_ms_ago < 1000
    # The renewing identity is never its own rival, even with the highest priority.
    renewed = await backend.renew(lease, priority=50)
    assert isinstance(renewed, Renewed) and renewed.best_rival is not None
    assert renewed.best_rival.identity == "high"


async def test_a_tie_goes_to_the_greatest_identity(backend) -> None:
    lease = await grant(backend, "leader")
    for identity in ("bravo", "charlie", "alpha"):
        await backend.acquire(identity, ttl_ms=TTL_MS, priority=3)
    renewed = await backend.renew(lease)
    assert isinstance(renewed, Renewed) and renewed.best_rival is not None
    assert renewed.best_rival.identity == "charlie"


async def test_a_lapsed_rival_is_not_reported(backend) -> None:
    # Only "gone" lapses: the leader's lease and "here" have ttls no loaded loop outlasts here.
    lease = await grant(backend, "leader", ttl_ms=10_000)
    await backend.acquire("gone", ttl_ms=100, priority=9)  # lapses after 300 ms
    await backend.acquire("here", ttl_ms=10_000, priority=2)
    await asyncio.sleep(0.35)
    renewed = await backend.renew(lease)
    assert isinstance(renewed, Renewed) and renewed.best_rival is not None
    assert renewed.best_rival.identity == "here"


# -- handoffs ------------------------------------------------------------------------------------


async def test_request_handoff_on_a_free_lock_does_nothing(backend, raw) -> None:
    assert await backend.request_handoff(to=None, window_ms=5000) is None
    assert await backend.request_handoff(to="b", window_ms=5000) is None
    await raw.set(KEYS.lease, "someone else's value", px=5000)
    assert await backend.request_handoff(to="b", window_ms=5000) is None  # no elector holder
    assert await raw.exists(KEYS.handoff) == 0


async def test_request_handoff_to_the_holder_is_refused(backend, raw) -> None:
    await grant(backend, "a")
    with pytest.raises(HandoffRefusedError, match="'a' already holds the lock") as info:
        await backend.request_handoff(to="a", window_ms=5000)
    assert info.value.holder == "a"
    assert await raw.exists(KEYS.handoff) == 0


async def test_request_handoff_marks_it_and_tells_the_holder(backend_for, raw) -> None:
    a, watcher = backend_for(), backend_for()
    lease = await grant(a, "a")
    subscription = await watcher.subscribe(keepalive_s=60)
    before_request_s = started_s()
    handoff = await watcher.request_handoff(to="b", window_ms=5000)
    assert handoff == Handoff(from_identity="a", to_identity="b", remaining_ms=5000)
    assert json.loads(await raw.get(KEYS.handoff)) == {"from": "a", "to": "b"}
    await assert_expiry_set(raw, KEYS.handoff, set_ms=5000, written_after_s=before_request_s)
    event = await subscription.next_event(1.0)
    assert event is not None and event.kind is LeaseEventKind.HANDOFF and event.holder == lease.holder
    renewed = await a.renew(lease)  # the holder also finds it at its next renewal
    assert isinstance(renewed, Renewed) and renewed.handoff is not None
    assert (renewed.handoff.from_identity, renewed.handoff.to_identity) == ("a", "b")
    assert_remaining_within(
        renewed.handoff.remaining_ms, set_ms=5000, written_after_s=before_request_s, what="handoff at renewal"
    )
    await subscription.close()


async def test_the_handoff_announcement_carries_the_target(backend_for, raw) -> None:
    backend = backend_for()
    await grant(backend, "a")
    pubsub = raw.pubsub()
    await pubsub.subscribe(KEYS.channel)
    await pubsub.get_message(timeout=1)
    await backend.request_handoff(to=None, window_ms=1000)
    message = await pubsub.get_message(timeout=1)
    assert message is not None
    data = json.loads(message["data"])
    assert data["event"] == "handoff" and data["identity"] == "a" and data["to"] is None
    assert "token" not in data
    await pubsub.aclose()


async def test_a_handoff_is_reported_on_renew_only_to_its_from(backend, raw) -> None:
    lease = await grant(backend, "a")
    await raw.set(KEYS.handoff, json.dumps({"from": "old-leader", "to": "b"}), px=5000)
    renewed = await backend.renew(lease)
    assert isinstance(renewed, Renewed) and renewed.handoff is None  # stale: not ours to act on


async def test_stand_back_semantics_of_a_targeted_handoff(backend_for, raw) -> None:
    a, b, c = backend_for(), backend_for(), backend_for()
    lease = await grant(a, "a")
    await b.acquire("b", ttl_ms=TTL_MS)
    before_request_s = started_s()
    await c.request_handoff(to="b", window_ms=5000)
    assert isinstance(await c.acquire("c", ttl_ms=TTL_MS), Held)  # held: the holder answers first
    assert await a.release(lease)
    refused_from = await a.acquire("a", ttl_ms=TTL_MS)
    assert isinstance(refused_from, StandBack)
    assert refused_from.handoff.from_identity == "a" and refused_from.handoff.to_identity == "b"
    assert_remaining_within(
        refused_from.handoff.remaining_ms, set_ms=5000, written_after_s=before_request_s, what="handoff"
    )
    assert isinstance(await c.acquire("c", ttl_ms=TTL_MS), StandBack)  # not the target
    assert await raw.exists(KEYS.lease) == 0
    target = await grant(b, "b")
    assert target.identity == "b"
    assert await raw.exists(KEYS.handoff) == 0  # the grant to the target ended the handoff
    await b.release(target)
    assert (await grant(a, "a")).identity == "a"  # and nobody stands back any more


async def test_a_handoff_to_anyone_refuses_only_its_from(backend_for, raw) -> None:
    a, b = backend_for(), backend_for()
    lease = await grant(a, "a")
    await b.request_handoff(to=None, window_ms=5000)
    assert await a.release(lease)
    assert isinstance(await a.acquire("a", ttl_ms=TTL_MS), StandBack)
    assert await raw.exists(KEYS.handoff) == 1
    assert (await grant(b, "b")).identity == "b"
    assert await raw.exists(KEYS.handoff) == 0


async def test_when_the_window_ends_anyone_may_take_the_lock(backend_for) -> None:
    a, c = backend_for(), backend_for()
    lease = await grant(a, "a")
    await c.request_handoff(to="b-never-comes", window_ms=300)
    assert await a.release(lease)
    assert isinstance(await c.acquire("c", ttl_ms=TTL_MS), StandBack)
    await asyncio.sleep(0.35)
    assert (await grant(c, "c")).identity == "c"


async def test_release_with_a_handoff_is_atomic_and_announced(backend_for, raw) -> None:
    a, b, c = backend_for(), backend_for(), backend_for()
    lease = await grant(a, "a")
    subscription = await b.subscribe(keepalive_s=60)
    pubsub = raw.pubsub()
    await pubsub.subscribe(KEYS.channel)
    await pubsub.get_message(timeout=1)
    before_release_s = started_s()
    assert await a.release(lease, handoff_to="b", handoff_window_ms=3000)
    assert await raw.exists(KEYS.lease) == 0
    assert json.loads(await raw.get(KEYS.handoff)) == {"from": "a", "to": "b"}
    await assert_expiry_set(raw, KEYS.handoff, set_ms=3000, written_after_s=before_release_s)
    event = await subscription.next_event(1.0)
    assert event is not None and event.kind is LeaseEventKind.RELEASED and event.holder == lease.holder
    message = await pubsub.get_message(timeout=1)
    assert message is not None and json.loads(message["data"])["to"] == "b"
    assert isinstance(await c.acquire("c", ttl_ms=TTL_MS), StandBack)
    assert (await grant(b, "b")).identity == "b"
    await subscription.close()
    await pubsub.aclose()


async def test_release_that_is_not_ours_starts_no_handoff(backend_for, raw) -> None:
    a = backend_for()
    lease = await grant(a, "a", ttl_ms=200)
    await asyncio.sleep(0.25)
    assert not await a.release(lease, handoff_to="b", handoff_window_ms=3000)
    assert await raw.exists(KEYS.handoff) == 0
    # A bad argument is a backend error like any other (the LeaseBackend protocol), never sent.
    with pytest.raises(LeaseBackendError, match=r"^release: a handoff window must be positive") as caught:
        await a.release(lease, handoff_to="b", handoff_window_ms=0)
    assert caught.value.kind is BackendErrorKind.DATA
    with pytest.raises(LeaseBackendError, match=r"^handoff: a handoff window must be positive"):
        await a.request_handoff(to="b", window_ms=0)
    with pytest.raises(LeaseBackendError, match=r"^acquire: ttl must be positive"):
        await a.acquire("b", ttl_ms=0)
    assert await raw.exists(KEYS.handoff) == 0


async def test_the_quiet_period_comes_before_the_handoff(backend, raw) -> None:
    await raw.set(KEYS.handoff, json.dumps({"from": "a", "to": "b"}), px=5000)
    await raw.delete(KEYS.fencing)  # Redis lost its data: a quiet period starts
    assert isinstance(await backend.acquire("a", ttl_ms=TTL_MS), QuietPeriod)


# -- garbage written by someone else -------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "not json",
        "[" * 3000,
        '{"to": "b"}',
        '{"from": 7, "to": "b"}',
        '{"from": "a", "to": 7}',
        '["a", "b"]',
        '"a"',
        json.dumps({"from": "x" * 5000, "to": "b"}),
        "\xff\xfe",
    ],
    ids=lambda v: v[:20],
)
async def test_a_garbage_handoff_never_blocks_a_grant(backend, raw, value: str) -> None:
    await raw.set(KEYS.handoff, value, px=5000)
    lease = await grant(backend, "c")
    renewed = await backend.renew(lease)
    assert isinstance(renewed, Renewed) and renewed.handoff is None


async def test_a_handoff_without_expiry_or_of_another_type_is_ignored(backend, raw) -> None:
    await raw.set(KEYS.handoff, json.dumps({"from": "x", "to": "b"}))  # no PX: would block forever
    lease = await grant(backend, "c")
    await backend.release(lease)
    await raw.delete(KEYS.handoff)
    await raw.hset(KEYS.handoff, "from", "x")
    assert (await grant(backend, "c")).identity == "c"


async def test_garbage_candidate_entries_are_ignored(backend, raw) -> None:
    future = await server_ms(raw) + 60_000
    garbage = {
        "text": "garbage",
        "json-string-priority": '{"priority":"9","seen_ms":1}',
        "huge": '{"priority":' + "9" * 40 + ',"seen_ms":1}',
        "nested": "[" * 3000,
        "extra-field": '{"priority":9,"seen_ms":1,"x":1}',
    }
    await raw.hset(KEYS.candidates, mapping=garbage)
    await raw.zadd(KEYS.candidate_expiry, {**dict.fromkeys(garbage, future), "no-entry": future})
    lease = await grant(backend, "leader")
    await backend.acquire("real", ttl_ms=TTL_MS, priority=1)
    renewed = await backend.renew(lease)
    assert isinstance(renewed, Renewed) and renewed.best_rival is not None
    assert renewed.best_rival.identity == "real"
    assert names(await backend.candidates()) == ["real", "leader"]  # garbage left out


async def test_a_registry_of_the_wrong_type_never_blocks_an_election(backend, raw) -> None:
    await raw.set(KEYS.candidates, "a string")
    await raw.set(KEYS.candidate_expiry, "another string")
    lease = await grant(backend, "a")
    renewed = await backend.renew(lease)
    assert renewed == Renewed(handoff=None, best_rival=None)
    assert await backend.release(lease)
    with pytest.raises(LeaseBackendError, match=r"candidate registry .* is not a hash") as info:
        await backend.candidates()
    assert info.value.kind is BackendErrorKind.DATA
