"""The batch scripts (lua/batch.py) keep every per-lease rule, against a real redis-server.

Two levels: the batch scripts called directly, next to the single-lease scripts on a mirror of
the same locks (same states, same arguments: the same replies and the same writes), and the real
path, `RedisLeaseBackend`s sharing a `ScriptBatcher`, whose concurrent calls go out as one batch
script call with each lease its own result.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import pytest
import redis.asyncio
import redis.exceptions

from elector.backend import RedisLeaseBackend, RedisSettings, make_client
from elector.backend.lua import batch, lease
from elector.backend.lua.lease import LockKeys
from elector.backend.pipeline import MAX_LEASES_PER_CALL, ScriptBatcher
from elector.lease import (
    BackendErrorKind,
    Granted,
    Held,
    Lease,
    LeaseBackendError,
    Lost,
    QuietPeriod,
    Renewed,
)
from tests.support.seed import seed_used_lock_async

TTL_MS = 5000
ME = json.dumps("me")
FOREIGN_VALUE = json.dumps({"identity": "other", "fencing_token": 7, "token": "x"})


def renew_keys(keys: LockKeys) -> list[str]:
    return [keys.lease, keys.candidates, keys.candidate_expiry, keys.handoff, keys.meta]


def acquire_keys(keys: LockKeys) -> list[str]:
    return [
        keys.lease,
        keys.fencing,
        keys.quiet,
        keys.server,
        keys.candidates,
        keys.candidate_expiry,
        keys.handoff,
        keys.meta,
    ]


async def commandstat(raw: redis.asyncio.Redis, command: str) -> int:
    stats = await raw.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


async def call_batch(raw: redis.asyncio.Redis, source: str, leases: list[tuple[list[str], list[Any]]]) -> Any:
    """One call of a batch script: per lease its keys and arguments (the single script's)."""
    keys = [key for lease_keys, _ in leases for key in lease_keys]
    args = [len(leases[0][0]), len(leases[0][1]), *(arg for _, lease_args in leases for arg in lease_args)]
    return await raw.register_script(source)(keys=keys, args=args)


async def call_singly(
    raw: redis.asyncio.Redis, source: str, leases: list[tuple[list[str], list[Any]]]
) -> list[Any]:
    """The single script once per lease: its reply, or the error it raised."""
    script = raw.register_script(source)
    replies: list[Any] = []
    for keys, args in leases:
        try:
            replies.append(await script(keys=keys, args=args))
        except redis.exceptions.ResponseError as exc:
            replies.append(exc)
    return replies


def shape(reply: Any) -> Any:
    """A reply with its timing parts blurred (times in ms to 20 s buckets, server-ms tokens)."""
    if isinstance(reply, Exception):
        # The single script's error carries the script's sha and line; the batch's does not.
        return ("error", str(reply).split(" script: ")[0])
    if isinstance(reply, list) and len(reply) == 7 and reply[0] == 1 and isinstance(reply[5], int):
        # RENEW's renewed reply: its sixth element is the rival's "seen ms ago", a time however
        # small (blurred by size alone, 8 ms on one side and 10 on the other differed under load);
        # the seventh the identity clash.
        return [*(shape(item) for item in reply[:5]), ("20 s bucket", reply[5] // 20_000), reply[6]]
    if isinstance(reply, list):
        return [shape(item) for item in reply]
    if isinstance(reply, int) and reply > 10**12:
        return "a token"
    if isinstance(reply, int) and reply >= 10:  # a time in ms: a PTTL, a "seen ms ago"
        return ("20 s bucket", reply // 20_000)
    if isinstance(reply, bytes) and reply.startswith(b"{"):
        value = json.loads(reply)
        if isinstance(value, dict) and "fencing_token" in value:
            value["fencing_token"] = "a token" if value["fencing_token"] > 10**12 else value["fencing_token"]
        return value
    return reply


async def lock_states(raw: redis.asyncio.Redis, prefix: str, *, states: list[str]) -> list[LockKeys]:
    """One lock per state, named prefix-<index>-<state>; "ours" leases hold value "ours"."""
    found = []
    for index, state in enumerate(states):
        name = f"{prefix}-{index}-{state}"
        keys = LockKeys(name)
        found.append(keys)
        if state != "new":
            await seed_used_lock_async(raw, name)
        if state == "ours":
            await raw.set(keys.lease, "ours", px=TTL_MS)
        elif state == "ours-long":  # a TTL longer than the renewal's: replaced, never added to
            await raw.set(keys.lease, "ours", px=60_000)
        elif state == "foreign":
            await raw.set(keys.lease, FOREIGN_VALUE, px=TTL_MS)
        elif state == "wrongtype":
            await raw.hset(keys.lease, "x", "1")
        elif state == "handoff-from-me":
            await raw.set(keys.lease, "ours", px=TTL_MS)
            await raw.set(keys.handoff, json.dumps({"from": "me", "to": "b"}), px=TTL_MS)
        elif state == "rival":
            await raw.set(keys.lease, "ours", px=TTL_MS)
            await raw.hset(keys.candidates, "b", f'{{"priority":5,"seen_ms":{await server_ms(raw)}}}')
            await raw.zadd(keys.candidate_expiry, {"b": await server_ms(raw) + 60_000})
        elif state == "foreign-protocol":
            await raw.hset(keys.meta, "protocol", "9")
        elif state == "adopt":  # an earlier grant to our owner token whose answer was lost
            value = json.dumps({"identity": "me", "fencing_token": 5, "token": "feed"}).replace(" ", "")
            await raw.set(keys.lease, value, px=1000)
        elif state == "stand-back":
            await raw.set(keys.handoff, json.dumps({"from": "other", "to": "b"}), px=TTL_MS)
    return found


async def server_ms(raw: redis.asyncio.Redis) -> int:
    seconds, micros = await raw.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def key_states(raw: redis.asyncio.Redis, locks: list[LockKeys]) -> list[Any]:
    """What a script wrote: per lock its lease value (if a string), PTTL (blurred), handoff."""
    found = []
    for keys in locks:
        kind = await raw.type(keys.lease)
        value = await raw.get(keys.lease) if kind == b"string" else kind
        found.append((shape(value), shape(await raw.pttl(keys.lease)), await raw.exists(keys.handoff)))
    return found


# --- the batch scripts themselves, next to the single scripts ---------------------------------------

RENEW_STATES = ["ours", "ours-long", "foreign", "lapsed", "wrongtype", "handoff-from-me", "rival", "bad-ttl"]


async def test_a_batch_renew_answers_and_writes_as_the_single_script_does_lease_by_lease(raw) -> None:
    single = await lock_states(raw, "renew-single", states=RENEW_STATES)
    batched = await lock_states(raw, "renew-batch", states=RENEW_STATES)

    def leases(locks: list[LockKeys]) -> list[tuple[list[str], list[Any]]]:
        return [
            (renew_keys(keys), ["ours", 0 if state == "bad-ttl" else TTL_MS, ME, 0])
            for keys, state in zip(locks, RENEW_STATES, strict=True)
        ]

    expected = await call_singly(raw, lease.RENEW, leases(single))
    compact = await call_batch(raw, batch.RENEW_BATCH, leases(batched))
    # The plain renewal, nothing to report, is answered 1 (RENEWED); the others as they are.
    assert [i for i, reply in enumerate(compact) if reply == batch.RENEWED] == [0, 1]
    replies = [[1, b"", 0, b"", 0, 0, 0] if reply == batch.RENEWED else reply for reply in compact]
    assert shape(replies) == shape(expected)
    assert await key_states(raw, batched) == await key_states(raw, single)
    by_state = dict(zip(RENEW_STATES, replies, strict=True))
    # The rules, spelled out (the equality above already holds them to the single script's):
    assert by_state["ours"][0] == 1 and by_state["handoff-from-me"][0] == 1 and by_state["rival"][0] == 1
    assert by_state["foreign"][0] == 0 and b'"other"' in by_state["foreign"][1]  # owner check
    assert by_state["lapsed"] == [0, b"", -2, 0]
    assert not await raw.exists(batched[RENEW_STATES.index("lapsed")].lease)  # never re-created
    assert await raw.pttl(batched[RENEW_STATES.index("ours-long")].lease) <= TTL_MS  # replaced, not added
    assert isinstance(by_state["wrongtype"], redis.exceptions.ResponseError)
    assert "WRONGTYPE" in str(by_state["wrongtype"])
    assert isinstance(by_state["bad-ttl"], redis.exceptions.ResponseError)
    assert "ttl must be a positive integer" in str(by_state["bad-ttl"])
    assert not await raw.exists(batched[RENEW_STATES.index("bad-ttl")].lease)  # refused: not even read
    assert json.loads(by_state["handoff-from-me"][1]) == {"from": "me", "to": "b"}
    assert by_state["rival"][3:5] == [b"b", 5]


ACQUIRE_STATES = ["free", "new", "foreign", "foreign-protocol", "adopt", "stand-back", "wrongtype", "bad-ttl"]


async def test_a_batch_acquire_answers_and_writes_as_the_single_script_does_lease_by_lease(raw) -> None:
    single = await lock_states(raw, "acquire-single", states=ACQUIRE_STATES)
    batched = await lock_states(raw, "acquire-batch", states=ACQUIRE_STATES)

    def leases(locks: list[LockKeys]) -> list[tuple[list[str], list[Any]]]:
        return [
            (acquire_keys(keys), [ME, "feed", 0 if state == "bad-ttl" else TTL_MS, keys.channel, 0, 0, 0])
            for keys, state in zip(locks, ACQUIRE_STATES, strict=True)
        ]

    expected = await call_singly(raw, lease.ACQUIRE, leases(single))
    replies = await call_batch(raw, batch.ACQUIRE_BATCH, leases(batched))
    assert shape(replies) == shape(expected)
    assert await key_states(raw, batched) == await key_states(raw, single)
    for single_keys, batch_keys in zip(single, batched, strict=True):  # quiet periods, meta, counters
        assert await raw.exists(batch_keys.quiet) == await raw.exists(single_keys.quiet)
        meta, single_meta = await raw.hgetall(batch_keys.meta), await raw.hgetall(single_keys.meta)
        assert meta.keys() == single_meta.keys()
        assert {k: v for k, v in meta.items() if k != b"ttl_until_ms"} == {
            k: v for k, v in single_meta.items() if k != b"ttl_until_ms"
        }
        assert (await raw.get(batch_keys.fencing) is None) == (await raw.get(single_keys.fencing) is None)
    codes = {state: reply if isinstance(reply, Exception) else reply[0]
             for state, reply in zip(ACQUIRE_STATES, replies, strict=True)}  # fmt: skip
    assert codes["free"] == 1 and codes["adopt"] == 1  # granted; our earlier grant adopted
    assert codes["new"] == 2  # a new lock: the quiet period
    assert codes["foreign"] == 0 and codes["foreign-protocol"] == 4 and codes["stand-back"] == 3
    assert isinstance(codes["wrongtype"], redis.exceptions.ResponseError)
    assert isinstance(codes["bad-ttl"], redis.exceptions.ResponseError)


async def test_a_batch_release_deletes_only_our_leases(raw) -> None:
    states = ["ours", "foreign", "lapsed", "ours"]
    single = await lock_states(raw, "release-single", states=states)
    batched = await lock_states(raw, "release-batch", states=states)

    def leases(locks: list[LockKeys]) -> list[tuple[list[str], list[Any]]]:
        # The last one starts a handoff in the same step as its delete.
        handoff = json.dumps({"from": "me", "to": "b"})
        return [
            ([keys.lease, keys.handoff], ["ours", keys.channel, "{}", handoff if i == 3 else "", TTL_MS])
            for i, keys in enumerate(locks)
        ]

    expected = await call_singly(raw, lease.RELEASE, leases(single))
    replies = await call_batch(raw, batch.RELEASE_BATCH, leases(batched))
    assert replies == expected == [1, 0, 0, 1]
    assert await key_states(raw, batched) == await key_states(raw, single)
    assert await raw.exists(batched[1].lease) and not await raw.exists(batched[0].lease)
    assert await raw.exists(batched[3].handoff)


async def test_a_malformed_batch_touches_no_lease(raw) -> None:
    keys = LockKeys("malformed")
    await raw.set(keys.lease, "ours", px=TTL_MS)
    script = raw.register_script(batch.RENEW_BATCH)
    with pytest.raises(redis.exceptions.ResponseError, match="do not divide into leases"):
        await script(keys=renew_keys(keys), args=[5, 4, "ours", 60_000, ME])  # one argument short
    with pytest.raises(redis.exceptions.ResponseError, match="whole counts"):
        await script(keys=renew_keys(keys), args=[0, 4, "ours", 60_000, ME, 0])
    assert await raw.pttl(keys.lease) <= TTL_MS  # not renewed to 60 s


def test_every_batch_script_is_its_single_scripts_body_in_a_loop() -> None:
    """The rules are the single scripts' own text: nothing to keep in step by hand."""
    for single, batched in batch.BATCH_OF.items():
        # The body starts after the last helper of the contenders' (lua/common.py, CALLER_LIB).
        body = single.split("local function read_nonce", 1)[-1].split("\nend\n", 1)[-1]
        assert body.strip() in batched
        assert "local function one(KEYS, ARGV)" in batched
    with pytest.raises(ValueError, match="does not start with the Lua helpers"):
        batch.body_of("return 1", prefix="local x = 1\n")


# --- the real path: backends sharing a batcher ------------------------------------------------------


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    made = make_client(RedisSettings(url=redis_url, request_timeout_s=2.0))
    yield made
    await made.aclose()


@pytest.fixture
async def batcher(client: redis.asyncio.Redis) -> AsyncIterator[ScriptBatcher]:
    made = ScriptBatcher(client)
    yield made
    await made.aclose()


async def together(calls: list[Awaitable[Any]]) -> list[Any]:
    """Concurrent calls (as renewals that fall due together); each one's result or error."""
    return list(await asyncio.gather(*calls, return_exceptions=True))


async def held_leases(
    raw: redis.asyncio.Redis, backends: list[RedisLeaseBackend], *, identity: str = "me"
) -> list[Lease]:
    for backend in backends:
        await seed_used_lock_async(raw, backend.lock)
    results = [await backend.acquire(identity, ttl_ms=TTL_MS) for backend in backends]
    assert all(isinstance(r, Granted) for r in results), results
    return [r.lease for r in results if isinstance(r, Granted)]


async def test_many_renewals_go_out_as_one_batch_script_call(raw, client, batcher: ScriptBatcher) -> None:
    backends = [RedisLeaseBackend(client, lock=f"many-{i}", batcher=batcher) for i in range(60)]
    leases = await held_leases(raw, backends)
    await together([b.renew(lease) for b, lease in zip(backends, leases, strict=True)])  # loads the script
    scripts_before, calls_before = batcher.stats.batch_scripts, batcher.stats.batched_calls
    evalsha_before = await commandstat(raw, "evalsha")
    results = await together([b.renew(lease) for b, lease in zip(backends, leases, strict=True)])
    assert all(isinstance(r, Renewed) for r in results), results
    assert batcher.stats.batch_scripts - scripts_before == 1
    assert batcher.stats.batched_calls - calls_before == 60
    assert await commandstat(raw, "evalsha") - evalsha_before == 1
    for lease_ in leases:
        assert 0 < await raw.pttl(LockKeys(lease_.lock).lease) <= TTL_MS


async def test_a_batch_is_cut_at_the_most_leases_per_call(raw, client, batcher: ScriptBatcher) -> None:
    count = MAX_LEASES_PER_CALL + 5
    backends = [RedisLeaseBackend(client, lock=f"cut-{i}", batcher=batcher) for i in range(count)]
    leases = await held_leases(raw, backends)
    scripts_before = batcher.stats.batch_scripts
    results = await together([b.renew(lease) for b, lease in zip(backends, leases, strict=True)])
    assert all(isinstance(r, Renewed) for r in results), results
    assert batcher.stats.batch_scripts - scripts_before == 2


async def test_a_mixed_batch_gives_each_lease_its_own_result(raw, client, batcher: ScriptBatcher) -> None:
    names = ["held", "lapsed", "foreign", "bad-ttl", "wrongtype", "held-long"]
    backends = {name: RedisLeaseBackend(client, lock=f"mixed-{name}", batcher=batcher) for name in names}
    leases = dict(zip(names, await held_leases(raw, list(backends.values())), strict=True))
    keys = {name: LockKeys(f"mixed-{name}") for name in names}
    await raw.delete(keys["lapsed"].lease)
    await raw.set(keys["foreign"].lease, FOREIGN_VALUE, px=TTL_MS)
    await raw.delete(keys["wrongtype"].lease)
    await raw.hset(keys["wrongtype"].lease, "x", "1")
    await raw.pexpire(keys["held-long"].lease, 60_000)
    leases["bad-ttl"] = Lease(
        lock=leases["bad-ttl"].lock, identity="me", fencing_token=leases["bad-ttl"].fencing_token,
        ttl_ms=0, value=leases["bad-ttl"].value,
    )  # fmt: skip
    scripts_before = batcher.stats.batch_scripts
    results = dict(zip(names, await together([backends[n].renew(leases[n]) for n in names]), strict=True))
    assert batcher.stats.batch_scripts - scripts_before == 1
    assert isinstance(results["held"], Renewed) and isinstance(results["held-long"], Renewed)
    assert results["lapsed"] == Lost(holder=None, remaining_ms=None)
    assert not await raw.exists(keys["lapsed"].lease)  # never re-created
    lost = results["foreign"]
    assert isinstance(lost, Lost) and lost.holder is not None and lost.holder.identity == "other"
    for name in ("bad-ttl", "wrongtype"):
        error = results[name]
        assert isinstance(error, LeaseBackendError) and error.kind is BackendErrorKind.DATA, error
    assert "ttl must be a positive integer" in str(results["bad-ttl"])
    assert "not a string" in str(results["wrongtype"])
    assert await raw.pttl(keys["held-long"].lease) <= TTL_MS  # the TTL replaced, not added to
    assert await raw.get(keys["bad-ttl"].lease) == leases["bad-ttl"].value.encode()  # untouched


async def test_acquires_of_many_free_locks_go_out_as_one_batch_script_call(raw, client, batcher) -> None:
    free = [RedisLeaseBackend(client, lock=f"start-{i}", batcher=batcher) for i in range(20)]
    for backend in free:
        await seed_used_lock_async(raw, backend.lock)
    held = RedisLeaseBackend(client, lock="start-held", batcher=batcher)
    await held_leases(raw, [held], identity="other")
    new = RedisLeaseBackend(client, lock="start-new", batcher=batcher)
    scripts_before, calls_before = batcher.stats.batch_scripts, batcher.stats.batched_calls
    results = await together([b.acquire("me", ttl_ms=TTL_MS) for b in [*free, held, new]])
    assert batcher.stats.batch_scripts - scripts_before == 1
    assert batcher.stats.batched_calls - calls_before == 22
    assert all(isinstance(r, Granted) and r.lease.identity == "me" for r in results[:20]), results
    assert isinstance(results[20], Held) and results[20].holder is not None
    assert results[20].holder.identity == "other"
    assert isinstance(results[21], QuietPeriod)
    for backend, result in zip(free, results, strict=False):
        assert isinstance(result, Granted)
        assert result.lease.fencing_token > 1  # above the seeded counter
        assert await raw.get(backend.keys.lease) == result.lease.value.encode()
        assert await raw.get(backend.keys.fencing) == str(result.lease.fencing_token).encode()


async def test_releases_at_shutdown_go_out_as_one_batch_script_call(raw, client, batcher) -> None:
    backends = [RedisLeaseBackend(client, lock=f"stop-{i}", batcher=batcher) for i in range(10)]
    leases = await held_leases(raw, backends)
    await raw.delete(backends[3].keys.lease)  # lapsed meanwhile: not ours to release
    scripts_before = batcher.stats.batch_scripts
    results = await together([b.release(lease) for b, lease in zip(backends, leases, strict=True)])
    assert batcher.stats.batch_scripts - scripts_before == 1
    assert results == [i != 3 for i in range(10)]
    assert not any([await raw.exists(b.keys.lease) for b in backends])


async def test_a_call_alone_is_sent_as_its_own_script_at_once(raw, client, batcher) -> None:
    backend = RedisLeaseBackend(client, lock="alone", batcher=batcher)
    (lease_,) = await held_leases(raw, [backend])
    before = batcher.stats.batch_scripts
    assert isinstance(await backend.renew(lease_), Renewed)
    assert batcher.stats.batch_scripts == before


async def test_batch_scripts_are_reloaded_after_a_script_flush(raw, client, batcher) -> None:
    backends = [RedisLeaseBackend(client, lock=f"flush-{i}", batcher=batcher) for i in range(4)]
    leases = await held_leases(raw, backends)

    def renewals() -> list[Awaitable[Any]]:
        return [b.renew(lease_) for b, lease_ in zip(backends, leases, strict=True)]

    assert all(isinstance(r, Renewed) for r in await together(renewals()))  # the batch form loaded
    await raw.script_flush()
    # A batch alone (the script call reloads it) ...
    assert all(isinstance(r, Renewed) for r in await together(renewals()))
    await raw.script_flush()
    # ... and a batch beside another command in one pipeline (the batcher reloads and retries).
    others = [RedisLeaseBackend(client, lock=f"flush-free-{i}", batcher=batcher) for i in range(2)]
    for backend in others:
        await seed_used_lock_async(raw, backend.lock)
    before = batcher.stats.noscript_retries
    results = await together([*renewals(), *(b.acquire("me", ttl_ms=TTL_MS) for b in others)])
    assert all(isinstance(r, Renewed) for r in results[:4]), results
    assert all(isinstance(r, Granted) for r in results[4:]), results
    assert batcher.stats.noscript_retries > before
