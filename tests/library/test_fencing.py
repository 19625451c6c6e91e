"""Fenced writes (`elector.library.fencing`) against a real redis-server, one per module."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
import redis.asyncio
import redis.exceptions

from elector.library.fencing import (
    MAX_FENCING_TOKEN,
    CorruptFenceKeyError,
    FencedStore,
    FencedWriteResult,
    FencingError,
    StaleFencingTokenError,
    check_fencing_token,
)
from elector.testing.redis_server import RedisServerProcess, free_tcp_port
from tests.support.expiry import assert_expiry_set, started_s
from tests.support.tiers import REDIS, needs

# Real tokens are Redis server time in ms: big numbers, where float rounding would show.
T = 1_795_296_567_927


@pytest.fixture(scope="module")
@needs(REDIS)
def module_redis() -> Iterator[RedisServerProcess]:
    with RedisServerProcess() as server:
        yield server


@pytest.fixture
async def make_client(
    module_redis: RedisServerProcess,
) -> AsyncIterator[Callable[..., redis.asyncio.Redis]]:
    clients: list[redis.asyncio.Redis] = []

    def make(*, decode_responses: bool = False) -> redis.asyncio.Redis:
        client = redis.asyncio.Redis.from_url(module_redis.url, decode_responses=decode_responses)
        clients.append(client)
        return client

    await make().flushall()  # the server is shared by the module's tests
    yield make
    for client in clients:
        await client.aclose()


@pytest.fixture
def raw(make_client: Callable[..., redis.asyncio.Redis]) -> redis.asyncio.Redis:
    return make_client()


@pytest.fixture
def store(raw: redis.asyncio.Redis) -> FencedStore:
    return FencedStore(raw)


async def test_first_write_is_accepted_and_records_the_token(store, raw) -> None:
    assert await store.highest_token("{jobs}:report") is None
    result = await store.set("{jobs}:report", "v1", fencing_token=T)
    assert result == FencedWriteResult(accepted=True, highest_token=T)
    assert await raw.get("{jobs}:report") == b"v1"
    assert await raw.get("{jobs}:report:fence") == str(T).encode()
    assert await store.highest_token("{jobs}:report") == T


async def test_equal_token_is_accepted_many_times(store, raw) -> None:
    for n in range(3):
        result = await store.set("k", f"v{n}", fencing_token=T)
        assert result.accepted and result.highest_token == T
    assert await raw.get("k") == b"v2"


async def test_stale_token_is_rejected_and_value_unchanged(store, raw) -> None:
    await store.set("k", "new leader", fencing_token=T + 5)
    result = await store.set("k", "paused ex-leader", fencing_token=T + 4, ttl_ms=50)
    assert result == FencedWriteResult(accepted=False, highest_token=T + 5)
    assert await raw.get("k") == b"new leader"
    assert await raw.pttl("k") == -1  # the rejected ttl was not applied either
    assert await store.highest_token("k") == T + 5


async def test_higher_token_is_accepted_and_raises_the_fence(store, raw) -> None:
    await store.set("k", "a", fencing_token=T)
    result = await store.set("k", "b", fencing_token=T + 1)
    assert result == FencedWriteResult(accepted=True, highest_token=T + 1)
    assert await raw.get("k") == b"b"
    assert not (await store.set("k", "a again", fencing_token=T)).accepted


async def test_token_bounds_are_exact(store) -> None:
    # Neighbours at the top of the range differ by one: no float rounding in Lua.
    await store.set("k", "x", fencing_token=MAX_FENCING_TOKEN - 1)
    assert not (await store.set("k", "x", fencing_token=MAX_FENCING_TOKEN - 2)).accepted
    assert (await store.set("k", "x", fencing_token=MAX_FENCING_TOKEN)).accepted
    assert await store.highest_token("k") == MAX_FENCING_TOKEN
    assert (await store.set("zero", "x", fencing_token=0)).highest_token == 0


async def test_raise_fence_shuts_out_the_previous_leader_without_writing(store, raw) -> None:
    await store.set("k", "old leader's", fencing_token=T)
    claimed = await store.raise_fence("k", fencing_token=T + 1)
    assert claimed == FencedWriteResult(accepted=True, highest_token=T + 1)
    assert await raw.get("k") == b"old leader's"
    assert not (await store.set("k", "late write", fencing_token=T)).accepted
    assert not (await store.raise_fence("k", fencing_token=T)).accepted
    assert await store.highest_token("k") == T + 1
    assert (await store.raise_fence("new", fencing_token=T)).accepted
    assert await raw.exists("new") == 0


async def test_set_or_raise(store, raw) -> None:
    ok = await store.set_or_raise("k", "a", fencing_token=T + 1)
    assert ok.accepted
    with pytest.raises(StaleFencingTokenError) as info:
        await store.set_or_raise("k", "b", fencing_token=T)
    err = info.value
    assert (err.key, err.token, err.highest_seen) == ("k", T, T + 1)
    assert isinstance(err, FencingError) and "stale" in str(err) and str(T + 1) in str(err)
    assert await raw.get("k") == b"a"


async def test_delete_is_fenced_and_keeps_the_fence(store, raw) -> None:
    await store.set("k", "a", fencing_token=T + 1)
    rejected = await store.delete("k", fencing_token=T)
    assert rejected == FencedWriteResult(accepted=False, highest_token=T + 1)
    assert await raw.get("k") == b"a"

    accepted = await store.delete("k", fencing_token=T + 2)
    assert accepted == FencedWriteResult(accepted=True, highest_token=T + 2)
    assert await raw.exists("k") == 0
    # A paused leader must not re-create what a newer leader deleted.
    assert not (await store.set("k", "stale", fencing_token=T + 1)).accepted
    assert await raw.exists("k") == 0
    assert (await store.delete("missing", fencing_token=T)).accepted


async def test_delete_or_raise(store) -> None:
    await store.set("k", "a", fencing_token=T + 1)
    with pytest.raises(StaleFencingTokenError):
        await store.delete_or_raise("k", fencing_token=T)
    assert (await store.delete_or_raise("k", fencing_token=T + 1)).accepted


async def test_ttl_applies_to_the_value_never_to_the_fence(store, raw) -> None:
    await raw.set("k:fence", str(T), px=60_000)  # even an expiry put there by someone else goes
    before_set_s = started_s()
    await store.set("k", "a", fencing_token=T, ttl_ms=5000)
    await assert_expiry_set(raw, "k", set_ms=5000, written_after_s=before_set_s)
    assert await raw.pttl("k:fence") == -1
    # Without ttl_ms, like a plain SET, the value's expiry is cleared.
    await store.set("k", "b", fencing_token=T)
    assert await raw.pttl("k") == -1


async def test_the_fence_outlives_an_expired_value(store, raw) -> None:
    await store.set("k", "a", fencing_token=T + 1, ttl_ms=30)
    await asyncio.sleep(0.1)
    assert await raw.exists("k") == 0
    assert not (await store.set("k", "stale", fencing_token=T)).accepted
    assert await raw.exists("k") == 0


async def test_concurrent_writers_end_with_the_highest_writers_value(make_client) -> None:
    tokens = [T + n for n in range(8)]
    random.Random(7).shuffle(tokens)
    top = max(tokens)
    stores = {token: FencedStore(make_client()) for token in tokens}
    lower_results: list[bool] = []
    accepted_after_top: list[int] = []
    top_written = asyncio.Event()
    others_under_way = asyncio.Event()

    async def writer(token: int) -> None:
        if token == top:
            # Start once the others are under way, so that the top writer's writes interleave with theirs.
            await others_under_way.wait()
        for n in range(30):
            # Sent after the top writer's write was acknowledged: it runs after it in Redis too.
            sent_after_top = top_written.is_set()
            result = await stores[token].set("{jobs}:state", f"{token}:{n}", fencing_token=token)
            if token == top:
                assert result.accepted
                top_written.set()
            else:
                lower_results.append(result.accepted)
                if len(lower_results) == 40:
                    others_under_way.set()
                if result.accepted and sent_after_top:
                    accepted_after_top.append(token)
            await asyncio.sleep(0)

    await asyncio.gather(*(writer(token) for token in tokens))
    client = make_client()
    assert await client.get("{jobs}:state") == f"{top}:29".encode()
    assert await client.get("{jobs}:state:fence") == str(top).encode()
    assert accepted_after_top == []
    # The lower writers raced each other: some of their writes were accepted, some rejected.
    assert any(lower_results) and not all(lower_results)


async def test_decode_responses_client_works(make_client) -> None:
    client = make_client(decode_responses=True)
    store = FencedStore(client)
    assert (await store.set("k", "é", fencing_token=T)).accepted
    assert (await store.set("k", b"\xff raw", fencing_token=T)).accepted
    assert not (await store.set("k", "stale", fencing_token=T - 1)).accepted
    assert await store.highest_token("k") == T
    assert await make_client().get("k") == b"\xff raw"
    await client.set("k:fence", "garbage")
    with pytest.raises(CorruptFenceKeyError):
        await store.highest_token("k")


@pytest.mark.parametrize("garbage", ["abc", "12x", "-5", "1e3", " 42", "", "1" * 16])
async def test_garbage_in_the_fence_key_is_a_clear_error(store, raw, garbage) -> None:
    await raw.set("k", "before")
    await raw.set("k:fence", garbage)
    with pytest.raises(
        CorruptFenceKeyError,
        match=r"fence key 'k:fence' of 'k' does not hold an integer below 10\^15: something other",
    ):
        await store.set("k", "after", fencing_token=T)
    with pytest.raises(CorruptFenceKeyError):
        await store.delete("k", fencing_token=T)
    with pytest.raises(CorruptFenceKeyError):
        await store.raise_fence("k", fencing_token=T)
    with pytest.raises(CorruptFenceKeyError):
        await store.highest_token("k")
    assert await raw.get("k") == b"before"
    assert await raw.get("k:fence") == garbage.encode()


async def test_fence_key_of_another_type_is_a_clear_error(store, raw) -> None:
    await raw.hset("k:fence", "a", "1")
    with pytest.raises(CorruptFenceKeyError, match="not a string") as info:
        await store.set("k", "v", fencing_token=T)
    assert info.value.fence_key == "k:fence" and info.value.key == "k"
    with pytest.raises(CorruptFenceKeyError, match="not a string"):
        await store.highest_token("k")
    assert await raw.exists("k") == 0


async def test_other_redis_errors_propagate_as_is(raw, module_redis) -> None:
    await raw.acl_setuser("reader", enabled=True, passwords=["+pw"], keys=["*"], commands=["+get"])
    client = redis.asyncio.Redis(port=module_redis.port, username="reader", password="pw")
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            await FencedStore(client).set("k", "v", fencing_token=T)
    finally:
        await client.aclose()
        await raw.acl_deluser("reader")


async def test_custom_suffix(raw) -> None:
    store = FencedStore(raw, fence_key_suffix="/highest-token")
    assert store.fence_key("{a}b") == "{a}b/highest-token"
    await store.set("{a}b", "v", fencing_token=T)
    assert await raw.get("{a}b/highest-token") == str(T).encode()


async def test_the_script_is_reloaded_after_script_flush(store, raw) -> None:
    await store.set("k", "a", fencing_token=T)
    await raw.script_flush()
    assert (await store.set("k", "b", fencing_token=T + 1)).accepted
    assert await raw.get("k") == b"b"


@pytest.mark.parametrize(
    ("token", "message"),
    [
        (-1, r"0 \.\. 10\^15 - 1"),
        (10**15, r"0 \.\. 10\^15 - 1"),
        (True, "must be an int, got bool"),
        (1.0, "must be an int, got float"),
        ("5", "must be an int, got str"),
    ],
)
async def test_invalid_tokens_are_refused_before_any_request(store, raw, token, message) -> None:
    with pytest.raises(ValueError, match=message):
        await store.set("k", "v", fencing_token=token)
    with pytest.raises(ValueError, match=message):
        await store.delete("k", fencing_token=token)
    with pytest.raises(ValueError, match=message):
        check_fencing_token(token)
    assert await raw.dbsize() == 0


@pytest.mark.parametrize("ttl_ms", [0, -5, 1.5, True])
async def test_invalid_ttl_is_refused(store, raw, ttl_ms) -> None:
    with pytest.raises(ValueError, match="ttl_ms must be a positive int"):
        await store.set("k", "v", fencing_token=T, ttl_ms=ttl_ms)
    assert await raw.dbsize() == 0


async def test_invalid_keys_values_and_suffixes(store, raw) -> None:
    with pytest.raises(ValueError, match="non-empty str"):
        await store.set("", "v", fencing_token=T)
    with pytest.raises(ValueError, match="value must be str or bytes"):
        await store.set("k", 5, fencing_token=T)
    with pytest.raises(ValueError, match="must not be empty"):
        FencedStore(raw, fence_key_suffix="")
    with pytest.raises(ValueError, match="braces"):
        FencedStore(raw, fence_key_suffix="}:fence")


def test_cluster_clients_refuse_keys_without_a_hash_tag() -> None:
    # No cluster is needed: the check runs before any request (the client connects lazily).
    store = FencedStore(redis.asyncio.RedisCluster(host="127.0.0.1", port=free_tcp_port()))
    assert store.fence_key("{jobs}:report") == "{jobs}:report:fence"
    with pytest.raises(ValueError, match="different Redis Cluster slots: give the key a hash tag"):
        store.fence_key("jobs:report")
    # Standalone clients accept any key.
    assert FencedStore(redis.asyncio.Redis()).fence_key("jobs:report") == "jobs:report:fence"
