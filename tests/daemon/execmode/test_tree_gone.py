"""The keeper's "tree gone" report (keeper.py's status pipe) and the stop that trusts it: the report
comes only after the whole tree is gone, never from a keeper killed before it verified that, and
with it stop() needs no /proc scan of its own. Real processes, as in test_keeper.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from structlog.testing import CapturingLogger

from elector.daemon.execmode import supervisor as supervisor_module
from elector.daemon.execmode.keeper_link import KeeperLink
from elector.daemon.execmode.proctree import AwaitedChildren, Proc
from elector.daemon.execmode.supervisor import ChildExit, ChildSupervisor
from elector.daemon.execmode.treestop import TreeStopper
from tests.daemon.execmode.test_keeper import (
    GRACE_S,
    Started,
    keepers,  # noqa: F401 - the fixture
    running,
    start_keeper,
    wait_for_pids,
)
from tests.daemon.execmode.test_stop_and_park import link, supervisor_for
from tests.daemon.execmode.test_supervisor import read_pids, state

#: A command and a grandchild that both exit on TERM.
BOTH_EXIT = "sleep 1000 & echo $! $$ > {d}/tree.pid; wait"


def test_a_keeper_reports_its_tree_gone_only_after_all_of_it_ended(
    keepers: list[Started],  # noqa: F811
    tmp_path: Path,
) -> None:
    # The command exits at once and leaves a child that ignores TERM: the keeper must KILL it
    # after the grace before it may report anything.
    # The command exits only once the child has written its pid: on a loaded machine the keeper
    # could otherwise kill the child (after the grace) before it ever wrote it.
    script = (
        f"sh -c 'trap \"\" TERM; echo $$ > {tmp_path}/left.pid; while :; do sleep 0.05; done' & "
        f"while [ ! -s {tmp_path}/left.pid ]; do sleep 0.01; done; exit 0"
    )
    keeper = start_keeper(keepers, tmp_path, script, valid_in_s=3600, grace_s=GRACE_S)
    [leftover] = wait_for_pids(tmp_path / "left.pid", 1)

    assert keeper.process.wait(timeout=30) == 0  # the command's own status
    assert keeper.link.tree_gone()
    assert not running(leftover)


def test_a_keeper_stopped_by_the_groups_term_reports_its_tree_gone(
    keepers: list[Started],  # noqa: F811
    tmp_path: Path,
) -> None:
    keeper = start_keeper(keepers, tmp_path, BOTH_EXIT.format(d=tmp_path), valid_in_s=3600)
    pids = wait_for_pids(tmp_path / "tree.pid", 2)
    assert not keeper.link.tree_gone(), "nothing is reported while the tree runs"

    os.killpg(keeper.process.pid, signal.SIGTERM)  # the supervisor's stop

    assert keeper.process.wait(timeout=30) == -signal.SIGTERM
    assert keeper.link.tree_gone()
    assert not any(running(pid) for pid in pids)


def test_a_killed_keeper_reports_nothing(keepers: list[Started], tmp_path: Path) -> None:  # noqa: F811
    keeper = start_keeper(keepers, tmp_path, BOTH_EXIT.format(d=tmp_path), valid_in_s=3600)
    wait_for_pids(tmp_path / "tree.pid", 2)

    keeper.process.kill()
    keeper.process.wait(timeout=30)

    assert not keeper.link.tree_gone(), "the tree may still run: the daemon must look for itself"


def test_a_keeper_without_its_status_pipe_still_runs_the_command(tmp_path: Path) -> None:
    keeper_link = KeeperLink(valid_until=1e12, kill_grace_s=GRACE_S, margin_s=GRACE_S + 0.1)
    try:
        process = subprocess.Popen(  # an older daemon's spawn: only the control pipe is passed
            keeper_link.argv(["sh", "-c", f"echo $$ > {tmp_path}/tree.pid"]),
            pass_fds=(keeper_link.read_fd,),
            start_new_session=True,
            stdin=subprocess.DEVNULL,
        )
        keeper_link.spawned()
        assert process.wait(timeout=30) == 0
        assert wait_for_pids(tmp_path / "tree.pid", 1)
        assert not keeper_link.tree_gone()
    finally:
        keeper_link.close()


@pytest.mark.parametrize("reported", [True, False], ids=["reported", "not-reported"])
async def test_stop_trusts_the_report_and_scans_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reported: bool
) -> None:
    scans: list[int] = []
    real_tree = TreeStopper.tree

    def counted(self: TreeStopper, run: object) -> list[Proc]:
        scans.append(1)
        return real_tree(self, run)  # type: ignore[arg-type]

    monkeypatch.setattr(TreeStopper, "tree", counted)
    if not reported:
        monkeypatch.setattr(KeeperLink, "tree_gone", lambda self: False)
    exits: list[ChildExit] = []
    supervisor = supervisor_for(tmp_path, exits, grace_s=600.0)
    await supervisor.start(env={}, keeper=link())
    command, grandchild = await read_pids(tmp_path / "pids", count=2)

    result = await asyncio.wait_for(supervisor.stop(), timeout=60)

    assert result is not None and result.stopped_by_us and result.survivors == ()
    assert result.returncode == -signal.SIGTERM and result.signal == signal.SIGTERM
    assert not running(command) and not running(grandchild)
    assert (scans == []) is reported


#: Stands in for a keeper that is slow to exit after its report: on the group's TERM it reports
#: the command's tree gone with the status of a death by SIGTERM, as keeper.py does, and then
#: lives on until SIGUSR1. Writes its pid to READY once its handlers are in place.
LINGERING_KEEPER = """
import os, signal, sys
status_fd, ready = int(sys.argv[1]), sys.argv[2]
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM, signal.SIGUSR1])
with open(ready, "w") as out:
    out.write(f"{os.getpid()}\\n")
signal.sigwait([signal.SIGTERM])
os.write(status_fd, b"status %d\\ngone\\n" % signal.SIGTERM)
signal.sigwait([signal.SIGUSR1])
signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM])
os.kill(os.getpid(), signal.SIGTERM)
"""


class LingeringKeeperLink(KeeperLink):
    def __init__(self, ready: Path) -> None:
        super().__init__(valid_until=1e12, kill_grace_s=600.0, margin_s=600.1)
        self.ready = ready

    def argv(self, command: object) -> list[str]:
        return [sys.executable, "-c", LINGERING_KEEPER, str(self.status_write_fd), str(self.ready)]


async def test_stop_goes_on_at_the_report_and_settle_waits_for_the_keepers_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The release may go out once the tree is gone; the keeper's own exit (milliseconds of a
    # dying interpreter) is not waited for then, but by settle() (the daemon's last act).
    monkeypatch.setattr(supervisor_module, "KILL_REAP_SLACK_S", 60.0)  # settle()'s bound: 10 min
    children = AwaitedChildren()
    exits: list[ChildExit] = []
    supervisor = ChildSupervisor(
        ["true"], kill_grace_s=600.0, on_exit=exits.append, children=children, logger=CapturingLogger()
    )
    await supervisor.start(env={}, keeper=LingeringKeeperLink(tmp_path / "ready"))
    [keeper_pid] = await read_pids(tmp_path / "ready", timeout_s=60)
    let_go = False
    try:
        result = await asyncio.wait_for(supervisor.stop(), timeout=60)

        assert running(keeper_pid), "the stop waited for the keeper's exit"
        assert result is not None and result.stopped_by_us and result.survivors == ()
        assert result.returncode == -signal.SIGTERM and result.signal == signal.SIGTERM
        assert supervisor.idle and exits == []
        settle = asyncio.create_task(supervisor.settle())
        await asyncio.sleep(0.1)
        assert not settle.done(), "settle() returned while the keeper still lives"
        os.kill(keeper_pid, signal.SIGUSR1)
        let_go = True
        await asyncio.wait_for(settle, timeout=60)
    finally:
        # The stand-in lives until SIGUSR1: a failure before it must not leave it running for
        # ever. (Until then it cannot have been reaped, so its pid is still its own.)
        if not let_go:
            with contextlib.suppress(ProcessLookupError):
                os.kill(keeper_pid, signal.SIGKILL)
    assert state(keeper_pid) is None, "settle() returned before the keeper was reaped"
    assert keeper_pid not in children.waited
    assert exits == [], "a stopped run's late exit is not reported as a natural one"
