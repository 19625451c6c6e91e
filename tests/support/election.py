"""Elections against the in-memory fake backend (tests/election/fake_backend.py), in virtual time.

The `store`, `start` and `runs` fixtures (tests/conftest.py) build on these:

    a = start("a")                           # a Candidate: its election runs in a task
    b = start("b", priority=5, ttl_s=6.0)
    a.recorder.kinds(), a.election.status()  # what its hooks were told, in order

Every task started is cancelled after the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
from collections.abc import Callable, Iterable

from elector.election import (
    CycleOutcome,
    Election,
    ElectionHooks,
    ElectionTiming,
    OutcomeKind,
    StepDownReason,
)
from elector.lease import Holder, Lease
from tests.election.fake_backend import FakeBackend, FakeStore

#: The ttl of the state-machine tests: a renew deadline at 2 s, a request timeout of 0.5 s.
TTL_S = 3.0


def now() -> float:
    """The running loop's time: virtual under looptime."""
    return asyncio.get_running_loop().time()


def timing(ttl_s: float = TTL_S) -> ElectionTiming:
    """Renewals every ttl/3 (pinned, not the default 0.9 s share, so renewal times are round)."""
    return ElectionTiming.from_ttl(ttl_s, renew_interval_s=ttl_s / 3)


@dataclasses.dataclass
class Recorder:
    """Everything an election told its hooks, in order."""

    outcomes: list[CycleOutcome] = dataclasses.field(default_factory=list)
    calls: list[tuple[str, object, float]] = dataclasses.field(default_factory=list)

    def hooks(self) -> ElectionHooks:
        loop = asyncio.get_running_loop()

        async def started(lease: Lease) -> None:
            self.calls.append(("started", lease.fencing_token, loop.time()))

        async def stopped(reason: StepDownReason) -> None:
            self.calls.append(("stopped", reason, loop.time()))

        def new_leader(holder: Holder | None) -> None:
            self.calls.append(("new_leader", holder.identity if holder else None, loop.time()))

        return ElectionHooks(
            on_outcome=self.outcomes.append,
            on_started_leading=started,
            on_stopped_leading=stopped,
            on_new_leader=new_leader,
        )

    def kinds(self) -> list[OutcomeKind]:
        return [o.kind for o in self.outcomes]

    def first(self, kind: OutcomeKind) -> CycleOutcome:
        return next(o for o in self.outcomes if o.kind is kind)


@dataclasses.dataclass
class Candidate:
    election: Election
    backend: FakeBackend
    recorder: Recorder
    task: asyncio.Task[None]


class CandidateStarter:
    """Starts elections on one store (`starter(identity, ...)`); `cancel_all()` ends them."""

    def __init__(self, store: FakeStore) -> None:
        self.store = store
        self.started: list[Candidate] = []

    def __call__(
        self,
        identity: str,
        *,
        ttl_s: float = TTL_S,
        clock: Callable[[], float] | None = None,
        default_timing: bool = False,
        priority: int = 0,
        preempt_after_s: float | None = None,
    ) -> Candidate:
        backend = FakeBackend(self.store)
        recorder = Recorder()
        election = Election(
            backend,
            identity=identity,
            timing=ElectionTiming.from_ttl(ttl_s) if default_timing else timing(ttl_s),
            hooks=recorder.hooks(),
            rng=random.Random(7),
            clock=clock,
            priority=priority,
            preempt_after_s=preempt_after_s,
        )
        task = asyncio.create_task(election.run(), name=identity)
        candidate = Candidate(election=election, backend=backend, recorder=recorder, task=task)
        self.started.append(candidate)
        return candidate

    async def cancel_all(self) -> None:
        await cancel_all(candidate.task for candidate in self.started)


async def cancel_all(tasks: Iterable[asyncio.Task[None]]) -> None:
    """Cancel each task and wait for it to end."""
    for task in tasks:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
