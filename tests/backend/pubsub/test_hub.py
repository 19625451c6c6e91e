"""The shared pub/sub connection (EventHub) against real redis-server processes."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections.abc import AsyncIterator, Callable

import pytest
import redis.asyncio

from elector.backend import RedisLeaseBackend, RedisSettings, make_client
from elector.backend.pubsub.hub import COOLDOWN_JITTER, EventHub, backoff_s
from elector.backend.pubsub.subscriptions import HubSubscription
from elector.election import CycleOutcome, Election, ElectionHooks, ElectionTiming, OutcomeKind
from elector.lease import BackendErrorKind, Granted, LeaseBackendError, LeaseEventKind
from tests.support.lateness import loop_lateness
from tests.support.seed import seed_used_lock_async
from tests.support.tcp_proxy import TcpProxy

HUB_CLIENT = "elector-hub-test"


def announcement(identity: str, token: int, event: str = "acquired") -> str:
    return json.dumps({"event": event, "identity": identity, "fencing_token": token})


@pytest.fixture
async def hub_for(redis_url: str) -> AsyncIterator[Callable[..., EventHub]]:
    """EventHubs on clients of their own (named HUB_CLIENT), closed after the test."""
    made: list[tuple[EventHub, redis.asyncio.Redis]] = []

    def make(
        *,
        url: str = redis_url,
        keepalive_s: float = 60.0,
        timeout_s: float = 0.5,
        queue_size: int = 16,
        orphan_grace_s: float = 60.0,
    ) -> EventHub:
        client = make_client(RedisSettings(url=url, request_timeout_s=timeout_s), client_name=HUB_CLIENT)
        hub = EventHub(
            client,
            keepalive_s=keepalive_s,
            request_timeout_s=timeout_s,
            queue_size=queue_size,
            orphan_grace_s=orphan_grace_s,
        )
        made.append((hub, client))
        return hub

    yield make
    for hub, client in made:
        await hub.aclose()
        await client.aclose()


async def pubsub_clients(raw: redis.asyncio.Redis) -> list[dict[str, str]]:
    return [c for c in await raw.client_list() if "P" in c["flags"]]


async def subscribe_count(raw: redis.asyncio.Redis) -> int:
    stats = await raw.info("commandstats")
    return int(stats.get("cmdstat_subscribe", {}).get("calls", 0))


async def test_200_channels_share_one_pubsub_connection(hub_for, raw) -> None:
    hub = hub_for()
    subscriptions = await asyncio.gather(*(hub.subscribe(f"lock-{i}") for i in range(200)))
    clients = await pubsub_clients(raw)
    assert len(clients) == 1, clients
    assert clients[0]["name"] == HUB_CLIENT and clients[0]["sub"] == "200"
    assert hub.connections_opened == 1
    # Subscribed concurrently, they went out together: one SUBSCRIBE command for 200 channels.
    assert await subscribe_count(raw) == 1
    numsub = dict(await raw.pubsub_numsub("lock-0", "lock-199"))
    assert numsub == {b"lock-0": 1, b"lock-199": 1}
    for subscription in subscriptions:
        await subscription.close()


async def test_events_reach_only_their_own_lock(hub_for, raw, redis_url: str) -> None:
    hub = hub_for()
    client = make_client(RedisSettings(url=redis_url, request_timeout_s=0.5))
    backends = {lock: RedisLeaseBackend(client, lock=lock, hub=hub) for lock in ("a", "b", "c")}
    for lock in backends:
        await seed_used_lock_async(raw, lock)
    subscriptions = {lock: await b.subscribe(keepalive_s=60) for lock, b in backends.items()}
    assert all(isinstance(s, HubSubscription) for s in subscriptions.values())
    granted = await backends["b"].acquire("pod-b", ttl_ms=5000)
    assert isinstance(granted, Granted)
    event = await subscriptions["b"].next_event(1.0)
    assert event is not None and event.kind is LeaseEventKind.ACQUIRED
    assert event.holder == granted.lease.holder
    assert await subscriptions["a"].next_event(0.2) is None
    assert await subscriptions["c"].next_event(0.0) is None
    assert await backends["b"].release(granted.lease)
    released = await subscriptions["b"].next_event(1.0)
    assert released is not None and released.kind is LeaseEventKind.RELEASED
    assert len(await pubsub_clients(raw)) == 1
    for subscription in subscriptions.values():
        await subscription.close()
    await client.aclose()


async def test_closing_one_subscription_unsubscribes_its_channel_only(hub_for, raw) -> None:
    hub = hub_for()
    one, two = await hub.subscribe("one"), await hub.subscribe("two")
    twin = await hub.subscribe("two")  # two elections of one lock in one daemon: one channel
    await one.close()
    await twin.close()
    deadline = time.monotonic() + 2
    while await raw.pubsub_channels() != [b"two"]:
        assert time.monotonic() < deadline, await raw.pubsub_channels()
        await asyncio.sleep(0.01)
    assert await raw.publish("two", announcement("x", 5)) == 1
    event = await two.next_event(1.0)
    assert event is not None and event.holder.fencing_token == 5
    with pytest.raises(LeaseBackendError):
        await one.next_event(0.1)
    again = await hub.subscribe("one")  # a closed channel can be subscribed again
    await raw.publish("one", announcement("y", 6))
    event = await again.next_event(1.0)
    assert event is not None and event.holder.identity == "y"
    assert hub.connections_opened == 1


async def test_a_full_queue_drops_the_oldest_events(hub_for, raw) -> None:
    hub = hub_for(queue_size=4)
    subscription = await hub.subscribe("busy")
    for token in range(1, 11):
        await raw.publish("busy", announcement("x", token))
    await raw.publish("busy", "not an announcement")  # ignored, still a sign of life
    await asyncio.sleep(0.2)
    tokens = []
    while (event := await subscription.next_event(0.0)) is not None:
        tokens.append(event.holder.fencing_token)
    assert tokens == [7, 8, 9, 10]
    assert subscription.dropped == 6


async def test_a_cut_connection_fails_every_subscription_then_one_reconnect_serves_all(
    hub_for, raw, tcp_proxy: TcpProxy
) -> None:
    # 2 s requests, not the fixture's 0.5 s: the reconnect's one SUBSCRIBE of 50 channels must
    # not time out on a loaded machine (the sibling test below once did). The claim is one
    # connection and one SUBSCRIBE for all, not their speed.
    hub = hub_for(url=tcp_proxy.url, timeout_s=2.0)
    channels = [f"lock-{i}" for i in range(50)]
    subscriptions = await asyncio.gather(*(hub.subscribe(c) for c in channels))
    assert tcp_proxy.connections_accepted == 1
    subscribes_before = await subscribe_count(raw)

    tcp_proxy.cut()
    started = time.monotonic()
    async with loop_lateness() as lateness:
        for subscription in subscriptions:
            with pytest.raises(LeaseBackendError) as info:
                await subscription.next_event(5.0)
            assert info.value.kind is BackendErrorKind.CONNECTION
            await subscription.close()
    # At once (not a timeout): 1 s for 50 on an idle machine, plus what the loop was measured
    # to run late by (a loaded machine), for the reader's wake-up and the closes after it.
    assert time.monotonic() - started < 1.0 + 2 * lateness.worst_s, lateness
    # The proxy closes its side to Redis as it cuts; Redis drops the client when it reads that
    # close, a moment later on a loaded machine (a fresh-clone run saw it still listed).
    left: list[object] = []
    for _ in range(500):  # up to ~5 s: a bound on a hang only
        if not (left := await pubsub_clients(raw)):
            break
        await asyncio.sleep(0.01)
    assert left == []

    tcp_proxy.restore()

    async def resubscribe(channel: str) -> HubSubscription:
        # Like the elections: each comes back on its own, after a jittered back-off.
        await asyncio.sleep(random.uniform(0, 0.1))
        return await hub.subscribe(channel)

    again = await asyncio.gather(*(resubscribe(c) for c in channels))
    assert tcp_proxy.connections_accepted == 2  # one new connection for all 50
    assert hub.connections_opened == 2
    # The first one back re-subscribed every broken channel at once: one SUBSCRIBE in all.
    assert await subscribe_count(raw) == subscribes_before + 1
    await raw.publish("lock-17", announcement("back", 9))
    event = await again[17].next_event(1.0)
    assert event is not None and event.holder.identity == "back"
    assert await again[18].next_event(0.0) is None
    clients = await pubsub_clients(raw)
    assert len(clients) == 1 and clients[0]["sub"] == "50"


async def test_channels_nobody_claims_back_after_a_reconnect_are_unsubscribed(
    hub_for, raw, tcp_proxy: TcpProxy
) -> None:
    # 2 s requests, not 0.5 s: the reconnect and its SUBSCRIBE of three channels through the
    # proxy once took longer under the suite's own 4 workers (`.ci/run`). What is under test is
    # which channels stay subscribed, not how fast.
    hub = hub_for(url=tcp_proxy.url, orphan_grace_s=0.8, timeout_s=2.0)
    subscriptions = [await hub.subscribe(c) for c in ("kept", "gone")]
    tcp_proxy.cut()
    for subscription in subscriptions:
        with pytest.raises(LeaseBackendError):
            await subscription.next_event(2.0)
        await subscription.close()
    tcp_proxy.restore()
    kept = await hub.subscribe("kept")  # reconnects, re-subscribing both broken channels
    assert dict(await raw.pubsub_numsub("kept", "gone")) == {b"kept": 1, b"gone": 1}
    deadline = time.monotonic() + 3
    while dict(await raw.pubsub_numsub("gone"))[b"gone"]:
        assert time.monotonic() < deadline, "an unclaimed channel stayed subscribed"
        await asyncio.sleep(0.05)
    assert await raw.pubsub_channels() == [b"kept"]
    await raw.publish("kept", announcement("x", 2))
    assert await kept.next_event(1.0) is not None


async def test_subscribers_during_an_outage_share_one_connection_attempt(
    hub_for, tcp_proxy: TcpProxy
) -> None:
    # 2 s requests: the connection after the cool-down must not time out on a loaded machine;
    # the attempts during the cut fail at once either way (the proxy closes what it accepts).
    hub = hub_for(url=tcp_proxy.url, timeout_s=2.0)
    tcp_proxy.cut()
    results = await asyncio.gather(*(hub.subscribe(f"c{i}") for i in range(30)), return_exceptions=True)
    assert all(isinstance(r, LeaseBackendError) for r in results), results
    assert tcp_proxy.connections_accepted == 1  # not 30
    with pytest.raises(LeaseBackendError):  # within the cool-down: no new attempt either
        await hub.subscribe("c0")
    assert tcp_proxy.connections_accepted == 1
    tcp_proxy.restore()
    await asyncio.sleep(0.55)
    subscription = await hub.subscribe("c0")
    assert await subscription.next_event(0.0) is None


async def test_keepalive_detects_a_blackholed_link(hub_for, tcp_proxy: TcpProxy) -> None:
    hub = hub_for(url=tcp_proxy.url, keepalive_s=0.2, timeout_s=0.3)
    subscriptions = [await hub.subscribe("quiet-1"), await hub.subscribe("quiet-2")]
    assert await subscriptions[0].next_event(0.7) is None  # PINGs answered: a quiet, healthy link
    tcp_proxy.blackhole()
    started = time.monotonic()
    async with loop_lateness() as lateness:
        for subscription in subscriptions:
            with pytest.raises(LeaseBackendError) as info:
                await subscription.next_event(5.0)
            assert info.value.kind is BackendErrorKind.TIMEOUT
    # Keepalive + timeout, 0.2 s for the rest; the keepalive and the timeout timers each fire as
    # late as the loop was measured to run (a loaded machine), not later than the 5 s wait.
    assert time.monotonic() - started < 0.2 + 0.3 + 0.2 + 2 * lateness.worst_s, lateness
    tcp_proxy.restore()
    await asyncio.sleep(0.55)  # past the reconnect cool-down
    again = await hub.subscribe("quiet-1")
    assert await again.next_event(0.0) is None
    assert hub.connections_opened == 2


async def test_an_unanswered_subscribe_breaks_the_link_within_the_request_timeout(
    hub_for, tcp_proxy: TcpProxy
) -> None:
    hub = hub_for(url=tcp_proxy.url, timeout_s=0.3)
    first = await hub.subscribe("first")
    tcp_proxy.blackhole()
    started = time.monotonic()
    async with loop_lateness() as lateness:
        with pytest.raises(LeaseBackendError) as info:
            await hub.subscribe("second")
    assert info.value.kind is BackendErrorKind.TIMEOUT
    # The timeout, 0.2 s for the rest, and its timer as late as the loop was measured to run.
    assert time.monotonic() - started < 0.3 + 0.2 + lateness.worst_s, lateness
    with pytest.raises(LeaseBackendError):
        await first.next_event(1.0)


async def test_a_cancelled_subscriber_does_not_disturb_the_others(hub_for, raw) -> None:
    hub = hub_for()
    await hub.subscribe("warm")  # connected: the next subscribes only send SUBSCRIBE
    tasks = [asyncio.create_task(hub.subscribe(f"s{i}")) for i in range(10)]
    await asyncio.sleep(0)
    tasks[3].cancel()
    done = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(done[3], asyncio.CancelledError)
    await raw.publish("s4", announcement("x", 1))
    subscription = done[4]
    assert isinstance(subscription, HubSubscription)
    assert (await subscription.next_event(1.0)) is not None
    assert hub.connections_opened == 1
    deadline = time.monotonic() + 2
    while b"s3" in await raw.pubsub_channels():  # nobody wants s3 any more
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)


async def test_a_user_without_channel_rights_gets_an_auth_error_and_the_link_lives_on(
    hub_for, raw, redis_url: str
) -> None:
    await raw.execute_command("ACL", "SETUSER", "limited", "on", ">pw", "~*", "+@all", "resetchannels")
    await raw.execute_command("ACL", "SETUSER", "limited", "&allowed")
    hub = hub_for(url=redis_url.replace("redis://", "redis://limited:pw@"))
    allowed = await hub.subscribe("allowed")
    with pytest.raises(LeaseBackendError) as info:
        await hub.subscribe("elector:{jobs}:events")
    assert info.value.kind is BackendErrorKind.AUTH
    await raw.publish("allowed", announcement("x", 3))
    event = await allowed.next_event(1.0)
    assert event is not None and event.holder.fencing_token == 3
    assert hub.connections_opened == 1


async def test_a_closed_hub_fails_its_subscriptions_and_refuses_new_ones(hub_for) -> None:
    hub = hub_for()
    subscription = await hub.subscribe("x")
    await hub.aclose()
    with pytest.raises(LeaseBackendError) as info:
        await subscription.next_event(1.0)
    assert info.value.kind is BackendErrorKind.CONNECTION
    with pytest.raises(LeaseBackendError):
        await hub.subscribe("y")


async def test_elections_on_hubs_resubscribe_after_a_cut_and_hear_the_release(
    hub_for, raw, tcp_proxy: TcpProxy, redis_url: str
) -> None:
    await seed_used_lock_async(raw, "jobs")
    timing = ElectionTiming.from_ttl(3.0)
    hubs = {"a": hub_for(), "b": hub_for(url=tcp_proxy.url)}
    acquired_at: dict[str, float] = {}
    acquired = {name: asyncio.Event() for name in hubs}
    elections: dict[str, Election] = {}
    for name, hub in hubs.items():

        def note(outcome: CycleOutcome, name: str = name) -> None:
            if outcome.kind is OutcomeKind.ACQUIRED:
                acquired_at.setdefault(name, time.monotonic())
                acquired[name].set()

        backend = RedisLeaseBackend(hub.client, lock="jobs", hub=hub)
        elections[name] = Election(
            backend, identity=name, timing=timing, hooks=ElectionHooks(on_outcome=note)
        )
    leader = asyncio.create_task(elections["a"].run())
    async with asyncio.timeout(3):
        await acquired["a"].wait()
    follower = asyncio.create_task(elections["b"].run())
    await asyncio.sleep(0.2)
    tcp_proxy.cut()  # the follower's hub loses its connection, and the follower re-subscribes
    await asyncio.sleep(0.1)
    tcp_proxy.restore()
    # A bound on a hang (the claim this test times is the release heard, below): 3 s was missed by
    # 5 ms at load 11, where one local Redis round trip took up to 0.5 s.
    deadline = time.monotonic() + 10
    while hubs["b"].connections_opened < 2 or "elector:{jobs}:events" not in hubs["b"].channels:
        assert time.monotonic() < deadline, "the follower did not re-subscribe"
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)
    async with loop_lateness() as lateness:
        elections["a"].stop()
        stopped = time.monotonic()
        await leader
        async with asyncio.timeout(10):  # a bound on a hang; the time is checked below
            await acquired["b"].wait()
    # Heard the release on the new connection: far sooner than the 3 s lease would have lapsed
    # (0.5 s, plus the release, the announcement and the acquisition each as late as the loop
    # was measured to run on a loaded machine).
    assert acquired_at["b"] - stopped < 0.5 + 3 * lateness.worst_s, lateness
    elections["b"].stop()
    await follower


async def test_closing_the_hub_while_subscriptions_close_finishes_promptly(hub_for) -> None:
    # Shutdown: every election closes its subscription (UNSUBSCRIBEs being written) as the hub
    # closes. A cancellation lost inside the write must not leave the hub waiting forever.
    for round_ in range(20):
        hub = hub_for()
        subscriptions = await asyncio.gather(*(hub.subscribe(f"r{round_}-{i}") for i in range(20)))
        for subscription in subscriptions:
            await subscription.close()
        await asyncio.sleep(0.001 * (round_ % 3))
        async with asyncio.timeout(2):
            await hub.aclose()


async def test_closing_the_hub_during_a_connect_fails_the_waiting_subscribers(
    hub_for, tcp_proxy: TcpProxy
) -> None:
    hub = hub_for(url=tcp_proxy.url, timeout_s=2.0)
    tcp_proxy.blackhole()  # the connect hangs in its handshake
    waiting = [asyncio.create_task(hub.subscribe(f"w{i}")) for i in range(3)]
    await asyncio.sleep(0.1)
    await hub.aclose()
    for task in waiting:
        with pytest.raises(LeaseBackendError) as info:  # not a CancelledError: the caller lives on
            await task
        assert info.value.kind is BackendErrorKind.CONNECTION


async def test_a_link_broken_right_after_each_subscribe_backs_off_exponentially(tcp_proxy: TcpProxy) -> None:
    """An idle-timeout proxy drops the link right after every SUBSCRIBE (issue item 13).

    The subscriber re-subscribes as fast as it can (the worst election); the hub, not the caller,
    must space the connections out: the gaps between connections grow, and over 6 s at most a
    handful are opened (before the back-off: one every few ms, hundreds).
    """
    client = make_client(RedisSettings(url=tcp_proxy.url, request_timeout_s=0.5), client_name=HUB_CLIENT)
    hub = EventHub(client, keepalive_s=60.0, request_timeout_s=0.5, stable_link_s=2.0, max_backoff_s=30.0)
    loop = asyncio.get_running_loop()
    connected_at: list[float] = []
    refused = 0
    try:
        deadline = loop.time() + 6.0
        while loop.time() < deadline:
            try:
                subscription = await hub.subscribe("elector:{jobs}:events")
            except LeaseBackendError:
                refused += 1
                await asyncio.sleep(0.01)
                continue
            connected_at.append(loop.time())
            tcp_proxy.cut()  # the proxy drops the link as soon as it is subscribed
            tcp_proxy.restore()
            with pytest.raises(LeaseBackendError):
                await subscription.next_event(timeout_s=5.0)
            await subscription.close()
    finally:
        await hub.aclose()
        await client.aclose()
    gaps = [b - a for a, b in itertools.pairwise(connected_at)]
    # Cooldowns 0, 0.25-0.5, 0.5-1, 1-2, 2-4 s: at most 6 links fit in 6 s, whatever the load.
    assert 2 <= len(connected_at) <= 6, (connected_at, refused)
    assert hub.failures_in_a_row >= 4
    assert gaps[-1] >= 0.5  # the later cooldowns are the longer ones
    assert refused > 0  # callers were refused at once during the cooldowns, without a connection


async def test_the_back_off_starts_over_after_a_link_stayed_up(tcp_proxy: TcpProxy) -> None:
    client = make_client(RedisSettings(url=tcp_proxy.url, request_timeout_s=0.5), client_name=HUB_CLIENT)
    hub = EventHub(client, keepalive_s=60.0, request_timeout_s=0.5, stable_link_s=0.5, max_backoff_s=30.0)
    try:
        for _ in range(3):  # three short-lived links: failures pile up
            while True:
                try:
                    subscription = await hub.subscribe("elector:{jobs}:events")
                    break
                except LeaseBackendError:
                    await asyncio.sleep(0.05)
            tcp_proxy.cut()
            tcp_proxy.restore()
            with pytest.raises(LeaseBackendError):
                await subscription.next_event(timeout_s=5.0)
            await subscription.close()
        assert hub.failures_in_a_row == 3
        while True:
            try:
                subscription = await hub.subscribe("elector:{jobs}:events")
                break
            except LeaseBackendError:
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.8)  # this link stays up longer than stable_link_s
        tcp_proxy.cut()
        tcp_proxy.restore()
        with pytest.raises(LeaseBackendError):
            await subscription.next_event(timeout_s=5.0)
        await subscription.close()
        assert hub.failures_in_a_row == 1
        # ... and a first failure after a good link costs no cooldown: re-subscribed at once.
        again = await hub.subscribe("elector:{jobs}:events")
        await again.close()
    finally:
        await hub.aclose()
        await client.aclose()


def test_the_cooldown_doubles_from_the_second_failure_up_to_the_cap() -> None:
    # No cooldown after a first failure (a broken link is re-made at once), then 0.5 s doubling.
    assert [backoff_s(n, max_backoff_s=30.0) for n in range(1, 9)] == [0.0, 0.5, 1, 2, 4, 8, 16, 30]
    assert backoff_s(10**6, max_backoff_s=30.0) == 30.0  # a link failing for days stays at the cap
    # With jitter the cooldown is drawn from its upper half: never longer, never below half.
    drawn = [backoff_s(4, max_backoff_s=30.0, jitter=COOLDOWN_JITTER) for _ in range(200)]
    assert all(1.0 <= cooldown_s <= 2.0 for cooldown_s in drawn)
    assert backoff_s(1, max_backoff_s=30.0, jitter=COOLDOWN_JITTER) == 0.0
