"""A keeper killed alone (an OOM kill, a SIGKILL): nothing independent of the daemon watches the
command any more, so the daemon kills its whole tree at once, whatever `--on-child-exit` says,
and logs and counts it. Before, the command ran unwatched for the restart back-off, or for the
kill grace with `release`: a daemon frozen then let it run beside the successor's.

The command's grandchild ignores SIGTERM and journals every one it gets, so "killed at once"
is seen on the process itself: it dies without ever having been sent SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import CapturingLogger

from elector.daemon.execmode.keeper import boottime
from elector.daemon.execmode.keeper_link import KeeperLink
from elector.daemon.execmode.supervisor import ChildExit, ChildSupervisor
from tests.daemon.execmode.test_keeper import pids_in, stubborn, terms
from tests.daemon.execmode.test_keeper_two_faults import CHAIN, CHAIN_LENGTH, leaf_writes
from tests.daemon.execmode.test_supervisor import running
from tests.support.daemon import DaemonStarter, wait_until
from tests.support.waiting import until

#: The command: a grandchild that ignores SIGTERM (and journals it), kept in the keeper's group.
SCRIPT = "{stubborn} & echo $$ > {d}/command.pid; wait"


@pytest.fixture(autouse=True)
def kill_what_a_failed_test_left(tmp_path: Path) -> Iterator[None]:
    yield
    for path in tmp_path.rglob("*.pid"):
        for pid in pids_in(path):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def keeper_of(command: int) -> int:
    return os.getpgid(command)  # the command runs in its keeper's group


async def test_the_supervisor_kills_a_lost_keepers_tree_at_once_and_reports_it(tmp_path: Path) -> None:
    exits: list[ChildExit] = []
    logger = CapturingLogger()
    lost: list[int] = []
    supervisor = ChildSupervisor(
        ["sh", "-c", SCRIPT.format(stubborn=stubborn(tmp_path, "g"), d=tmp_path)],
        kill_grace_s=600.0,  # a stop by the grace would take ten minutes
        on_exit=exits.append,
        logger=logger,
        on_keeper_lost=lambda: lost.append(1),
    )
    keeper = KeeperLink(valid_until=boottime() + 3600, kill_grace_s=600.0, margin_s=600.1)
    await supervisor.start(env={}, keeper=keeper)
    await until(lambda: pids_in(tmp_path / "g.pid") and pids_in(tmp_path / "command.pid"), timeout_s=10)
    [grandchild], [command] = pids_in(tmp_path / "g.pid"), pids_in(tmp_path / "command.pid")

    os.kill(keeper_of(command), signal.SIGKILL)

    # No stop() was asked for: the supervisor itself kills the tree, before the caller decides.
    await until(lambda: bool(exits) and not running(grandchild) and not running(command), timeout_s=10)
    [exited] = exits
    assert exited.keeper_lost and not exited.stopped_by_us and exited.signal == signal.SIGKILL
    assert terms(tmp_path, "g") == [], "SIGKILL at once: no SIGTERM, no grace"
    assert lost == [1]
    assert [call for call in logger.calls if call.args == ("keeper_lost",)], logger.calls

    result = await asyncio.wait_for(supervisor.stop(), timeout=30)
    assert result is not None and result.keeper_lost and result.survivors == ()
    assert await asyncio.wait_for(supervisor.stop(), timeout=30) is None, "reported once"


@pytest.mark.parametrize("kill_grace_s", [0.0, 0.3], ids=["kill-now", "after-the-grace"])
async def test_a_keeper_killed_by_our_own_stop_is_not_a_lost_keeper(
    tmp_path: Path, kill_grace_s: float
) -> None:
    """The keeper is in the group the stop SIGKILLs (a `lease_expired` step-down skips the grace,
    a command that ignores SIGTERM outlives it), so it dies before it can report its tree gone.
    That is our kill, not a lost keeper: no ERROR, nothing counted (a loaded soak run logged one
    and counted it, a false alarm for anyone alerting on elector_keeper_lost_total). The stop
    still ends the whole tree."""
    exits: list[ChildExit] = []
    logger = CapturingLogger()
    lost: list[int] = []
    supervisor = ChildSupervisor(
        ["sh", "-c", SCRIPT.format(stubborn=stubborn(tmp_path, "g"), d=tmp_path)],
        kill_grace_s=kill_grace_s,
        on_exit=exits.append,
        logger=logger,
        on_keeper_lost=lambda: lost.append(1),
    )
    keeper = KeeperLink(valid_until=boottime() + 3600, kill_grace_s=600.0, margin_s=600.1)
    await supervisor.start(env={}, keeper=keeper)
    await until(lambda: pids_in(tmp_path / "g.pid") and pids_in(tmp_path / "command.pid"), timeout_s=10)
    [grandchild], [command] = pids_in(tmp_path / "g.pid"), pids_in(tmp_path / "command.pid")

    result = await asyncio.wait_for(supervisor.stop(kill_now=kill_grace_s == 0), timeout=30)
    await asyncio.wait_for(supervisor.settle(), timeout=30)  # the keeper's watcher has run too

    assert result is not None and result.survivors == () and result.stopped_by_us
    assert not running(grandchild) and not running(command)
    assert lost == [] and not result.keeper_lost and exits == []
    events = [call.args[0] for call in logger.calls if call.args]
    assert "keeper_lost" not in events, logger.calls
    assert "keeper_killed_by_stop" in events, logger.calls  # SIGKILL did reach it first


@pytest.mark.usefixtures("seeded")
@pytest.mark.parametrize("policy", ["release", "restart"])
def test_a_keeper_killed_alone_has_its_command_killed_at_once_whatever_the_policy(
    daemon: DaemonStarter, tmp_path: Path, policy: str
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    script = "echo $ELECTOR_FENCING_TOKEN >> {d}/tokens; " + SCRIPT.format(
        stubborn=stubborn(work, "g"), d=work
    )
    # ttl 10 s: the default kill grace is 2 s, longer than the back-off (1 s) and than a loaded
    # machine's scheduling delays.
    a = daemon("a", "--on-child-exit", policy, "--", "sh", "-c", script.format(d=work), ttl="10s")
    wait_until(lambda: bool(pids_in(work / "g.pid") and pids_in(work / "command.pid")), timeout_s=10)
    [grandchild], [command] = pids_in(work / "g.pid"), pids_in(work / "command.pid")

    os.kill(keeper_of(command), signal.SIGKILL)

    wait_until(lambda: not running(grandchild), timeout_s=10)
    assert terms(work, "g") == [], "killed at once: never a SIGTERM, no grace, no back-off first"
    lost = [line for line in a.log_lines() if line.get("event") == "keeper_lost"]
    assert len(lost) == 1, a.logs_text()[-3000:]
    assert "elector_keeper_lost_total 1.0" in a.metrics()
    if policy == "restart":
        # Still leading, the command starts again after its back-off, under the same lease.
        wait_until(lambda: len(pids_in(work / "g.pid")) == 2, timeout_s=10)
        tokens = (work / "tokens").read_text().split()
        assert len(tokens) == 2 and tokens[0] == tokens[1], tokens
        assert a.is_leader()


@pytest.mark.usefixtures("seeded")
def test_a_lost_keepers_escaped_chain_is_killed_whole_by_the_daemon(
    daemon: DaemonStarter, tmp_path: Path
) -> None:
    # 200 levels, each in a session of its own with a live parent: neither the group kill nor the
    # command's death signal reaches them, and one level per scan would outlast the stop's
    # SIGKILL slack (0.1 s), leaving the rest running with nobody watching.
    work = tmp_path / "work"
    work.mkdir()
    program = work / "chain.sh"
    program.write_text(CHAIN)
    prefix = work / "chain"
    command = ("sh", str(program), str(CHAIN_LENGTH), str(prefix), "honour", sys.executable)
    a = daemon("a", "--on-child-exit", "restart", "--", *command, ttl="10s")
    deadline = time.monotonic() + 60
    while len(pids_in(Path(f"{prefix}.pids"))) < CHAIN_LENGTH + 1 or not leaf_writes(Path(f"{prefix}.leaf")):
        assert time.monotonic() < deadline, "the chain was not built in 60 s"
        time.sleep(0.05)
    chain = pids_in(Path(f"{prefix}.pids"))
    (work / "leftover.pid").write_text("\n".join(map(str, chain)))  # killed by the fixture if left

    os.kill(keeper_of(chain[0]), signal.SIGKILL)

    wait_until(lambda: not [pid for pid in chain if running(pid)], timeout_s=20)
    events = [line.get("event") for line in a.log_lines()]
    assert "keeper_lost" in events and "child_tree_survived_kill" not in events, a.logs_text()[-3000:]
