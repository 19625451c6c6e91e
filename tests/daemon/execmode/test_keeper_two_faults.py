"""The keeper against a second fault: its own death, a deadline that passed before the start, and
a chain of escaped processes too long to kill one level per scan.

Uses test_keeper.py's helpers: the keeper is started by the test in the daemon's place.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import structlog
import structlog.testing

from elector.daemon.execmode.keeper import EXIT_CANNOT_START, EXIT_DEADLINE_PASSED, Schedule, boottime
from elector.daemon.execmode.keeper_link import KeeperLink
from elector.daemon.execmode.runner import ExecMode
from elector.daemon.execmode.supervisor import AwaitedChildren
from elector.daemon.settings import ExecSettings
from elector.election import ElectionStatus, State
from elector.lease import Lease
from tests.daemon.execmode.test_keeper import (  # noqa: F401 - keepers is a fixture
    NOISE_S,
    Started,
    gone_at,
    keepers,
    park_keeper,
    pids_in,
    running,
    start_keeper,
    stubborn,
    wait_for_pids,
)
from tests.support.waiting import until

# -- the keeper's death --------------------------------------------------------------------------


def test_the_command_dies_with_its_keeper(keepers: list[Started], tmp_path: Path) -> None:  # noqa: F811
    # The command ignores SIGTERM and the deadline is a minute away: only PR_SET_PDEATHSIG,
    # armed between the keeper's fork and the exec, can end it when the keeper is SIGKILLed alone.
    keeper = start_keeper(keepers, tmp_path, f"exec {stubborn(tmp_path, 'c')}", valid_in_s=60)
    [command] = wait_for_pids(tmp_path / "c.pid", 1)
    assert os.getppid() != command and os.getpgid(command) == keeper.process.pid

    os.kill(keeper.process.pid, signal.SIGKILL)

    gone_at([command], timeout_s=NOISE_S)


# -- never a start after the deadline ------------------------------------------------------------


def assert_refused(keeper: Started, started: Path) -> None:
    assert keeper.process.wait(timeout=10) == EXIT_DEADLINE_PASSED, keeper.log_text()
    assert not started.exists(), "the command ran after its deadline"
    assert "keeper_deadline_passed" in keeper.log_text()
    assert keeper.link.deadline_passed() and keeper.link.tree_gone(), (
        "the daemon is told why, and that nothing runs"
    )


def test_a_keeper_given_a_past_validity_end_starts_nothing(keepers: list[Started], tmp_path: Path) -> None:  # noqa: F811
    keeper = start_keeper(keepers, tmp_path, f"touch {tmp_path}/started", valid_in_s=-0.5)
    assert_refused(keeper, tmp_path / "started")


def test_a_parked_keeper_thawed_after_its_orders_deadline_starts_nothing(
    keepers: list[Started],  # noqa: F811
    tmp_path: Path,
) -> None:
    keeper = park_keeper(keepers, tmp_path, f"touch {tmp_path}/started")
    time.sleep(0.3)  # parked, waiting on its pipe
    os.kill(keeper.process.pid, signal.SIGSTOP)  # a frozen pod, or a loaded machine
    try:
        assert keeper.link.launch(valid_until=boottime() + 0.2, env=dict(os.environ))
        time.sleep(0.6)
    finally:
        os.kill(keeper.process.pid, signal.SIGCONT)
    assert_refused(keeper, tmp_path / "started")


def test_a_keeper_with_a_live_validity_end_still_starts_the_command(
    keepers: list[Started],  # noqa: F811
    tmp_path: Path,
) -> None:
    keeper = start_keeper(keepers, tmp_path, f"touch {tmp_path}/started", valid_in_s=30)
    assert keeper.process.wait(timeout=10) == 0, keeper.log_text()
    assert (tmp_path / "started").exists() and not keeper.link.deadline_passed()


def test_a_keeper_that_cannot_exec_the_command_says_nothing_runs(tmp_path: Path) -> None:
    # Not a lost keeper: the daemon must not kill anything, nor count it, for a command that never ran.
    link = KeeperLink(valid_until=boottime() + 60, kill_grace_s=0.3, margin_s=0.4)
    program = tmp_path / "not-executable"
    program.write_text("#!/bin/sh\n")
    try:
        process = subprocess.Popen(
            link.argv([str(program)]), pass_fds=link.pass_fds, start_new_session=True,
            stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        link.spawned()
        _, stderr = process.communicate(timeout=10)
        assert process.returncode == EXIT_CANNOT_START, stderr
        assert b"keeper_cannot_start" in stderr and b"Permission denied" in stderr
        assert link.tree_gone() and not link.deadline_passed()
    finally:
        link.close()


# -- a chain of escaped processes ----------------------------------------------------------------

#: Each level leaves the session (setsid, no fork: a background job is no group leader), starts
#: the next and waits for it, so every parent lives; the leaf journals CLOCK_BOOTTIME readings.
CHAIN = textwrap.dedent(
    """\
    echo $$ >> "$2.pids"
    [ "$3" = ignore ] && trap '' TERM
    if [ "$1" -gt 0 ]; then
        setsid sh "$0" $(($1 - 1)) "$2" "$3" "$4" &
        wait
    else
        exec "$4" -c '
    import os, sys, time
    fd = os.open(sys.argv[1] + ".leaf", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    while True:
        os.write(fd, b"%r\\n" % time.clock_gettime(time.CLOCK_BOOTTIME))
        time.sleep(0.005)
    ' "$2"
    fi
    """
)
CHAIN_LENGTH = 200


def leaf_writes(path: Path) -> list[float]:
    text = path.read_text() if path.exists() else ""
    return [float(line) for line in text.splitlines()[:-1]]  # the last line may be torn


def start_chain(
    keepers: list[Started],  # noqa: F811
    tmp_path: Path,
    *,
    ignore_term: bool,
) -> tuple[Started, list[int], Path]:
    """A chain of CHAIN_LENGTH setsid'd levels under a keeper that gets no renewal; (the keeper,
    every pid of the chain, the leaf's journal) once the leaf writes."""
    program = tmp_path / "chain.sh"
    program.write_text(CHAIN)
    prefix = tmp_path / "chain"
    mode = "ignore" if ignore_term else "honour"
    # Long enough to build the chain on a loaded machine; renewed until it is built.
    keeper = start_keeper(
        keepers, tmp_path, f"exec sh {program} {CHAIN_LENGTH} {prefix} {mode} {sys.executable}",
        valid_in_s=5.0, grace_s=1.0,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while len(pids_in(Path(f"{prefix}.pids"))) < CHAIN_LENGTH + 1 or not leaf_writes(Path(f"{prefix}.leaf")):
        assert time.monotonic() < deadline, (
            f"the chain was not built in 60 s: {len(pids_in(Path(f'{prefix}.pids')))}"
        )
        assert keeper.link.send(boottime() + 5.0)
        time.sleep(0.05)
    chain = pids_in(Path(f"{prefix}.pids"))
    sessions = {os.getsid(pid) for pid in chain if running(pid)}
    assert len(sessions) == CHAIN_LENGTH + 1, "each level leads a session of its own"
    for pid in chain[1:]:
        # The pids file is appended by each level right after its parent started it.
        with open(f"/proc/{pid}/stat") as stat:
            ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
        assert running(ppid) and ppid != keeper.process.pid, "its parent lives, and is not the keeper"
    (tmp_path / "leftover.pid").write_text("\n".join(map(str, chain)))  # killed by the fixture if left
    return keeper, chain, Path(f"{prefix}.leaf")


def test_a_chain_of_escaped_processes_that_honour_term_is_gone_before_the_deadline(
    keepers: list[Started],  # noqa: F811
    tmp_path: Path,
) -> None:
    keeper, chain, _ = start_chain(keepers, tmp_path, ignore_term=False)
    assert keeper.link.valid_until is not None
    schedule = Schedule(
        valid_until=keeper.link.valid_until,
        kill_grace_s=keeper.link.kill_grace_s,
        margin_s=keeper.link.margin_s,
    )

    dead_at = gone_at(chain, timeout_s=60)

    # One pass reached the whole chain with SIGTERM, a grace before the deadline: none of it is
    # left for SIGKILL (one level per scan, SIGTERM only reached the first level).
    assert dead_at < schedule.deadline, f"{dead_at - schedule.deadline:.3f}s past the deadline"


def test_a_chain_of_escaped_processes_that_ignore_term_is_killed_in_one_pass(
    keepers: list[Started],  # noqa: F811
    tmp_path: Path,
) -> None:
    keeper, chain, leaf = start_chain(keepers, tmp_path, ignore_term=True)
    assert keeper.link.valid_until is not None
    deadline = keeper.link.valid_until + keeper.link.margin_s

    dead_at = gone_at(chain, timeout_s=60)

    last_write = max(leaf_writes(leaf))
    kill_log = [json.loads(line) for line in keeper.log_text().splitlines() if '"keeper_kill"' in line]
    assert kill_log and kill_log[0]["remaining"] >= CHAIN_LENGTH + 1, (
        f"the first SIGKILL pass found the whole chain: {kill_log}"
    )
    # One level per scan took 10 ms (the stop poll) plus a /proc scan per level: >= 2 s for 200.
    # At once, the leaf dies with the first pass, right at the deadline.
    assert last_write < deadline + 1.0, f"the leaf wrote {last_write - deadline:.3f}s past the deadline"
    assert dead_at < deadline + NOISE_S


# -- the daemon says why --------------------------------------------------------------------------


class LateElection:
    """Leading, as far as the status says, with a validity that ended a moment ago: the keeper is
    then given a validity end in the past (a daemon that stalled between the two)."""

    def __init__(self) -> None:
        self.resigned: list[float] = []

    def status(self) -> ElectionStatus:
        return ElectionStatus(
            lock="jobs", identity="a", state=State.LEADER, is_leader=True, holder=None,
            fencing_token=7, lease_remaining_s=-0.5, started=True, last_backend_ok_at=None,
            cycle_due_by=None, backend_up=True, now=boottime(),
        )  # fmt: skip

    def resign(self, *, stand_back_s: float) -> None:
        self.resigned.append(stand_back_s)


async def test_the_daemon_logs_why_a_keeper_started_nothing(tmp_path: Path) -> None:
    settings = ExecSettings(command=("touch", str(tmp_path / "started")), kill_grace_s=0.3)
    exec_mode = ExecMode(
        settings, log=structlog.get_logger("test"), request_exit=lambda code: None,
        children=AwaitedChildren(), keeper_margin_s=0.3, park_keeper=False,
    )  # fmt: skip
    election = LateElection()
    exec_mode.attach(election)
    lease = Lease(lock="jobs", identity="a", fencing_token=7, ttl_ms=60_000, value="secret")
    try:
        with structlog.testing.capture_logs() as logs:
            await exec_mode.on_started_leading(lease)
            await until(lambda: election.resigned, timeout_s=10)
        [refused] = [entry for entry in logs if entry["event"] == "command_not_started"]
        assert refused["reason"] == "deadline_passed" and refused["exit_code"] == EXIT_DEADLINE_PASSED
        assert not (tmp_path / "started").exists()
    finally:
        await exec_mode.close()
