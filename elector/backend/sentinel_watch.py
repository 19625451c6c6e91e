"""Follow a Sentinel failover at once: a master watcher that moves the client's pool.

Why it is needed. After `SENTINEL FAILOVER` Sentinel promotes a replica within ~0.2 s but
demotes the OLD master only ~10 s later; until then the old master accepts writes, and nothing
written there survives. redis-py's SentinelConnectionPool asks the sentinels only when it opens a
new connection, so a leader's pooled connections kept renewing the lease on the old master while
the copy on the new master (replicated before the switch) expired, and a replica connecting
afresh was granted the lock there: two leaders. Worse, redis-py's discovery reads `SENTINEL
MASTERS` from the first sentinel that answers, and the failover leader reports the OLD address
there until its failover ends (~1 s after the others switched, measured).

What the watcher does. Every `poll_interval_s` (and at once when a sentinel publishes
`+switch-master`, `+selected-slave` or `+promoted-slave`) it asks EVERY sentinel, concurrently and
within the request timeout, for the master: its address (`SENTINEL GET-MASTER-ADDR-BY-NAME`, which
names the promoted replica as soon as the promotion is seen), its config epoch (`SENTINEL MASTER`)
and the replica a failover in progress is promoting (flag `promoted` in `SENTINEL REPLICAS`).
The answer: the promoted replica of a failover in progress, else the address of the highest config
epoch (the newest configuration, as the sentinels themselves decide). When it differs from where
the pool's connections are connected, the pool is pointed at it and those connections are closed,
idle and in-use alike (a request in flight fails at once with a ConnectionError: a failed renewal,
never a false success on a master that is being abandoned). New connections ask the watcher's
answer instead of a single sentinel, so they cannot land on the old master either.

Why it is safe without --min-replicas-ack (R = renew interval = 0.3 ttl, P = poll interval =
min(1 s, R/2), q = request timeout <= R/2; the default ttl 10 s gives R = 3 s, P = 1 s, q = 1 s):

- The new master holds the lease key as of the leader's last renewal replicated before the
  promotion (SLAVEOF NO ONE at T_p), sent at T_rep > T_p - R, so the key lives until T_rep + ttl.
- The failover leader flags its chosen replica `promoted` before it sends SLAVEOF NO ONE; the
  watcher sees that by T_p + P + q (with pub/sub, `+selected-slave`: within milliseconds), and
  from then on every request goes to the new master (until the promotion lands it answers
  READONLY: a failed renewal, harmless). Renewals are R apart: the first one that reaches the new
  master is sent by T_rep + 2R (R + P + q <= 2R) and answered by T_rep + 2R + q <= T_rep + 0.75 ttl,
  before the key expires (defaults: 7 s after T_rep, the key lives 10 s). It finds the leader's own
  value there and renews it: same fencing token, no step-down.
- Should the key still have expired (a ttl so short that the sentinels' own delays matter; or a
  watcher that could not reach any sentinel), the renewal finds it gone and the leader steps down
  at once, while nobody can be granted on the new master before T_rep + 2 ttl: its run_id differs
  from the one recorded at the last grant, so the first attempt after the expiry starts a one-ttl
  quiet period (scripts.ACQUIRE). The leader reaches the new master well before that.
- Followers likewise leave the old master: nobody reads or is granted there.

Measured (tests/backend/test_sentinel_switch.py, Redis 7.0, all on one host): see
docs/_draft_sentinel_tls.md ("Planned failover").
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from typing import Any

import redis.asyncio
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel, SentinelConnectionPool

logger = logging.getLogger(__name__)

#: Channels whose messages make the watcher ask the sentinels at once (each names the master).
WAKE_CHANNELS = ("+switch-master", "+selected-slave", "+promoted-slave")
#: Longest poll interval: a switch must be noticed well within any ttl (>= 0.5 s).
MAX_POLL_INTERVAL_S = 1.0
#: Pub/sub links to the sentinels are checked by a PING after this much silence.
PUBSUB_KEEPALIVE_S = 5.0
#: Back-off between attempts to (re)subscribe to a sentinel, doubling up to the maximum.
RESUBSCRIBE_MIN_S = 0.5
RESUBSCRIBE_MAX_S = 10.0

Address = tuple[str, int]


def default_poll_interval_s(renew_interval_s: float) -> float:
    """min(1 s, renew interval / 2): a switch is seen within half an interval of renewals."""
    return min(MAX_POLL_INTERVAL_S, renew_interval_s / 2)


@dataclasses.dataclass(frozen=True, slots=True)
class SentinelAnswer:
    """What one sentinel says about the master."""

    address: Address
    config_epoch: int
    #: The replica a failover in progress is promoting (not yet the reported master), if any.
    promoting: Address | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class MasterSwitch:
    """A move of the pool from one master to another, as the watcher made it."""

    old: Address | None
    new: Address
    #: "poll" or "pubsub": what made the watcher ask the sentinels.
    cause: str
    #: time.monotonic() of the move.
    at: float
    #: Connections closed (idle and in use).
    closed: int


def _address(host: Any, port: Any) -> Address:
    text = host.decode() if isinstance(host, bytes) else str(host)
    return text, int(port)


def _connected_to(connection: Any) -> Address:
    return str(connection.host), int(connection.port)


def best_master(answers: list[SentinelAnswer]) -> Address | None:
    """The replica being promoted if a failover is in progress, else the newest configuration's."""
    if not answers:
        return None
    promoting = [a for a in answers if a.promoting is not None]
    if promoting:
        newest = max(promoting, key=lambda a: a.config_epoch)
        assert newest.promoting is not None
        return newest.promoting
    return max(answers, key=lambda a: a.config_epoch).address


class FollowingSentinel(Sentinel):
    """redis-py's Sentinel whose discovery asks every sentinel (or uses the watcher's answer).

    redis-py takes the first sentinel's `SENTINEL MASTERS` entry, which is the OLD master on the
    failover leader until its failover ends. With a watcher running, new connections use the
    watcher's latest answer (no round trip); without one, every sentinel is asked and the best
    answer (see `best_master`) wins.
    """

    #: The watcher's latest answer; None until it has one (or without a watcher).
    followed: Address | None = None

    async def ask(self, service_name: str, *, timeout_s: float) -> list[SentinelAnswer]:
        """Every sentinel's answer, asked concurrently; those that fail or are late are left out."""
        results = await asyncio.gather(
            *(self._ask_one(s, service_name, timeout_s=timeout_s) for s in self.sentinels),
            return_exceptions=True,
        )
        return [r for r in results if isinstance(r, SentinelAnswer)]

    @staticmethod
    async def _ask_one(
        sentinel: redis.asyncio.Redis, service_name: str, *, timeout_s: float
    ) -> SentinelAnswer:
        async with asyncio.timeout(timeout_s):
            async with sentinel.pipeline(transaction=False) as pipe:
                pipe.sentinel_get_master_addr_by_name(service_name)
                pipe.sentinel_master(service_name)
                pipe.sentinel_slaves(service_name)
                addr, master, replicas = await pipe.execute()
        promoting = None
        if "failover_in_progress" in str(master.get("flags", "")):
            for replica in replicas:
                flags = str(replica.get("flags", "")).split(",")
                if "promoted" in flags and "s_down" not in flags and "o_down" not in flags:
                    promoting = _address(replica["ip"], replica["port"])
        return SentinelAnswer(
            address=_address(*addr), config_epoch=int(master.get("config-epoch", 0)), promoting=promoting
        )

    async def discover_master(self, service_name: str) -> Address:
        if self.followed is not None:
            return self.followed
        timeout_s = self.sentinels[0].connection_pool.connection_kwargs.get("socket_timeout") or 1.0
        address = best_master(await self.ask(service_name, timeout_s=timeout_s))
        if address is None:
            raise MasterNotFoundError(f"No master found for {service_name!r}: no sentinel answered")
        return address


class SentinelMasterWatcher:
    """Keeps a sentinel client's pool on the current master (see the module's docstring).

    `start()` in the running loop, `aclose()` at the end; never raises from its loop (errors are
    logged at most once per minute of trouble and the next poll tries again).
    """

    def __init__(
        self,
        pool: SentinelConnectionPool,
        *,
        poll_interval_s: float,
        request_timeout_s: float,
        subscribe: bool = True,
    ) -> None:
        if not poll_interval_s > 0:
            raise ValueError(f"poll_interval_s must be positive, got {poll_interval_s!r}")
        if not request_timeout_s > 0:
            raise ValueError(f"request_timeout_s must be positive, got {request_timeout_s!r}")
        manager = pool.sentinel_manager
        if not isinstance(manager, FollowingSentinel):
            raise TypeError("the pool was not built by make_sentinel_client (FollowingSentinel)")
        self._pool = pool
        self._manager: FollowingSentinel = manager
        self.poll_interval_s = poll_interval_s
        self.request_timeout_s = request_timeout_s
        self._subscribe = subscribe
        self._wake = asyncio.Event()
        self._wake_cause = "poll"
        self._tasks: list[asyncio.Task[None]] = []
        #: Every move made, oldest first (tests and logs read it).
        self.switches: list[MasterSwitch] = []
        #: Successful polls, and wake-ups by a sentinel's message.
        self.polls = 0
        self.pubsub_wakeups = 0
        self._trouble_logged_at: float | None = None

    @property
    def followed(self) -> Address | None:
        return self._manager.followed

    def start(self) -> None:
        if self._tasks:
            return
        service = self._pool.service_name
        self._tasks.append(asyncio.create_task(self._poll_loop(), name=f"elector:sentinel-watch:{service}"))
        if self._subscribe:
            for index, sentinel in enumerate(self._manager.sentinels):
                self._tasks.append(
                    asyncio.create_task(self._listen(sentinel), name=f"elector:sentinel-sub:{index}")
                )

    async def aclose(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # Without a watcher, new connections ask the sentinels again (a stale answer must not stay).
        self._manager.followed = None

    # -- polling ---------------------------------------------------------------------------------

    async def _poll_loop(self) -> None:
        while True:
            cause, self._wake_cause = self._wake_cause, "poll"
            self._wake.clear()
            try:
                await self.check(cause=cause)
            except Exception as exc:  # never die: the next poll tries again
                self._trouble(f"asking the sentinels failed: {exc!r}")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll_interval_s):
                    await self._wake.wait()

    async def check(self, *, cause: str = "poll") -> MasterSwitch | None:
        """Ask the sentinels once; move the pool if the master changed. The move, if one was made."""
        answers = await self._manager.ask(self._pool.service_name, timeout_s=self.request_timeout_s)
        address = best_master(answers)
        if address is None:
            self._trouble("no sentinel answered")
            return None
        self.polls += 1
        self._trouble_logged_at = None
        return await self._follow(address, cause=cause)

    async def _follow(self, address: Address, *, cause: str) -> MasterSwitch | None:
        pool = self._pool
        old = self._manager.followed or pool.master_address
        self._manager.followed = address
        connections = [*pool._available_connections, *pool._in_use_connections]
        stale = [c for c in connections if c.is_connected and _connected_to(c) != address]
        if old == address and not stale:
            return None
        pool.master_address = address
        # Closed at once, in use or not: a request in flight fails with a ConnectionError (a failed
        # renewal) rather than succeed on a master whose writes will be discarded.
        results = await asyncio.gather(*(c.disconnect(nowait=True) for c in stale), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, Exception):
                raise result
        switch = MasterSwitch(old=old, new=address, cause=cause, at=time.monotonic(), closed=len(stale))
        self.switches.append(switch)
        if old is not None:
            logger.warning(
                "sentinel master switched from %s:%s to %s:%s (noticed by %s); %d connections closed",
                *old,
                *address,
                cause,
                len(stale),
            )
        return switch

    def _trouble(self, message: str) -> None:
        now = time.monotonic()
        if self._trouble_logged_at is None or now - self._trouble_logged_at > 60:
            self._trouble_logged_at = now
            logger.warning("sentinel master watcher: %s", message)

    # -- pub/sub ---------------------------------------------------------------------------------

    async def _listen(self, sentinel: redis.asyncio.Redis) -> None:
        """Wake the poll on a failover message from this sentinel; reconnect with a back-off."""
        backoff_s = RESUBSCRIBE_MIN_S
        while True:
            pubsub = sentinel.pubsub()
            try:
                async with asyncio.timeout(self.request_timeout_s * 2):
                    await pubsub.subscribe(*WAKE_CHANNELS)
                backoff_s = RESUBSCRIBE_MIN_S
                await self._read(pubsub)
            except Exception as exc:
                logger.debug("sentinel subscription lost: %r", exc)
            finally:
                with contextlib.suppress(Exception, TimeoutError):
                    async with asyncio.timeout(self.request_timeout_s):
                        await pubsub.aclose()  # type: ignore[no-untyped-call]
            await asyncio.sleep(backoff_s)
            backoff_s = min(RESUBSCRIBE_MAX_S, backoff_s * 2)

    async def _read(self, pubsub: redis.asyncio.client.PubSub) -> None:
        service = self._pool.service_name
        last_heard = time.monotonic()
        pinged = False
        while True:
            message = await pubsub.get_message(timeout=PUBSUB_KEEPALIVE_S)
            now = time.monotonic()
            if message is None:
                if now - last_heard > 2 * PUBSUB_KEEPALIVE_S:
                    raise TimeoutError("no answer to a PING on the sentinel subscription")
                if not pinged:
                    pinged = True
                    async with asyncio.timeout(self.request_timeout_s):
                        await pubsub.ping()
                continue
            last_heard, pinged = now, False
            if message.get("type") != "message":
                continue
            data = message.get("data")
            words = (data.decode(errors="replace") if isinstance(data, bytes) else str(data)).split()
            if service in words:
                self.pubsub_wakeups += 1
                self._wake_cause = "pubsub"
                self._wake.set()


def watch_master(
    client: redis.asyncio.Redis, *, poll_interval_s: float, request_timeout_s: float
) -> SentinelMasterWatcher | None:
    """A watcher for `client` if it is a sentinel client (make_client), else None. Not started."""
    pool = client.connection_pool
    if isinstance(pool, SentinelConnectionPool) and isinstance(pool.sentinel_manager, FollowingSentinel):
        return SentinelMasterWatcher(
            pool, poll_interval_s=poll_interval_s, request_timeout_s=request_timeout_s
        )
    return None
