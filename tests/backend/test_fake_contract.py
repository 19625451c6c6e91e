"""The in-memory fake backend and the real Lua scripts, through the same sequences of operations.

The state-machine tests (tests/election/) run against tests/election/fake_backend.py; this file
keeps that fake honest. Each sequence runs twice, step by step: on `RedisLeaseBackend` against a
real redis-server, and on the fake. Every step's outcome must be the same on both: granted or
not, who holds the lock, the lease's fencing token (by rank: Redis issues tokens from its clock,
the fake counts, both must strictly increase), a handoff and the best rival on renewal, what
`observe` reads, and at the end every announcement in order.

Time. The fake runs on a virtual clock that advances in whole ticks; Redis runs on its own clock,
and the test sleeps until the real time reaches each step's virtual time. Every duration (ttl,
handoff window) is a whole number of ticks plus half a tick. Each operation runs at Redis
between its due time and `LATE_TICKS` of a tick after it (it may start late, and steps due at
the same time run one after the other). Two operations' real distance then differs from their
virtual one (whole ticks) by less than that, so a deadline half a tick away falls on the same side
of both as long as `LATE_TICKS` < 1/2. An operation that ends later (a loaded machine) makes the
attempt inconclusive, never failed: it is run again, on a fresh lock, with ticks twice as long.
Remaining times are compared to within the same `LATE_TICKS` of a tick (plus rounding).

Batched. The same sequences run again with the Redis side's backends sharing a `ScriptBatcher`,
and each ACQUIRE, RENEW or RELEASE of a step sent together with the same call on a companion
lock: the step's call is then one lease of a batch script call (lua/batch.py), whose outcomes
must be the fake's all the same.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import typing
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import pytest
import redis.asyncio

from elector.backend import HandoffRefusedError, RedisLeaseBackend, RedisSettings, make_client
from elector.backend.pipeline import ScriptBatcher
from elector.lease import (
    Granted,
    Handoff,
    Held,
    Holder,
    Lease,
    LeaseBackend,
    LeaseBackendError,
    LeaseEvent,
    LeaseEventSubscription,
    Lost,
    Observation,
    QuietPeriod,
    Renewed,
    StandBack,
)
from elector.testing.redis_server import RedisServerProcess
from tests.election.fake_backend import FakeBackend, FakeStore
from tests.support.seed import seed_used_lock_async

T = typing.TypeVar("T")

#: The first attempt's tick; each inconclusive attempt doubles it. Seven attempts reach a 1.92 s
#: tick (0.77 s of lateness allowed, see LATE_TICKS): at a load average of 20 on 2 cores every one of five
#: attempts (up to 0.48 s ticks) ran late. Only an overloaded run pays for the extra ones.
TICK_S = 0.03
ATTEMPTS = 7
#: How late (in ticks) an operation may end and its outcome still be compared; below 1/2 (see the
#: module doc), with a tenth of a tick kept clear of the deadlines. It was a quarter: under a loaded
#: suite a chain of steps due at the same tick (13 of them, ~35 ms each) ended 0.49 s after its due
#: time, just over a quarter of the longest tick (1.92 s), in every attempt.
LATE_TICKS = 0.4
IDENTITIES = ("a", "b", "c")
#: A second instance (its own backend, so its own nonce) that reports the identity "a".
TWIN = "a~"
#: Every instance a side has: one per identity, and the twin.
INSTANCES = (*IDENTITIES, TWIN)
LAST = "last"
SEED_TOKEN = 1

Op = typing.Literal[
    "acquire", "renew", "release", "release_handoff", "request_handoff", "withdraw", "observe"
]


@dataclasses.dataclass(frozen=True)
class Step:
    op: Op
    #: An instance (an identity, or TWIN: identity "a" on a backend of its own), or LAST: the
    #: one granted most recently (the likely holder).
    who: str = "a"
    #: Whole ticks to wait before the operation.
    wait: int = 0
    #: The lease ttl of an acquire, in ticks (plus half a tick).
    ttl: int = 2
    priority: int = 0
    #: The handoff target (release_handoff, request_handoff); None: anyone else.
    to: str | None = None
    #: The handoff window, in ticks (plus half a tick).
    window: int = 2

    def __str__(self) -> str:
        shown = [f"+{self.wait}" if self.wait else "", self.op, self.who]
        if self.op == "acquire":
            shown.append(f"ttl={self.ttl}.5 prio={self.priority}")
        elif self.op == "renew":
            shown.append(f"prio={self.priority}")
        elif self.op in ("release_handoff", "request_handoff"):
            shown.append(f"to={self.to} window={self.window}.5")
        return " ".join(s for s in shown if s)


def acquire(who: str, *, wait: int = 0, ttl: int = 2, priority: int = 0) -> Step:
    return Step("acquire", who, wait=wait, ttl=ttl, priority=priority)


def renew(who: str, *, wait: int = 0, priority: int = 0) -> Step:
    return Step("renew", who, wait=wait, priority=priority)


def release(who: str, *, wait: int = 0) -> Step:
    return Step("release", who, wait=wait)


def release_to(who: str, to: str, *, wait: int = 0, window: int = 2) -> Step:
    return Step("release_handoff", who, wait=wait, to=to, window=window)


def request_handoff(to: str | None, *, wait: int = 0, window: int = 2) -> Step:
    return Step("request_handoff", "-", wait=wait, to=to, window=window)


def withdraw(who: str, *, wait: int = 0) -> Step:
    return Step("withdraw", who, wait=wait)


def observe(*, wait: int = 0) -> Step:
    return Step("observe", "-", wait=wait)


SCENARIOS: dict[str, list[Step]] = {
    "grant-then-held": [acquire("a"), acquire("b"), acquire("a"), observe()],
    "renewal-by-the-owner-keeps-the-lease": [
        acquire("a", ttl=1),
        *(renew("a", wait=1) for _ in range(4)),
        acquire("b"),
        observe(),
    ],
    "expiry-after-the-ttl": [
        acquire("a", ttl=1),
        observe(wait=1),
        observe(wait=1),
        renew("a"),
        acquire("b"),
        observe(),
    ],
    "renew-and-release-by-a-non-owner": [
        acquire("a", ttl=1),
        acquire("b", wait=2),
        renew("a"),
        release("a"),
        renew("b"),
        release("b"),
        release("b"),
        renew("b"),
        acquire("a"),
        observe(),
    ],
    "tokens-increase-over-many-grants": [
        step for _ in range(4) for step in (acquire("a"), release("a"), acquire("b"), release("b"))
    ],
    "requested-handoff-to-one-target": [
        acquire("a"),
        acquire("b"),
        acquire("c"),
        request_handoff("c", window=3),
        renew("a"),
        acquire("b"),
        release("a"),
        acquire("b"),
        acquire("a"),
        acquire("c"),
        acquire("b"),
        renew("c"),
    ],
    "requested-handoff-to-anyone": [
        acquire("a"),
        request_handoff(None),
        renew("a"),
        release("a"),
        acquire("a"),
        acquire("b"),
        observe(),
    ],
    "release-into-a-handoff-that-lapses": [
        acquire("a"),
        release_to("a", "c", window=1),
        acquire("b"),
        acquire("a"),
        acquire("b", wait=2),
        renew("b"),
    ],
    "handoff-refused-or-without-a-holder": [
        request_handoff("a"),
        acquire("a"),
        request_handoff("a"),
        renew("a"),
        release("a"),
        request_handoff("b"),
    ],
    "best-rival-by-priority-then-identity": [
        acquire("a", ttl=3, priority=1),
        acquire("b", priority=5),
        acquire("c", priority=5),
        renew("a", priority=1),
        withdraw("c"),
        renew("a", priority=1),
        acquire("b", wait=1, priority=0),
        renew("a", priority=1),
        renew("a", wait=2, priority=1),
        # b was last seen more than a ttl ago: its entry lives on (3 ttl), but it is no rival.
        renew("a", wait=2, priority=1),
        acquire("b", priority=7),
        renew("a", wait=2, priority=1),
        renew("a", wait=2, priority=1),
    ],
    # Two live instances of identity "a" (the twin has its own nonce): each registration that
    # finds the other's nonce on the live entry is a clash, but never an instance's first.
    "two-instances-of-one-identity": [
        acquire("c", ttl=3),
        acquire("a"),
        acquire(TWIN),  # its first registration: the entry it finds may be a predecessor's
        acquire("a"),
        acquire(TWIN),
        acquire(TWIN),  # its own nonce: no clash
        acquire("b"),
        renew("c"),
        withdraw("a"),  # the identity's entry and nonce go
        acquire(TWIN),
        release("c"),
        acquire("a"),  # granted, and a clash: the twin registered last
        acquire(TWIN),  # held under its own identity, and a clash
        renew("a"),
        renew("a"),
        acquire("b", wait=8),  # both of a's entries lapsed meanwhile (3 ttl) ...
        acquire(TWIN),  # ... so the twin finds none: no clash
        acquire("a"),  # a finds the twin's live entry again: a clash
    ],
}


def random_steps(seed: int, *, count: int = 30) -> list[Step]:
    """A reproducible random sequence over a few identities."""
    rng = random.Random(seed)
    ops = list(typing.get_args(Op))  # acquire, renew, release, release_handoff, request_handoff, ...
    weights = [26, 24, 7, 8, 10, 4, 7]
    steps = []
    for _ in range(count):
        op = rng.choices(ops, weights)[0]
        who = rng.choice(IDENTITIES)
        if op in ("renew", "release", "release_handoff") and rng.random() < 0.7:
            who = LAST  # mostly the holder: renewals and releases that do something
        steps.append(
            Step(
                op,
                "-" if op in ("observe", "request_handoff") else who,
                wait=rng.choices([0, 1, 2, 3, 5], [50, 32, 10, 5, 3])[0],
                ttl=rng.choice([1, 2, 3, 4]),
                priority=rng.choice([0, 0, 1, 2]),
                to=rng.choice([None, *IDENTITIES]),
                window=rng.choice([1, 2, 3]),
            )
        )
    return steps


# --- one side: a backend per identity, the leases they hold, tokens by rank ----------------------


class Inconclusive(Exception):
    """An operation started too late for its outcome to be compared (see the module docstring)."""


class Tokens:
    """Fencing tokens by rank: the seed counter is 0, and each new token must exceed every earlier one."""

    def __init__(self, seed: int | None) -> None:
        self.known: list[int] = [] if seed is None else [seed]

    def granted(self, token: int) -> int:
        assert not self.known or token > self.known[-1], f"token {token} after {self.known}: not increasing"
        self.known.append(token)
        return len(self.known) - 1

    def rank(self, token: int | None) -> object:
        if token is None:
            return None
        if token in self.known:
            return self.known.index(token)
        if not self.known or token > self.known[-1]:
            return self.granted(token)  # a counter read before its first grant (a new lock)
        return ("unknown token", token)


#: (what must be equal, remaining times in ms compared to within LATE_TICKS of a tick)
Outcome = tuple[tuple[object, ...], tuple[int | None, ...]]


@dataclasses.dataclass
class Side:
    name: str
    backends: dict[str, LeaseBackend]
    request: Callable[[str | None, int], Awaitable[Handoff | None]]
    subscription: LeaseEventSubscription
    tokens: Tokens
    leases: dict[str, Lease] = dataclasses.field(default_factory=dict)
    last_granted: str = "a"
    #: Batched (see the module doc): the same kind of call on a companion lock, sent together.
    companion: Callable[[Op], Awaitable[object]] | None = None
    #: Calls that went out with a companion.
    companions: int = 0

    async def together(self, op: Op, call: Awaitable[T]) -> T:
        """`call`, sent together with the companion's call of the same script (when batched)."""
        if self.companion is None:
            return await call
        self.companions += 1
        result, _ = await asyncio.gather(call, self.companion(op))
        return result

    def holder(self, holder: Holder | None) -> object:
        return None if holder is None else (holder.identity, self.tokens.rank(holder.fencing_token))

    def handoff(self, handoff: Handoff | None) -> Outcome:
        if handoff is None:
            return (None,), (None,)
        return (handoff.from_identity, handoff.to_identity), (handoff.remaining_ms,)

    async def apply(self, step: Step, *, tick_ms: int) -> Outcome:
        try:
            return await self._apply(step, tick_ms=tick_ms)
        except (LeaseBackendError, HandoffRefusedError, ValueError) as exc:
            return ("raised", type(exc).__name__), ()

    async def _apply(self, step: Step, *, tick_ms: int) -> Outcome:
        if step.who == LAST:
            step = dataclasses.replace(step, who=self.last_granted)

        def ms(ticks: int) -> int:  # whole ticks and a half: no deadline near an operation
            return ticks * tick_ms + tick_ms // 2

        backend = self.backends.get(step.who, self.backends["a"])
        identity = "a" if step.who == TWIN else step.who
        lease = self.leases.get(step.who)
        if step.op == "acquire":
            result = await self.together(
                "acquire", backend.acquire(identity, ttl_ms=ms(step.ttl), priority=step.priority)
            )
            clash = result.identity_clash
            if isinstance(result, Granted):
                self.leases[step.who] = result.lease
                self.last_granted = step.who
                rank = self.tokens.granted(result.lease.fencing_token)
                return ("granted", result.lease.identity, rank, result.lease.ttl_ms, clash), ()
            if isinstance(result, Held):
                return ("held", self.holder(result.holder), clash), (result.remaining_ms,)
            if isinstance(result, QuietPeriod):
                return ("quiet", clash), (result.remaining_ms,)
            assert isinstance(result, StandBack), result
            exact, approx = self.handoff(result.handoff)
            return ("stand back", *exact, clash), approx
        if step.op == "renew":
            if lease is None:
                return ("no lease",), ()
            renewed = await self.together("renew", backend.renew(lease, priority=step.priority))
            clash = renewed.identity_clash
            if isinstance(renewed, Lost):
                return ("lost", self.holder(renewed.holder), clash), (renewed.remaining_ms,)
            assert isinstance(renewed, Renewed), renewed
            exact, approx = self.handoff(renewed.handoff)
            rival = renewed.best_rival
            if rival is None:
                return ("renewed", exact, None, clash), (*approx, None)
            rival_seen = (rival.identity, rival.priority)
            return ("renewed", exact, rival_seen, clash), (*approx, rival.last_seen_ms_ago)
        if step.op in ("release", "release_handoff"):
            if lease is None:
                return ("no lease",), ()
            if step.op == "release":
                return ("released", await self.together("release", backend.release(lease))), ()
            released = await self.together(
                "release", backend.release(lease, handoff_to=step.to, handoff_window_ms=ms(step.window))
            )
            return ("released", released), ()
        if step.op == "request_handoff":
            try:
                exact, approx = self.handoff(await self.request(step.to, ms(step.window)))
            except HandoffRefusedError as exc:
                return ("refused", exc.holder), ()
            return ("handoff", *exact), approx
        if step.op == "withdraw":
            await backend.withdraw(identity)
            return ("withdrawn",), ()
        assert step.op == "observe", step
        seen: Observation = await backend.observe()
        return (
            "observed",
            self.holder(seen.holder),
            seen.unrecognised_value,
            self.tokens.rank(seen.last_fencing_token),
            seen.unknown_protocol,
        ), (seen.remaining_ms, seen.quiet_remaining_ms)

    def event(self, event: LeaseEvent) -> object:
        return (event.kind.value, self.holder(event.holder))

    async def events(self, *, count: int | None) -> list[object]:
        """Every announcement so far: `count` of them (or all that are already queued)."""
        found: list[object] = []
        timeout_s = 2.0 if count else 0.0
        while count is None or len(found) < count:
            event = await self.subscription.next_event(timeout_s)
            if event is None:
                break
            found.append(self.event(event))
        if count is not None:  # anything beyond what the fake announced is a difference too
            while (extra := await self.subscription.next_event(0.05)) is not None:
                found.append(self.event(extra))
        return found


def same(real: Outcome, fake: Outcome, *, tolerance_ms: int) -> bool:
    if real[0] != fake[0] or len(real[1]) != len(fake[1]):
        return False
    for r, f in zip(real[1], fake[1], strict=True):
        if (r is None) != (f is None) or (r is not None and f is not None and abs(r - f) > tolerance_ms):
            return False
    return True


# --- the two sides ---------------------------------------------------------------------------------


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclasses.dataclass
class Lab:
    """What one attempt runs on: a fresh lock on the shared redis-server, and a fresh fake."""

    raw: redis.asyncio.Redis
    client: redis.asyncio.Redis

    async def redis_side(self, lock: str, *, new_lock: bool, batcher: ScriptBatcher | None = None) -> Side:
        if not new_lock:
            await seed_used_lock_async(self.raw, lock, counter=SEED_TOKEN)
        backends: dict[str, LeaseBackend] = {
            who: RedisLeaseBackend(self.client, lock=lock, batcher=batcher) for who in INSTANCES
        }
        watcher = RedisLeaseBackend(self.client, lock=lock)

        async def request(to: str | None, window_ms: int) -> Handoff | None:
            return await watcher.request_handoff(to=to, window_ms=window_ms)

        subscription = await watcher.subscribe(keepalive_s=60)
        await watcher.observe()  # connected, and the script cached, before the clock starts
        side = Side("redis", backends, request, subscription, Tokens(None if new_lock else SEED_TOKEN))
        if batcher is not None:
            side.companion = await self.companion(f"{lock}-companion", batcher)
        return side

    async def companion(self, lock: str, batcher: ScriptBatcher) -> Callable[[Op], Awaitable[object]]:
        """The companion lock's calls: an acquire (granted, then held), a renewal and a release of
        a lease it never had (lost, not ours): each goes in the batch beside the step's call."""
        await seed_used_lock_async(self.raw, lock, counter=SEED_TOKEN)
        backend = RedisLeaseBackend(self.client, lock=lock, batcher=batcher)
        stranger = Lease(lock=lock, identity="stranger", fencing_token=1, ttl_ms=60_000, value="{}")

        async def call(op: Op) -> object:
            if op == "acquire":
                return await backend.acquire("companion", ttl_ms=60_000)
            if op == "renew":
                return await backend.renew(stranger)
            return await backend.release(stranger)

        return call

    @staticmethod
    async def fake_side(clock: VirtualClock, *, new_lock: bool) -> Side:
        store = FakeStore(clock=clock, new_lock=new_lock)
        if not new_lock:
            store.counter = SEED_TOKEN
        backends: dict[str, LeaseBackend] = {who: FakeBackend(store) for who in INSTANCES}

        async def request(to: str | None, window_ms: int) -> Handoff | None:
            return store.request_handoff(to=to, window_s=window_ms / 1000)

        subscription = await FakeBackend(store).subscribe(keepalive_s=60)
        return Side("fake", backends, request, subscription, Tokens(None if new_lock else SEED_TOKEN))

    async def attempt(
        self, name: str, steps: Sequence[Step], *, attempt: int, tick_s: float, new_lock: bool, batched: bool
    ) -> None:
        """Run `steps` on both sides; AssertionError on a difference, Inconclusive when too late."""
        clock = VirtualClock()
        # No flush spacing: the step's call goes out as soon as it joined the companion's.
        batcher = ScriptBatcher(self.client, min_flush_interval_s=0) if batched else None
        lock = f"contract-{name}-{attempt}" + ("-batched" if batched else "")
        real = await self.redis_side(lock, new_lock=new_lock, batcher=batcher)
        fake = await self.fake_side(clock, new_lock=new_lock)
        tick_ms = round(tick_s * 1000)
        late_s = tick_s * LATE_TICKS
        tolerance_ms = round(late_s * 1000) + 2
        loop = asyncio.get_running_loop()
        history: list[str] = []
        try:
            started = loop.time()
            for index, step in enumerate(steps):
                clock.now += step.wait * tick_s
                due = started + clock.now
                await asyncio.sleep(max(0.0, due - loop.time()))
                if loop.time() - due > late_s:
                    raise Inconclusive(f"step {index} started {loop.time() - due:.3f}s late")
                real_outcome = await real.apply(step, tick_ms=tick_ms)
                if loop.time() - due > late_s:
                    raise Inconclusive(f"step {index} took until {loop.time() - due:.3f}s after its time")
                fake_outcome = await fake.apply(step, tick_ms=tick_ms)
                history.append(f"{index:2} {step}: {real_outcome}")
                assert same(real_outcome, fake_outcome, tolerance_ms=tolerance_ms), (
                    f"{name}: step {index} ({step}) differs\n  redis: {real_outcome}\n"
                    f"  fake:  {fake_outcome}\nhistory (redis):\n  " + "\n  ".join(history)
                )
            fake_events = await fake.events(count=None)
            real_events = await real.events(count=len(fake_events))
            assert real_events == fake_events, f"{name}: announcements differ"
            if batcher is not None:  # every call of the steps went in a batch script, with its companion
                assert batcher.stats.batch_scripts == real.companions
                assert batcher.stats.batched_calls == 2 * real.companions
        finally:
            await real.subscription.close()
            await fake.subscription.close()
            if batcher is not None:
                await batcher.aclose()

    async def run(
        self, name: str, steps: Sequence[Step], *, new_lock: bool = False, batched: bool = False
    ) -> None:
        late = []
        for attempt in range(ATTEMPTS):
            try:
                await self.attempt(
                    name,
                    steps,
                    attempt=attempt,
                    tick_s=TICK_S * 2**attempt,
                    new_lock=new_lock,
                    batched=batched,
                )
                return
            except Inconclusive as exc:
                late.append(str(exc))
        pytest.fail(f"every attempt ran late, the machine is overloaded: {late}")


@pytest.fixture
async def lab(module_redis_server: RedisServerProcess) -> AsyncIterator[Lab]:
    """Every sequence runs on locks of its own, on the module's redis-server."""
    raw = redis.asyncio.Redis.from_url(module_redis_server.url)
    client = make_client(RedisSettings(url=module_redis_server.url, request_timeout_s=2.0))
    yield Lab(raw=raw, client=client)
    await client.aclose()
    await raw.aclose()


@pytest.mark.parametrize("batched", [False, True], ids=["single", "batched"])
@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_a_scenario_has_the_same_outcomes_on_the_fake_and_on_redis(
    lab: Lab, name: str, batched: bool
) -> None:
    await lab.run(name, SCENARIOS[name], batched=batched)


async def test_a_new_lock_starts_with_the_same_quiet_period_on_both(lab: Lab) -> None:
    steps = [
        observe(),
        acquire("a", ttl=2),
        acquire("b", ttl=1, wait=1),
        observe(),
        acquire("b", wait=2),
        observe(),
    ]
    await lab.run("new-lock", steps, new_lock=True)
    await lab.run("new-lock", steps, new_lock=True, batched=True)


@pytest.mark.parametrize("seed", range(20))
async def test_a_random_sequence_has_the_same_outcomes_on_the_fake_and_on_redis(lab: Lab, seed: int) -> None:
    await lab.run(f"random-{seed}", random_steps(seed))


@pytest.mark.parametrize("seed", range(0, 20, 2))
async def test_a_random_sequence_has_the_same_outcomes_on_the_fake_and_on_redis_batched(
    lab: Lab, seed: int
) -> None:
    await lab.run(f"random-{seed}", random_steps(seed), batched=True)


async def refusals(side: Side) -> list[object]:
    """What each call with a bad argument raised on `side` (kind and message), or "accepted"."""
    backend = side.backends["a"]
    granted = await backend.acquire("a", ttl_ms=5000)
    assert isinstance(granted, Granted)
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: backend.acquire("a", ttl_ms=0),
        lambda: backend.acquire("a", ttl_ms=5000, priority=2 * 10**9),
        lambda: backend.renew(granted.lease, priority=-(2 * 10**9)),
        lambda: backend.release(granted.lease, handoff_to="b", handoff_window_ms=0),
    ]
    found: list[object] = []
    for call in calls:
        try:
            await call()
        except LeaseBackendError as exc:
            found.append((exc.kind, str(exc)))
        else:
            found.append("accepted")
    await side.subscription.close()
    return found


async def test_bad_arguments_are_refused_alike(lab: Lab) -> None:
    """The real backend refuses them before sending (LeaseBackendError, DATA); so must the fake."""
    real = await refusals(await lab.redis_side("contract-bad-arguments", new_lock=False))
    fake = await refusals(await Lab.fake_side(VirtualClock(), new_lock=False))
    assert fake == real
    assert "accepted" not in real


async def test_the_random_sequences_reach_every_kind_of_outcome() -> None:
    """The generator is worth running: together its sequences reach every outcome of a used lock
    (run on the fake alone, in virtual time)."""
    reached: set[object] = set()
    for seed in range(20):
        clock = VirtualClock()
        side = await Lab.fake_side(clock, new_lock=False)
        for step in random_steps(seed):
            clock.now += step.wait * TICK_S
            exact, _ = await side.apply(step, tick_ms=round(TICK_S * 1000))
            if exact[0] == "renewed":
                reached.add(("renewed", "a handoff") if exact[1] != (None,) else ("renewed", "no handoff"))
                reached.add(("renewed", "a rival") if exact[2] is not None else ("renewed", "no rival"))
            elif exact[0] == "handoff":
                reached.add(("handoff", "started" if exact[1] is not None else "no holder"))
            else:
                reached.add(exact[:2] if exact[0] == "released" else exact[0])
    wanted = {
        "granted", "held", "stand back", "lost", "no lease", "withdrawn", "observed", "refused",
        ("renewed", "a handoff"), ("renewed", "no handoff"), ("renewed", "a rival"), ("renewed", "no rival"),
        ("released", True), ("released", False), ("handoff", "started"), ("handoff", "no holder"),
    }  # fmt: skip
    assert wanted <= reached, f"never reached: {wanted - reached} (reached: {reached})"
