"""An Elector used in a forked child is refused at once, clearly; pickling says the same.

Against a real redis-server: the parent leads, a child forked by multiprocessing tries the
parent's Elector, and journals what each call did and how long it took. Before the fix the child
reported `is_leader=True` beside its leading parent and `leadership(timeout=3)` hung for ever.
"""

from __future__ import annotations

import multiprocessing
import pickle
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

import elector
import elector.sync
from tests.support.seed import seed_used_lock

LOCK = "jobs"
#: The child's whole run, as a hang bound (each refusal itself is immediate).
CHILD_HANG_BOUND_S = 20.0


def _use_in_child(e: elector.sync.Elector, term: elector.Leadership, journal: str) -> None:
    calls: dict[str, Callable[[], object]] = {
        "is_leader": lambda: e.is_leader,
        "status": e.status,
        "leadership": lambda: e.leadership(timeout=3).__enter__(),
        "wait_for_leadership": lambda: e.wait_for_leadership(timeout=3),
        "check": term.check,
        "close": e.close,
    }
    with open(journal, "a", buffering=1) as out:
        for name, call in calls.items():
            started = time.monotonic()
            try:
                result = repr(call())
            except Exception as exc:
                result = f"{type(exc).__name__}: {exc}"
            out.write(f"{name}\t{time.monotonic() - started:.3f}\t{result}\n")


def _child_journal(path: Path) -> dict[str, tuple[float, str]]:
    lines = [line.split("\t") for line in path.read_text().splitlines()] if path.exists() else []
    return {name: (float(took), result) for name, took, result in lines}


def test_a_forked_child_is_refused_the_parents_sync_elector(redis_url: str, tmp_path: Path) -> None:
    client = redis.Redis.from_url(redis_url)
    seed_used_lock(client, LOCK)
    journal = tmp_path / "child"
    try:
        with elector.sync.Elector(LOCK, redis=redis_url, ttl_s=2) as e:
            term = e.wait_for_leadership(timeout=10)
            child = multiprocessing.get_context("fork").Process(
                target=_use_in_child, args=(e, term, str(journal))
            )
            child.start()
            child.join(timeout=CHILD_HANG_BOUND_S)
            if child.is_alive():
                child.kill()
                child.join()
            found = _child_journal(journal)
            calls = {"is_leader", "status", "leadership", "wait_for_leadership", "check", "close"}
            assert set(found) == calls
            for name, (took_s, result) in found.items():
                assert result.startswith("ForkedElectorError: "), (name, result)
                assert "fork" in result and "post_fork" in result and "worker_process_init" in result
                # Refused before any wait: a hang would take the whole 3 s timeout at least.
                assert took_s < 1.0, (name, took_s)
            # The child's refused close() released nothing: the parent leads on, on its lease.
            assert e.is_leader and term.remaining() > 0
            assert client.get(f"elector:{{{LOCK}}}:lease") is not None
    finally:
        client.close()


async def _async_child(e: elector.Elector) -> str:
    try:
        await e.wait_for_leadership(timeout=3)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return "led"


def _run_async_child(e: elector.Elector, journal: str) -> None:
    import asyncio

    Path(journal).write_text(asyncio.run(_async_child(e)))


async def test_a_forked_child_is_refused_the_parents_async_elector(redis_url: str, tmp_path: Path) -> None:
    journal = tmp_path / "child"
    async with elector.Elector(LOCK, redis=redis_url, ttl_s=2) as e:
        await e.wait_for_leadership(timeout=10)
        child = multiprocessing.get_context("fork").Process(target=_run_async_child, args=(e, str(journal)))
        child.start()
        child.join(timeout=CHILD_HANG_BOUND_S)
        if child.is_alive():
            child.kill()
            child.join()
        assert journal.read_text().startswith("ForkedElectorError: ")
        assert e.is_leader


def test_an_elector_and_its_term_refuse_pickling_with_the_same_advice(redis_url: str) -> None:
    with elector.sync.Elector(LOCK, redis=redis_url, ttl_s=2) as e:
        term = e.wait_for_leadership(timeout=10)
        for thing in (e, e._core, term):
            with pytest.raises(TypeError, match=r"cannot pickle the .* worker_process_init"):
                pickle.dumps(thing)


def test_spawned_processes_are_told_why_the_elector_cannot_go_there(redis_url: str) -> None:
    e = elector.sync.Elector(LOCK, redis=redis_url, ttl_s=2)  # never started: refused all the same
    process = multiprocessing.get_context("spawn").Process(target=print, args=(e,))
    with pytest.raises(TypeError, match="post_fork"):
        process.start()


def test_leadership_lost_can_be_raised_by_user_code_and_pickled() -> None:
    plain = elector.LeadershipLost()
    assert plain.reason is elector.StepDownReason.LOST and str(plain) == "leadership ended: lost"
    own = elector.LeadershipLost("the fence refused our write", lock="jobs", fencing_token=7)
    assert str(own) == "leadership of lock 'jobs' (fencing token 7) ended: the fence refused our write"
    lost = elector.LeadershipLost("lease_expired", lock="jobs", fencing_token=3)
    again = pickle.loads(pickle.dumps(lost))
    expired = elector.StepDownReason.LEASE_EXPIRED
    assert (again.reason, again.lock, again.fencing_token) == (expired, "jobs", 3)


def _watch_in_child(watcher: elector.sync.LeaderWatcher, journal: str) -> None:
    try:
        result = repr(watcher.leader)
    except Exception as exc:
        result = f"{type(exc).__name__}: {exc}"
    Path(journal).write_text(result)


def test_a_forked_child_is_refused_the_parents_watch(redis_url: str, tmp_path: Path) -> None:
    """The watch's thread does not exist in the child: its copy would show a frozen leader."""
    journal = tmp_path / "child"
    with elector.sync.watch(LOCK, redis=redis_url, ttl_s=2, on_change=lambda leader: None) as watcher:
        child = multiprocessing.get_context("fork").Process(
            target=_watch_in_child, args=(watcher, str(journal))
        )
        child.start()
        child.join(timeout=CHILD_HANG_BOUND_S)
        if child.is_alive():
            child.kill()
            child.join()
        assert journal.read_text().startswith("ForkedElectorError: the watch of lock 'jobs'")
        with pytest.raises(TypeError, match="cannot pickle the watch"):
            pickle.dumps(watcher)
