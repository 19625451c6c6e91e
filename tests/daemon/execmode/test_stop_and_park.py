"""The fast half of exec mode's handoff: stop() learns of exits without polling (pidfds, with the
old poll as the fallback), and a parked keeper starts the next command without an interpreter
start (ChildSupervisor.park). Real processes, as in test_supervisor.py.

No wall-clock bounds: a test that must show "no polling" makes the poll useless (an hour) and
checks that stop() still returns, within pytest's own timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import CapturingLogger

from elector.daemon.execmode import proctree
from elector.daemon.execmode import treestop as treestop_module
from elector.daemon.execmode.keeper import boottime
from elector.daemon.execmode.keeper_link import KeeperLink
from elector.daemon.execmode.proctree import ExitWatch
from elector.daemon.execmode.supervisor import ChildExit, ChildSupervisor
from tests.daemon.execmode.test_supervisor import assert_died_of, read_pids, running
from tests.support.waiting import until

GRACE_S = 0.5
#: Records its pid and the command's environment, keeps a grandchild; both exit on TERM.
SCRIPT = "echo $$ >> {d}/pids; sleep 1000 & echo $! >> {d}/pids; env > {d}/env; wait"


@pytest.fixture(autouse=True)
def kill_what_a_failed_test_left(tmp_path: Path) -> Iterator[None]:
    yield
    path = tmp_path / "pids"
    for pid in [int(word) for word in path.read_text().split()] if path.exists() else []:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def no_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both of stop()'s periodic looks take an hour: only wake-ups can end a stop in time."""
    monkeypatch.setattr(treestop_module, "_POLL_S", 3600.0)
    monkeypatch.setattr(treestop_module, "_RESCAN_S", 3600.0)


def supervisor_for(tmp_path: Path, exits: list[ChildExit], *, grace_s: float = 600.0) -> ChildSupervisor:
    # A grace of 10 minutes by default: the stop must not be the grace running out either.
    return ChildSupervisor(
        ["sh", "-c", SCRIPT.format(d=tmp_path)], kill_grace_s=grace_s, on_exit=exits.append,
        logger=CapturingLogger(),
    )  # fmt: skip


def link(grace_s: float = 600.0) -> KeeperLink:
    return KeeperLink(valid_until=boottime() + 3600, kill_grace_s=grace_s, margin_s=grace_s + 0.1)


def parked_link(grace_s: float = 600.0) -> KeeperLink:
    return KeeperLink.parked(kill_grace_s=grace_s, margin_s=grace_s + 0.1)


def env_of(tmp_path: Path) -> dict[str, str]:
    lines = (tmp_path / "env").read_text().splitlines() if (tmp_path / "env").exists() else []
    return dict(line.split("=", 1) for line in lines if "=" in line)


# -- stopping without polling ------------------------------------------------------------------


@pytest.mark.usefixtures("no_poll")
@pytest.mark.parametrize("keeper", [False, True], ids=["direct", "keeper"])
async def test_a_tree_that_exits_on_term_is_seen_gone_without_the_poll(tmp_path: Path, keeper: bool) -> None:
    exits: list[ChildExit] = []
    supervisor = supervisor_for(tmp_path, exits)
    await supervisor.start(env={}, keeper=link() if keeper else None)
    command, grandchild = await read_pids(tmp_path / "pids", count=2)

    result = await asyncio.wait_for(supervisor.stop(), timeout=60)  # an hour's poll would time out

    assert result is not None and result.stopped_by_us and result.survivors == ()
    assert result.signal == signal.SIGTERM
    assert not running(command) and not running(grandchild)
    assert exits == [], "a stop is not a natural exit"


@pytest.mark.usefixtures("no_poll")
async def test_the_kill_after_the_grace_is_seen_without_the_poll(
    tmp_path: Path, spawned: list[asyncio.subprocess.Process]
) -> None:
    exits: list[ChildExit] = []
    logger = CapturingLogger()
    supervisor = ChildSupervisor(
        ["sh", "-c", f"trap '' TERM; echo $$ >> {tmp_path}/pids; while :; do sleep 0.05; done"],
        kill_grace_s=0.2, on_exit=exits.append, logger=logger,
    )  # fmt: skip
    await supervisor.start(env={})
    [command] = await read_pids(tmp_path / "pids")

    result = await asyncio.wait_for(supervisor.stop(), timeout=60)

    assert result is not None and result.survivors == ()
    assert "child_kill_after_grace" in [call.args[0] for call in logger.calls]
    assert not running(command)
    # The SIGKILL, as stop() reports it, or (reported after the stop's reap slack on a loaded
    # machine: in this process a watcher thread per child reports exits) as asyncio does next.
    [child] = spawned
    await assert_died_of(signal.SIGKILL, result, child)


@pytest.mark.parametrize("error", [errno.ENOSYS, errno.EPERM])
async def test_without_pidfds_stop_falls_back_to_the_poll(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: int
) -> None:
    def refused(pid: int, flags: int = 0) -> int:
        raise OSError(error, os.strerror(error))

    monkeypatch.setattr(os, "pidfd_open", refused)
    exits: list[ChildExit] = []
    supervisor = supervisor_for(tmp_path, exits)
    await supervisor.start(env={}, keeper=link())
    command, grandchild = await read_pids(tmp_path / "pids", count=2)

    result = await asyncio.wait_for(supervisor.stop(), timeout=60)  # not the 10 minutes' grace

    assert result is not None and result.survivors == () and result.signal == signal.SIGTERM
    assert not running(command) and not running(grandchild)


async def test_the_exit_watch_wakes_once_every_watched_process_exited() -> None:
    wake = asyncio.Event()
    watch = ExitWatch(wake)
    first = await asyncio.create_subprocess_exec("sleep", "1000")
    second = await asyncio.create_subprocess_exec("sleep", "1000")
    try:
        watch.watch([first.pid, second.pid])
        assert watch.available and not wake.is_set()
        first.kill()
        await first.wait()
        await asyncio.sleep(0.05)
        assert not wake.is_set(), "one of two is not all"
        second.kill()
        await asyncio.wait_for(wake.wait(), timeout=30)
        wake.clear()
        watch.watch([first.pid])  # gone and reaped: nothing to wait for
        assert wake.is_set()
    finally:
        watch.close()
        for process in (first, second):
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()


async def test_the_exit_watch_turns_unavailable_when_pidfds_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refused(pid: int, flags: int = 0) -> int:
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", refused)
    watch = ExitWatch(asyncio.Event())
    watch.watch([os.getpid()])
    assert not watch.available
    monkeypatch.delattr(os, "pidfd_open")
    assert not ExitWatch(asyncio.Event()).available
    assert proctree.HAVE_PROC


# -- the parked keeper -------------------------------------------------------------------------


async def test_a_parked_keeper_runs_the_next_command_with_the_starts_environment(tmp_path: Path) -> None:
    exits: list[ChildExit] = []
    supervisor = supervisor_for(tmp_path, exits, grace_s=GRACE_S)
    assert await supervisor.park(keeper=parked_link(GRACE_S), env={"PATH": os.environ["PATH"], "OWN": "k"})
    parked = supervisor.parked_pid
    assert parked is not None and running(parked)
    assert not (tmp_path / "pids").exists(), "parked: nothing started"
    assert not await supervisor.park(keeper=parked_link(GRACE_S), env={}), "one parked keeper at a time"

    started = await supervisor.start(env={"ELECTOR_FENCING_TOKEN": "9"}, keeper=link(GRACE_S))

    assert started and supervisor.pid == parked and supervisor.parked_pid is None
    command, grandchild = await read_pids(tmp_path / "pids", count=2)
    assert os.getpgid(command) == parked == os.getsid(command)
    await until(lambda: "ELECTOR_FENCING_TOKEN" in env_of(tmp_path))
    assert env_of(tmp_path)["ELECTOR_FENCING_TOKEN"] == "9" and "OWN" not in env_of(tmp_path)
    assert supervisor.extend_validity(boottime() + 7200), "renewals reach the launched keeper"

    result = await supervisor.stop()

    assert result is not None and result.pid == parked and result.survivors == ()
    assert not any(running(pid) for pid in (command, grandchild))
    await supervisor.settle()  # the stop went on at the keeper's report, before its own exit
    await until(lambda: not running(parked), timeout_s=30)  # (settle's wait is bounded)


async def test_a_parked_keeper_gets_its_start_order_before_anything_else_runs(tmp_path: Path) -> None:
    # The start after a grant is one write to the parked keeper: no loop iteration comes first
    # (anything queued meanwhile, an announcement's parsing say, runs after the order is out).
    supervisor = supervisor_for(tmp_path, [], grace_s=GRACE_S)
    assert await supervisor.park(keeper=parked_link(GRACE_S), env={"PATH": os.environ["PATH"]})
    parked = supervisor.parked_pid
    ran: list[int] = []
    asyncio.get_running_loop().call_soon(ran.append, 1)

    started = await supervisor.start(env={"ELECTOR_FENCING_TOKEN": "3"}, keeper=link(GRACE_S))

    assert started and supervisor.pid == parked
    assert ran == [], "the start let the loop run before the order was written"
    command, grandchild = await read_pids(tmp_path / "pids", count=2)
    result = await supervisor.stop()
    assert result is not None and result.survivors == ()
    assert not any(running(pid) for pid in (command, grandchild))


async def test_a_parked_keeper_that_died_is_replaced_by_a_fresh_one(tmp_path: Path) -> None:
    supervisor = supervisor_for(tmp_path, [], grace_s=GRACE_S)
    assert await supervisor.park(keeper=parked_link(GRACE_S), env=dict(os.environ))
    parked = supervisor.parked_pid
    assert parked is not None
    os.kill(parked, signal.SIGKILL)
    await until(lambda: supervisor.parked_pid is None)

    assert await supervisor.start(env={}, keeper=link(GRACE_S))

    assert supervisor.pid not in (None, parked)
    await read_pids(tmp_path / "pids", count=2)
    result = await supervisor.stop()
    assert result is not None and result.survivors == ()


async def test_a_parked_keeper_with_other_timing_is_let_go_and_a_fresh_one_started(tmp_path: Path) -> None:
    supervisor = supervisor_for(tmp_path, [], grace_s=GRACE_S)
    assert await supervisor.park(keeper=parked_link(GRACE_S), env=dict(os.environ))
    parked = supervisor.parked_pid
    assert parked is not None

    assert await supervisor.start(env={}, keeper=link(GRACE_S + 1))

    assert supervisor.pid != parked
    await until(lambda: not running(parked))
    await read_pids(tmp_path / "pids", count=2)
    assert len((tmp_path / "pids").read_text().split()) == 2, "one command only"
    await supervisor.stop()


async def test_unpark_ends_the_parked_keeper_and_nothing_starts(tmp_path: Path) -> None:
    supervisor = supervisor_for(tmp_path, [], grace_s=GRACE_S)
    assert await supervisor.park(keeper=parked_link(GRACE_S), env=dict(os.environ))
    parked = supervisor.parked_pid
    assert parked is not None

    await supervisor.unpark()

    assert supervisor.parked_pid is None and not running(parked)
    assert not (tmp_path / "pids").exists()
    assert await supervisor.stop() is None, "no run"


async def test_no_keeper_is_parked_beside_a_run(tmp_path: Path) -> None:
    supervisor = supervisor_for(tmp_path, [], grace_s=GRACE_S)
    await supervisor.start(env={}, keeper=link(GRACE_S))
    await read_pids(tmp_path / "pids", count=2)
    assert not await supervisor.park(keeper=parked_link(GRACE_S), env=dict(os.environ))
    assert supervisor.parked_pid is None
    await supervisor.stop()
    assert supervisor.idle


def test_this_file_runs_where_pidfds_exist() -> None:
    assert sys.platform.startswith("linux") and hasattr(os, "pidfd_open")


def test_the_filtered_process_scan_finds_what_the_full_one_does() -> None:
    me, session = os.getpid(), os.getsid(0)

    def full() -> set[int]:
        return {proc.pid for proc in proctree.all_procs() if proc.sid == session or proc.ppid == me}

    # Other tests' processes (xdist workers share the session) come and go between scans, some
    # living only for the length of one: the filtered scan must find every process that both full
    # scans around it saw, and only processes that match (a newcomer seen by it alone is fine).
    before = full()
    filtered = proctree.all_procs(session=session, parent=me)
    after = full()
    assert before & after <= {proc.pid for proc in filtered}, (before & after) - {p.pid for p in filtered}
    assert all(proc.sid == session or proc.ppid == me for proc in filtered)
    children = {proc.pid for proc in proctree.all_procs() if proc.ppid == me}
    assert {proc.pid for proc in proctree.all_procs(parent=me)} == children


#: Switches the child watcher as the daemon does, then starts a child and waits for it.
PIDFD_WATCHER = """
import asyncio, threading
from elector.daemon.execmode.proctree import watch_children_with_pidfds

async def main():
    watch_children_with_pidfds(asyncio.get_running_loop())
    before = threading.active_count()
    process = await asyncio.create_subprocess_exec("sh", "-c", "exit 3")
    during = threading.active_count()
    print(before, during, await process.wait())

asyncio.run(main())
"""


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no pidfds")
def test_the_daemons_children_are_waited_for_in_its_loop_without_a_thread_each() -> None:
    # Python 3.11's default starts a thread per child, whose exit then needs the GIL back in the
    # middle of a handoff; with pidfds (3.12's default) the loop sees the exit itself.
    done = subprocess.run(
        [sys.executable, "-c", PIDFD_WATCHER], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    before, during, code = done.stdout.split()
    assert code == "3", "the child's exit status is reported"
    assert during == before, "a thread was started to wait for the child"
