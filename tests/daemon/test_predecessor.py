"""A renamed lock led only together with its predecessor (elector/daemon/predecessor.py).

Elections of the previous release (the old lock alone) and of the new one (both locks through
`PredecessorLeaseBackend`) on in-memory locks, in virtual time (looptime): who believes it leads is
sampled every 10 ms of loop time, and no two may ever overlap.
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from elector.daemon.predecessor import PredecessorLeaseBackend
from elector.daemon.settings import Settings, SettingsError, build_settings
from elector.election import Election, OutcomeKind, StepDownReason
from elector.lease import Granted, Held, Lease
from tests.election.fake_backend import FakeBackend, FakeStore, unreachable
from tests.support.election import Candidate, Recorder, cancel_all, now, timing

pytestmark = pytest.mark.looptime

TTL_S = 3.0
OLD, NEW = "jobs-elector", "apps/jobs-elector"


class Fleet:
    """Replicas of both releases on two in-memory locks; `watch()` samples who leads."""

    def __init__(self) -> None:
        self.old = FakeStore()
        self.new = FakeStore()
        self.candidates: list[Candidate] = []
        self.composites: dict[str, PredecessorLeaseBackend] = {}
        #: Sampled: instants at which more than one believed it leads, with who.
        self.overlaps: list[tuple[float, list[str]]] = []
        self._watcher: asyncio.Task[None] | None = None

    def start(self, identity: str, *, release: str, predecessor: bool = True) -> Candidate:
        old_lock = FakeBackend(self.old, lock=OLD)
        backend: FakeBackend | PredecessorLeaseBackend = old_lock
        if release == "new":
            backend = FakeBackend(self.new, lock=NEW)
            if predecessor:
                backend = PredecessorLeaseBackend(backend, predecessor=old_lock)
                self.composites[identity] = backend
        recorder = Recorder()
        election = Election(
            backend, identity=identity, timing=timing(TTL_S), hooks=recorder.hooks(), rng=random.Random(7)
        )
        task = asyncio.create_task(election.run(), name=identity)
        # `backend` of a Candidate is the old lock's, for its request counts.
        candidate = Candidate(election=election, backend=old_lock, recorder=recorder, task=task)
        self.candidates.append(candidate)
        if self._watcher is None:
            self._watcher = asyncio.create_task(self._watch())
        return candidate

    def leaders(self) -> list[str]:
        return [c.election.identity for c in self.candidates if c.election.status().is_leader]

    async def _watch(self) -> None:
        while True:
            leading = self.leaders()
            if len(leading) > 1:
                self.overlaps.append((now(), leading))
            await asyncio.sleep(0.01)

    async def stop(self, candidate: Candidate) -> None:
        candidate.election.stop()
        await candidate.task
        self.candidates.remove(candidate)

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
        await cancel_all([c.task for c in self.candidates] + ([self._watcher] if self._watcher else []))


@pytest.fixture
async def fleet() -> Iterator[Fleet]:
    running = Fleet()
    yield running  # type: ignore[misc]
    await running.close()


async def until(condition: Callable[[], bool], *, within_s: float) -> float:
    """Loop time at which `condition` first held (checked every 10 ms of virtual time)."""
    deadline = now() + within_s
    while not condition():
        assert now() < deadline, "the condition did not hold in time"
        await asyncio.sleep(0.01)
    return now()


async def test_a_rolling_update_and_a_rollback_never_give_two_leaders(fleet: Fleet) -> None:
    """Deployment order: a new pod up, then an old one stopped (the leading one first); then back."""

    async def replace(going: list[Candidate], *, release: str, count: int) -> None:
        for i in range(count):
            fleet.start(f"{release}-{i}-{now():.2f}", release=release)
            await asyncio.sleep(1.0)
            leading = [c for c in going if c.election.status().is_leader]
            victim = (leading or going)[0]
            await fleet.stop(victim)
            going.remove(victim)
            await until(lambda: len(fleet.leaders()) == 1, within_s=0.5)  # handed over at once

    olds = [fleet.start(f"old-{i}", release="old") for i in range(2)]
    await until(lambda: len(fleet.leaders()) == 1, within_s=1)
    await replace(olds, release="new", count=2)
    assert fleet.leaders()[0].startswith("new")
    news = list(fleet.candidates)
    await replace(news, release="old", count=2)  # the rollback
    assert fleet.leaders()[0].startswith("old")
    assert fleet.overlaps == []


async def test_without_the_predecessor_a_rolling_update_gives_two_leaders(fleet: Fleet) -> None:
    """Why the setting exists: the new pod leads the new lock beside the old lock's leader."""
    fleet.start("old-0", release="old")
    await until(lambda: len(fleet.leaders()) == 1, within_s=1)
    fleet.start("new-0", release="new", predecessor=False)
    await asyncio.sleep(1.0)
    assert sorted(fleet.leaders()) == ["new-0", "old-0"]
    assert fleet.overlaps


async def test_the_work_sees_the_predecessors_token_which_orders_every_term(fleet: Fleet) -> None:
    old = fleet.start("old-0", release="old")
    await until(lambda: len(fleet.leaders()) == 1, within_s=1)
    fleet.new.counter = 10**6  # the new lock's own counter says nothing about the old terms
    new = fleet.start("new-0", release="new")
    await asyncio.sleep(0.5)
    await fleet.stop(old)
    await until(lambda: fleet.leaders() == ["new-0"], within_s=0.5)
    tokens = [call[1] for c in (old, new) for call in c.recorder.calls if call[0] == "started"]
    assert tokens == [1, 2]  # the old lock's counter: old's term, then new's
    again = fleet.start("old-1", release="old")
    await asyncio.sleep(0.5)
    await fleet.stop(new)
    await until(lambda: fleet.leaders() == ["old-1"], within_s=0.5)
    assert [call[1] for call in again.recorder.calls if call[0] == "started"] == [3]


async def test_two_new_replicas_exclude_each_other_and_take_over_at_once(fleet: Fleet) -> None:
    a = fleet.start("new-a", release="new")
    await until(lambda: fleet.leaders() == ["new-a"], within_s=0.5)
    b = fleet.start("new-b", release="new")
    await asyncio.sleep(2 * TTL_S)
    assert fleet.leaders() == ["new-a"]
    stopped_at = now()
    await fleet.stop(a)
    taken_at = await until(lambda: fleet.leaders() == ["new-b"], within_s=0.5)
    assert taken_at - stopped_at < 0.05  # woken by the predecessor's release announcement
    assert b.recorder.first(OutcomeKind.ACQUIRED)
    assert fleet.overlaps == []


async def test_followers_show_the_leader_with_the_token_its_work_sees(fleet: Fleet) -> None:
    fleet.new.counter = 10**6  # the new lock's tokens differ from the predecessor's
    a = fleet.start("new-a", release="new")
    await until(lambda: fleet.leaders() == ["new-a"], within_s=0.5)
    b = fleet.start("new-b", release="new")
    old = fleet.start("old-c", release="old")
    await asyncio.sleep(2 * TTL_S)
    token = a.election.status().fencing_token
    assert token == 1
    for follower in (b, old):
        holder = follower.election.status().holder
        assert holder is not None
        assert (holder.identity, holder.fencing_token) == ("new-a", token)


async def test_a_failed_attempt_gives_the_new_lock_back_without_waking_anyone(fleet: Fleet) -> None:
    """An old leader holds the predecessor: a new replica that got the new lock gives it back, and
    followers (who listen to the predecessor) are not woken by that: no storm of attempts."""
    fleet.start("old-0", release="old")
    await until(lambda: fleet.leaders() == ["old-0"], within_s=1)
    news = [fleet.start(f"new-{i}", release="new") for i in range(3)]
    await asyncio.sleep(10 * TTL_S)
    assert fleet.leaders() == ["old-0"]
    assert fleet.new.current() is None  # nobody keeps the new lock while the old leader leads
    for candidate in news:
        # A follower looks when the holder's lease would run out: about once per renew interval.
        attempts = candidate.backend.requests["acquire"]
        assert attempts <= 10 * TTL_S / timing(TTL_S).renew_interval_s + 2, attempts


async def test_a_lost_predecessor_ends_the_term_and_the_new_lock_follows_later(fleet: Fleet) -> None:
    a = fleet.start("new-a", release="new")
    await until(lambda: fleet.leaders() == ["new-a"], within_s=0.5)
    fleet.old.overwrite("someone", ttl_s=1.0)  # the predecessor's key is not ours any more
    await until(lambda: fleet.leaders() == [], within_s=timing(TTL_S).renew_interval_s + 0.1)
    lost = a.recorder.first(OutcomeKind.RENEW_LOST)
    assert lost.step_down_reason is StepDownReason.LOST
    # The new lock is kept until the step-down has stopped the work, then given back.
    await until(lambda: fleet.leaders() == ["new-a"], within_s=2.0)
    assert fleet.overlaps == []


async def test_a_predecessor_that_cannot_be_renewed_is_given_up_before_it_could_lapse(fleet: Fleet) -> None:
    a = fleet.start("new-a", release="new")
    await until(lambda: fleet.leaders() == ["new-a"], within_s=0.5)
    composite = fleet.composites["new-a"]
    predecessor_backend = composite._predecessor
    assert isinstance(predecessor_backend, FakeBackend)
    await asyncio.sleep(0.01)
    predecessor_backend.fail_with = unreachable()
    stored = fleet.old.current()
    assert stored is not None
    expires_at = stored.expires_at  # the last renewal of the predecessor that landed
    await until(lambda: fleet.leaders() == [], within_s=TTL_S)
    stopped = next(call for call in a.recorder.calls if call[0] == "stopped")
    assert stopped[2] < expires_at
    assert stopped[1] is StepDownReason.RENEW_DEADLINE


async def test_a_handoff_asked_on_either_lock_is_honoured(fleet: Fleet) -> None:
    fleet.start("new-a", release="new")
    fleet.start("old-b", release="old")
    await until(lambda: fleet.leaders() == ["new-a"], within_s=0.5)
    fleet.old.request_handoff(to="old-b", window_s=TTL_S)  # the previous release's `elector handoff`
    await until(lambda: fleet.leaders() == ["old-b"], within_s=0.5)
    fleet.start("new-c", release="new")
    # The release to old-b left a handoff key on both locks: the new one's, for its window, keeps
    # every new replica out while old-b takes over (old-b never contends for the new lock).
    await asyncio.sleep(TTL_S)
    fleet.old.request_handoff(to="new-c", window_s=TTL_S)
    await until(lambda: fleet.leaders() == ["new-c"], within_s=0.5)
    assert fleet.new.current() is not None and fleet.old.current() is not None
    fleet.new.request_handoff(to="new-a", window_s=TTL_S)  # the new release's, on the new lock
    # Leaders listen to the predecessor's announcements only: this one is read at the next renewal.
    await until(lambda: fleet.leaders() == ["new-a"], within_s=timing(TTL_S).renew_interval_s + 0.5)
    assert fleet.overlaps == []


async def test_an_acquire_cut_short_gives_the_new_lock_back_at_the_next_attempt() -> None:
    old, new = FakeStore(), FakeStore()
    predecessor = FakeBackend(old, lock=OLD)
    composite = PredecessorLeaseBackend(FakeBackend(new, lock=NEW), predecessor=predecessor)
    predecessor.fail_with = unreachable()
    with pytest.raises(Exception, match="connection refused"):
        await composite.acquire("a", ttl_ms=3000)
    assert new.current() is not None  # granted, and kept until the next attempt
    predecessor.fail_with = None
    old.overwrite("old-0", ttl_s=3.0)
    result = await composite.acquire("a", ttl_ms=3000)
    assert isinstance(result, Held)
    assert result.holder is not None and result.holder.identity == "old-0"
    assert new.current() is None
    old.lease = None
    granted = await composite.acquire("a", ttl_ms=3000)
    assert isinstance(granted, Granted)
    assert granted.lease.lock == NEW


async def test_a_held_new_lock_is_reported_even_when_the_predecessor_cannot_be_read() -> None:
    old, new = FakeStore(), FakeStore()
    predecessor = FakeBackend(old, lock=OLD)
    composite = PredecessorLeaseBackend(FakeBackend(new, lock=NEW), predecessor=predecessor)
    new.overwrite("later-0", ttl_s=3.0)  # a replica of a later release, without the predecessor
    predecessor.fail_with = unreachable()
    result = await composite.acquire("a", ttl_ms=3000)
    assert isinstance(result, Held)
    assert result.holder is not None and result.holder.identity == "later-0"


def test_a_lock_cannot_be_its_own_predecessor() -> None:
    store = FakeStore()
    with pytest.raises(ValueError, match="another lock"):
        PredecessorLeaseBackend(FakeBackend(store, lock=NEW), predecessor=FakeBackend(store, lock=NEW))


def _lease(lock: str) -> Lease:
    return Lease(lock=lock, identity="a", fencing_token=1, ttl_ms=1000, value="x")


async def test_an_unknown_lease_is_lost_and_not_released() -> None:
    composite = PredecessorLeaseBackend(
        FakeBackend(FakeStore(), lock=NEW), predecessor=FakeBackend(FakeStore(), lock=OLD)
    )
    assert (await composite.renew(_lease(NEW))).holder is None  # type: ignore[union-attr]
    assert await composite.release(_lease(NEW)) is False


# --- the setting ------------------------------------------------------------------------------


def _settings(**overrides: object) -> Settings:
    kwargs: dict[str, object] = {"lock": NEW, "identity": "pod-0", "redis_url": "redis://127.0.0.1:1/0"}
    kwargs.update(overrides)
    return build_settings(**kwargs)  # type: ignore[arg-type]


def test_the_setting_names_one_other_lock() -> None:
    assert _settings(predecessor_lock=OLD).predecessor_lock == OLD
    assert _settings(predecessor_lock="").predecessor_lock is None  # an empty variable: no rename
    assert _settings().predecessor_lock is None


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"predecessor_lock": "{x}"}, "is not a valid lock name"),
        ({"predecessor_lock": NEW}, "is --lock itself"),
        ({"lock": [NEW, "other"], "predecessor_lock": OLD}, "but 2 locks were given"),
    ],
)
def test_combinations_that_cannot_be_made_safe_are_refused(
    overrides: dict[str, object], fragment: str
) -> None:
    with pytest.raises(SettingsError, match=r"^--predecessor-lock: ") as caught:
        _settings(**overrides)
    assert fragment in str(caught.value)


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (["--lock", NEW, "--lock", "other", "--predecessor-lock", OLD], {}),
        (["--lock", NEW], {"ELECTOR_PREDECESSOR_LOCK": NEW}),
    ],
)
def test_elector_run_exits_2_naming_the_setting(args: list[str], env: dict[str, str]) -> None:
    argv = [sys.executable, "-m", "elector", "run", "--redis-url", "redis://127.0.0.1:1/0", *args]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, env={**os.environ, **env}, check=False
    )
    assert done.returncode == 2, done.stderr
    assert "--predecessor-lock" in done.stderr
    assert "Traceback" not in done.stderr
