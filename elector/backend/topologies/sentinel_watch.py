"""Follow a Sentinel failover: a master watcher that moves the client's pool, on a quorum only.

Why it is needed. After `SENTINEL FAILOVER` Sentinel promotes a replica at once but
demotes the OLD master only seconds later; until then the old master accepts writes, and nothing
written there survives. redis-py's SentinelConnectionPool asks the sentinels only when it opens a
new connection, so a leader's pooled connections would keep renewing the lease on the old master
while the copy on the new master (replicated before the switch) expires, and a replica connecting
afresh would be granted the lock there: two leaders. Worse, redis-py's discovery reads `SENTINEL
MASTERS` from the first sentinel that answers, and the failover leader reports the OLD address
there until its failover ends, after the others have switched.

What the watcher does. Every `poll_interval_s` (and at once when a sentinel publishes
`+switch-master`, `+selected-slave` or `+promoted-slave`) it asks EVERY sentinel, concurrently and
within the request timeout, for the master's address (`SENTINEL GET-MASTER-ADDR-BY-NAME`) and
config epoch (`SENTINEL MASTER`, read before and after the address: an answer whose epoch moved in
between is left out). It follows an address only when a MAJORITY of the sentinels the URL lists
name it with the highest config epoch among the answers (`agreed_master`); otherwise it stays
where it is. When the agreed address differs from where the pool's connections are connected, the
pool is pointed at it and those connections are closed, idle and in-use alike (a request in
flight fails at once with a ConnectionError: a failed renewal, never a false success on a master
that is being abandoned). New connections use the watcher's answer; without one they ask the
sentinels themselves under the same rule and fail (MasterNotFoundError) when there is no majority.

Why a majority, and no shortcut. Neither the replica that ONE sentinel flags `promoted` during
its failover (before the promotion is confirmed) nor the single answer with the highest epoch is
safe to follow. Right after a SIGKILLed master is restarted empty, Sentinel 7.0 sometimes starts a
SECOND failover, of the freshly promoted and healthy master, whose leader may select the
restarted, empty node. A daemon that followed the `promoted` flag would move there at once;
another would stay on the master the majority still names; each would be granted on its own
server. One sentinel's answer - a failover leader whose failover may still abort, a sentinel
cut off from the others, a stale one - is not the deployment's configuration; what a majority
names at the newest epoch is (Sentinel needs a majority to authorise a failover, and the others
adopt the winner's configuration shortly after the promotion, by hello messages). With 3
sentinels 2 must answer and agree; with fewer the watcher keeps its current address and new
connections fail. tests/backend/topologies/test_sentinel_restart.py holds a failover leader's `promoted`
flag up for seconds (deterministic) and replays the sequence above.

Why it is safe without --min-replicas-ack (defaults: D = renew deadline = 2/3 ttl, R = renew
interval = D/2, P = poll interval = min(1 s, R/2), q = request timeout <= R/2, so P + q <= R;
T_p = the promotion (SLAVEOF NO ONE), T_m = when a majority of sentinels name the new master,
shortly after T_p):

- Nobody is on the new master before T_m: every watcher and every new connection needs the
  majority. Every watcher moves within P + q of T_m (at once with pub/sub: each sentinel that
  switches publishes `+switch-master`), so watchers differ by at most P + q <= R.
- The new master holds the lease key as of the leader's last renewal replicated before T_p, sent
  after T_p - R, so the key lives until after T_p - R + ttl. The leader reaches the new master by
  T_m + P + q and renews its own value there (same fencing token, no step-down) if the key is
  still there, which it is when T_m - T_p + 2R < ttl (defaults: 2R = 2/3 ttl, so T_m - T_p must
stay under a third of the ttl, as the agreement of the sentinels does).
- Otherwise (a key that expired or never was there: an empty or lagging promoted replica), the
  new master's run_id differs from the one recorded at the last grant, or its fencing counter is
  missing, so the first acquire there starts a one-ttl quiet period (scripts.ACQUIRE): no grant
  before T_m + ttl. The leader's renewal there finds the key gone and it steps down at once; its
  last successful renewal (on the old master) was sent before it moved, by T_m + P + q, so it
  believed it led until at most T_m + R + D = T_m + ttl (defaults). No overlap.
- Followers likewise leave the old master within P + q; the leader's key there lives at least
  ttl - R after the leader left it, longer than any follower's lag, so nobody is granted there.
- Not covered: a watcher that cannot reach a majority of the sentinels keeps its address (an old
  master that stays writable, as in a network partition, is then bounded only by
  --min-replicas-ack or Redis's own min-replicas-to-write).

Measured (tests/backend/topologies/test_sentinel_switch.py and test_sentinel_restart.py, Redis
7.0, all on one host): see docs/topologies.md ("Sentinel").
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import time
from typing import Any

import redis.asyncio
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel, SentinelConnectionPool

from elector.backoff import Backoff
from elector.tasks import await_chain, cancel_until_done

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
#: How long `aclose()` waits for its cancelled tasks before it names the ones left and goes on.
CLOSE_WAIT_S = 5.0

Address = tuple[str, int]


def default_poll_interval_s(renew_interval_s: float) -> float:
    """min(1 s, renew interval / 2): a switch is seen within half an interval of renewals."""
    return min(MAX_POLL_INTERVAL_S, renew_interval_s / 2)


@dataclasses.dataclass(frozen=True, slots=True)
class SentinelAnswer:
    """What one sentinel says about the master: its address and the configuration's epoch."""

    address: Address
    config_epoch: int


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


def quorum_of(sentinels: int) -> int:
    """How many sentinels make a majority of `sentinels` (2 of 3, 3 of 5)."""
    return sentinels // 2 + 1


def agreed_master(answers: list[SentinelAnswer], *, sentinels: int) -> Address | None:
    """The address a majority of all `sentinels` name with the newest epoch answered; else None.

    Counted against every sentinel the URL lists, not only those that answered: one answer (a
    failover leader whose failover may still abort, a stale or cut-off sentinel) never decides.
    """
    if sentinels < 1:
        raise ValueError(f"sentinels must be at least 1, got {sentinels!r}")
    if not answers:
        return None
    newest = max(a.config_epoch for a in answers)
    votes = collections.Counter(a.address for a in answers if a.config_epoch == newest)
    address, count = votes.most_common(1)[0]
    return address if count >= quorum_of(sentinels) else None


class FollowingSentinel(Sentinel):
    """redis-py's Sentinel whose discovery needs a majority of sentinels (or the watcher's answer).

    redis-py takes the first sentinel's `SENTINEL MASTERS` entry, which is the OLD master on the
    failover leader until its failover ends. With a watcher running, new connections use the
    watcher's latest answer (no round trip; it was agreed by a majority); without one, every
    sentinel is asked and only an address a majority agrees on is used (see `agreed_master`).
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
                # The epoch before and after the address: an answer is one configuration's only.
                pipe.sentinel_master(service_name)
                pipe.sentinel_get_master_addr_by_name(service_name)
                pipe.sentinel_master(service_name)
                before, addr, after = await pipe.execute()
        epoch = int(before.get("config-epoch", 0))
        if epoch != int(after.get("config-epoch", 0)):
            raise MasterNotFoundError("the sentinel's configuration changed while it was asked")
        return SentinelAnswer(address=_address(*addr), config_epoch=epoch)

    async def agreed_master(self, service_name: str, *, timeout_s: float) -> Address | None:
        """Ask every sentinel; the address a majority of them agree on (`agreed_master`), or None."""
        answers = await self.ask(service_name, timeout_s=timeout_s)
        return agreed_master(answers, sentinels=len(self.sentinels))

    async def discover_master(self, service_name: str) -> Address:
        if self.followed is not None:
            return self.followed
        timeout_s = self.sentinels[0].connection_pool.connection_kwargs.get("socket_timeout") or 1.0
        address = await self.agreed_master(service_name, timeout_s=timeout_s)
        if address is None:
            # Failing the connection is safe (a failed request); guessing an address is not.
            raise MasterNotFoundError(
                f"No master found for {service_name!r}: no majority of the "
                f"{len(self.sentinels)} sentinels agree on one"
            )
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
        #: Polls that found a majority; polls that did not (the address was kept); wake-ups by a
        #: sentinel's message.
        self.polls = 0
        self.undecided = 0
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
        """Stop polling and listening. Bounded: a task that does not end within `CLOSE_WAIT_S` of
        its cancellation, sent again every `elector.tasks.RESEND_S` (a client library that
        swallows every one), is named in the log, with where it waits, and left behind, so a
        shutdown never hangs on it."""
        tasks, self._tasks = self._tasks, []
        # Sent again while a task runs on: a listener whose one cancellation 3.11's wait_for
        # drops goes back to a read with no end (elector/tasks.py).
        left = await cancel_until_done(tasks, within_s=CLOSE_WAIT_S)
        for task in left:
            logger.error(
                "sentinel master watcher: task %s did not end within %.1fs of its cancellation "
                "(left behind); it waits at %s", task.get_name(), CLOSE_WAIT_S, "; ".join(await_chain(task)),
            )  # fmt: skip
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
        """Ask the sentinels once; move the pool if a majority names another master. The move, if any."""
        answers = await self._manager.ask(self._pool.service_name, timeout_s=self.request_timeout_s)
        total = len(self._manager.sentinels)
        address = agreed_master(answers, sentinels=total)
        if address is None:
            # Kept where it is. Brief disagreement is normal while a configuration spreads.
            self.undecided += 1
            if len(answers) < quorum_of(total):
                self._trouble(f"{len(answers)} of {total} sentinels answered; a majority is needed")
            else:
                logger.debug("sentinel master watcher: no majority yet: %s", answers)
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
        backoff = Backoff(base_s=RESUBSCRIBE_MIN_S, cap_s=RESUBSCRIBE_MAX_S)
        while True:
            pubsub = sentinel.pubsub()
            try:
                async with asyncio.timeout(self.request_timeout_s * 2):
                    await pubsub.subscribe(*WAKE_CHANNELS)
                backoff.succeeded()
                await self._read(pubsub)
            except Exception as exc:
                logger.debug("sentinel subscription lost: %r", exc)
            finally:
                await _drop_subscription(pubsub, timeout_s=self.request_timeout_s)
            await asyncio.sleep(backoff.failed())

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


async def _drop_subscription(pubsub: redis.asyncio.client.PubSub, *, timeout_s: float) -> None:
    """Close a sentinel subscription: first its socket, without any wait; then, unless the task
    is being cancelled (the watcher closes), redis-py's own close, bounded, which gives the
    connection back to its client's pool (a resubscribing listener must not leak one per retry).

    Why: on a loaded host, after a failover, redis-py's `pubsub.aclose()` can wait without end,
    under a timeout that should have ended it (docs/topologies.md, "Pub/sub and READONLY"). A
    close that does not wait cannot be held; with its socket closed first, the library's close has
    nothing left to wait for."""
    connection = pubsub.connection
    if connection is not None:
        with contextlib.suppress(Exception):
            # nowait: no StreamWriter.wait_closed(), so this returns without suspending.
            await connection.disconnect(nowait=True)
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        return  # the pool goes with its client, which the caller closes next
    with contextlib.suppress(Exception, TimeoutError):
        async with asyncio.timeout(timeout_s):
            await pubsub.aclose()  # type: ignore[no-untyped-call]


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
