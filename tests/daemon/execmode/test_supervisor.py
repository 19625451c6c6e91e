"""ChildSupervisor and OrphanReaper against real processes (sh, sleep, setsid): no mocks.

Children write their pids to files under tmp_path, so that the tests can check every process
of the tree. Without a subreaper, orphans go to PID 1, which may never reap them (it does not in
some sandboxes): in this process "gone" therefore means "no longer running" (absent or a zombie).
Becoming a subreaper cannot be undone, so the tests that need it run SCENARIOS in a fresh Python
process, which writes its findings as JSON; there, gone means absent from /proc (reaped).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import CapturingLogger

from elector.daemon.execmode.keeper import boottime
from elector.daemon.execmode.keeper_link import KeeperLink
from elector.daemon.execmode.supervisor import (
    KILL_REAP_SLACK_S,
    ChildExit,
    ChildStartError,
    ChildSupervisor,
    stop_budget_s,
)
from elector.daemon.execmode.treestop import dying
from tests.support.waiting import until

REPO = Path(__file__).resolve().parents[3]
GRACE_S = 0.5
# The bound on stop() is the budget plus event-loop and /proc polling noise.
NOISE_S = 0.25


def state(pid: int) -> str | None:
    """The process's state letter (R, S, D, Z...), None once it is reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return stat[stat.rindex(")") + 2 :].split()[0]


def running(pid: int) -> bool:
    """Whether `pid` can still run its own code: not gone, a zombie, exiting or with a SIGKILL
    pending (treestop.dying), which is all a stop promises. On a loaded machine a SIGKILLed
    process can stay in the table past stop()'s reap slack, and is then no survivor (loaded run
    #35 saw one still there after stop() returned)."""
    return not dying(pid)


def complete_lines(path: Path) -> list[int]:
    """The pids in `path`, ignoring a line still being written."""
    try:
        lines = path.read_text().splitlines(keepends=True)
    except FileNotFoundError:
        return []
    return [int(line) for line in lines if line.endswith("\n")]


async def read_pids(path: Path, *, count: int = 1, timeout_s: float = 5.0) -> list[int]:
    """Wait until `path` holds `count` pids, one a line."""
    deadline = time.monotonic() + timeout_s
    while len(pids := complete_lines(path)) < count:
        assert time.monotonic() < deadline, f"{path} did not get {count} pid(s) within {timeout_s}s"
        await asyncio.sleep(0.01)
    return pids


@pytest.fixture
def exits() -> list[ChildExit]:
    return []


async def assert_died_of(sig: int, result: ChildExit, process: asyncio.subprocess.Process) -> None:
    """The stopped child died of `sig`: as `result` says, or, when stop() returned before its exit
    was reported (`ChildExit.returncode` None, as documented: on a loaded machine a SIGKILLed child
    may still be dying after the reap slack, and Python 3.11's watcher thread may report it later
    still), as asyncio reports it next."""
    if result.returncode is None:
        assert result.signal is None, result
        returncode = await asyncio.wait_for(process.wait(), timeout=30)  # a hang bound
    else:
        assert result.signal == sig, result
        returncode = result.returncode
    assert returncode == -sig, (result, process.returncode)


@pytest.fixture(autouse=True)
def kill_what_a_failed_test_left(tmp_path: Path) -> Iterator[None]:
    """Processes a failing test did not kill would linger: kill the recorded ones, with their group."""
    yield
    files = [path for path in tmp_path.iterdir() if path.is_file() and not path.suffix]
    recorded = [int(word) for path in files for word in path.read_text().split() if word.isdigit()]
    for pid in filter(running, recorded):
        with contextlib.suppress(ProcessLookupError):
            group = os.getpgid(pid)
            if group == os.getpgrp():  # never pytest's own group
                os.kill(pid, signal.SIGKILL)
            else:
                os.killpg(group, signal.SIGKILL)


def shell(script: str, exits: list[ChildExit], *, grace_s: float = GRACE_S) -> ChildSupervisor:
    return ChildSupervisor(
        ["sh", "-c", script], kill_grace_s=grace_s, on_exit=exits.append, logger=CapturingLogger()
    )


async def timed_stop(supervisor: ChildSupervisor) -> tuple[ChildExit | None, float]:
    started = time.monotonic()
    result = await supervisor.stop()
    return result, time.monotonic() - started


async def test_stop_ends_the_whole_group_at_once_when_term_is_honoured(
    tmp_path: Path, exits: list[ChildExit]
) -> None:
    pids = tmp_path / "pids"
    supervisor = shell(
        f"sleep 1000 & echo $! >> {pids}; sleep 1000 & echo $! >> {pids}; echo $$ >> {pids}; wait",
        exits,
        grace_s=5.0,
    )
    await supervisor.start(env={})
    group = await read_pids(pids, count=3)
    assert supervisor.running and supervisor.pid == group[2]
    assert all(running(pid) for pid in group)

    result, elapsed_s = await timed_stop(supervisor)

    assert elapsed_s < 1.0, "TERM was honoured: no need to wait for the 5 s grace"
    assert not [pid for pid in group if running(pid)]
    assert result is not None and 0 < result.runtime_s < 2.0
    assert (result.pid, result.returncode, result.signal) == (group[2], -signal.SIGTERM, signal.SIGTERM)
    assert result.stopped_by_us and result.survivors == ()
    assert exits == [], "on_exit is only for exits the daemon did not ask for"
    assert not supervisor.running and supervisor.pid is None
    assert await supervisor.stop() is None


@pytest.mark.parametrize(
    ("script", "child_signal"),
    [
        ("trap '' TERM; echo $$ >> {pids}; sleep 1000", signal.SIGKILL),
        ("sh -c 'trap \"\" TERM; echo $$ >> {pids}; sleep 1000' & echo $$ >> {pids}; wait", signal.SIGTERM),
    ],
    ids=["child", "grandchild"],
)
async def test_a_process_ignoring_term_is_killed_after_the_grace(
    tmp_path: Path,
    exits: list[ChildExit],
    script: str,
    child_signal: int,
    spawned: list[asyncio.subprocess.Process],
) -> None:
    pids = tmp_path / "pids"
    supervisor = shell(script.format(pids=pids), exits)
    await supervisor.start(env={})
    tree = await read_pids(pids, count=script.count("echo $$"))

    result, elapsed_s = await timed_stop(supervisor)

    assert stop_budget_s(GRACE_S) == pytest.approx(GRACE_S + KILL_REAP_SLACK_S)
    assert GRACE_S - 0.02 <= elapsed_s <= stop_budget_s(GRACE_S) + NOISE_S
    assert not [pid for pid in tree if running(pid)]
    assert result is not None and result.stopped_by_us and result.survivors == ()
    [child] = spawned
    await assert_died_of(child_signal, result, child)


async def test_a_member_that_left_the_group_but_not_the_session_is_killed(
    tmp_path: Path, exits: list[ChildExit]
) -> None:
    job_file, child_file, job_script = tmp_path / "job", tmp_path / "child", tmp_path / "job.py"
    # As a job-control shell does with each job: a process group of its own, in the same session.
    job_script.write_text(
        "import os, pathlib, sys, time\n"
        "os.setpgid(0, 0)\n"
        "pathlib.Path(sys.argv[1]).write_text(f'{os.getpid()}\\n')\n"
        "time.sleep(1000)\n"
    )
    supervisor = shell(f"{sys.executable} {job_script} {job_file} & echo $$ > {child_file}; wait", exits)
    await supervisor.start(env={})
    [job], [child] = await read_pids(job_file), await read_pids(child_file)
    assert os.getpgid(job) != os.getpgid(child) and os.getsid(job) == os.getsid(child)

    await supervisor.stop()

    assert not running(job) and not running(child)


@pytest.mark.parametrize(("inherit_env", "inherited"), [(True, "from-daemon"), (False, "")])
async def test_env_is_merged_over_the_daemons_environment_unless_told_not_to(
    tmp_path: Path, exits: list[ChildExit], monkeypatch: pytest.MonkeyPatch, inherit_env: bool, inherited: str
) -> None:
    out = tmp_path / "out"
    supervisor = shell(f'echo "$ELECTOR_TEST_ROLE|$HOME|$ELECTOR_TEST_INHERITED" > {out}', exits)
    monkeypatch.setenv("ELECTOR_TEST_INHERITED", "from-daemon")
    extra = {"ELECTOR_TEST_ROLE": "leader with spaces", "HOME": "/elector-home"}
    await supervisor.start(env=extra, inherit_env=inherit_env)
    await until(lambda: exits)
    await supervisor.stop()

    assert out.read_text() == f"leader with spaces|/elector-home|{inherited}\n"


@pytest.mark.parametrize(
    ("ending", "returncode", "killed_by"),
    [("exit 3", 3, None), ("kill -USR1 $$", -signal.SIGUSR1, signal.SIGUSR1)],
    ids=["exit-status", "signal"],
)
async def test_a_natural_exit_is_reported_once_and_stop_then_kills_the_leftovers(
    tmp_path: Path, exits: list[ChildExit], ending: str, returncode: int, killed_by: int | None
) -> None:
    leftover = tmp_path / "leftover"
    supervisor = shell(f"sleep 1000 & echo $! > {leftover}; sleep 0.05; {ending}; sleep 5", exits)
    await supervisor.start(env={})
    await until(lambda: exits)
    await asyncio.sleep(0.05)

    [reported] = exits
    assert (reported.returncode, reported.signal, reported.stopped_by_us) == (returncode, killed_by, False)
    assert 0.04 <= reported.runtime_s < 2.0
    assert not supervisor.running and supervisor.pid is None
    [grandchild] = await read_pids(leftover)
    assert running(grandchild), "a natural exit does not kill the leftovers by itself"

    result, elapsed_s = await timed_stop(supervisor)

    assert not running(grandchild)
    assert elapsed_s < GRACE_S, "the leftover obeyed TERM"
    assert result == reported, "stop() reports the same run, with no survivors"
    assert len(exits) == 1
    assert await supervisor.stop() is None


async def test_a_child_exiting_during_stop_is_not_reported_to_on_exit(
    tmp_path: Path, exits: list[ChildExit]
) -> None:
    pid_file = tmp_path / "pid"
    supervisor = shell(f"trap 'exit 5' TERM; echo $$ > {pid_file}; while :; do sleep 0.02; done", exits)
    await supervisor.start(env={})
    await read_pids(pid_file)

    result = await supervisor.stop()

    assert result is not None and result.returncode == 5 and result.signal is None
    assert result.stopped_by_us
    await asyncio.sleep(0.05)
    assert exits == []


async def test_concurrent_stops_share_one_stop_that_a_cancelled_caller_does_not_abort(
    tmp_path: Path, exits: list[ChildExit]
) -> None:
    pid_file = tmp_path / "pid"
    supervisor = shell(f"trap '' TERM; echo $$ > {pid_file}; sleep 1000", exits, grace_s=0.2)
    await supervisor.start(env={})
    [pid] = await read_pids(pid_file)

    with pytest.raises(TimeoutError):
        await asyncio.wait_for(supervisor.stop(), timeout=0.05)
    first, second = await asyncio.gather(supervisor.stop(), supervisor.stop())

    assert first is second and first is not None and first.signal == signal.SIGKILL
    assert not running(pid)
    assert await supervisor.stop() is None


async def test_a_restart_after_a_natural_exit_first_kills_the_leftovers(
    tmp_path: Path, exits: list[ChildExit]
) -> None:
    leftover = tmp_path / "leftover"
    supervisor = shell(f"sleep 1000 & echo $! >> {leftover}; exit 0", exits)
    await supervisor.start(env={})
    await until(lambda: exits)
    [first_grandchild] = await read_pids(leftover)

    await supervisor.start(env={})

    assert not running(first_grandchild), "the new run does not overlap the old one's leftovers"
    assert supervisor.running
    _, second_grandchild = await read_pids(leftover, count=2)
    assert running(second_grandchild)
    await supervisor.stop()
    assert not running(second_grandchild)


async def test_a_stop_during_a_start_wins_and_nothing_is_left_running(
    tmp_path: Path, exits: list[ChildExit]
) -> None:
    started = tmp_path / "started"
    supervisor = shell(f"echo $$ >> {started}; sleep 1000", exits)
    starting = asyncio.create_task(supervisor.start(env={}))
    await asyncio.sleep(0)  # the start is under way, its child not known yet
    with pytest.raises(RuntimeError, match="stop"):  # a second start is refused
        await supervisor.start(env={})

    await supervisor.stop()

    assert await starting is False, "a start that had not spawned yet does not spawn"
    await asyncio.sleep(0.3)
    assert complete_lines(started) == [] and not supervisor.running


async def test_a_stop_while_the_spawn_is_under_way_stops_what_it_started(exits: list[ChildExit]) -> None:
    supervisor = shell("sleep 1000", exits)
    stopping: list[asyncio.Task[ChildExit | None]] = []

    def stop_right_before_the_spawn() -> bool:
        stopping.append(asyncio.create_task(supervisor.stop()))  # runs while the spawn awaits
        return True

    assert await supervisor.start(env={}, still_wanted=stop_right_before_the_spawn) is True
    result = await stopping[0]

    assert result is not None and result.stopped_by_us and result.signal == signal.SIGTERM
    assert not running(result.pid) and not supervisor.running


async def test_a_kill_now_stop_cuts_short_a_restart_cleaning_up_leftovers_and_nothing_starts(
    tmp_path: Path, exits: list[ChildExit]
) -> None:
    # The race of --on-child-exit restart: the restart's start() is waiting out the grace for a
    # leftover that ignores TERM when the lease is lost. The stop must not wait for that grace,
    # nor for another one, and no new command may start (it would carry the old token).
    leftover, started = tmp_path / "leftover", tmp_path / "started"
    script = f"echo $$ >> {started}; sh -c 'trap \"\" TERM; echo $$ >> {leftover}; exec sleep 1000' & exit 0"
    supervisor = shell(script, exits, grace_s=30.0)
    await supervisor.start(env={})
    await until(lambda: exits)
    [stubborn] = await read_pids(leftover)
    restarting = asyncio.create_task(supervisor.start(env={}))
    await asyncio.sleep(0.3)  # the restart sent TERM to the leftover and waits out the grace
    assert running(stubborn) and not restarting.done()

    result, elapsed_s = await timed_stop_now(supervisor)

    assert await restarting is False
    assert not running(stubborn) and result is not None and result.survivors == ()
    assert elapsed_s < 10.0, "killed at once, not after the 30 s grace"
    await asyncio.sleep(0.3)
    assert len(complete_lines(started)) == 1, "the restart did not start a new command"


async def timed_stop_now(supervisor: ChildSupervisor) -> tuple[ChildExit | None, float]:
    began = time.monotonic()
    result = await supervisor.stop(kill_now=True)
    return result, time.monotonic() - began


async def test_kill_now_skips_the_grace(tmp_path: Path, exits: list[ChildExit]) -> None:
    pids = tmp_path / "pids"
    supervisor = shell(f"trap 'echo term >> {tmp_path}/terms' TERM; echo $$ >> {pids}; sleep 1000", exits,
                       grace_s=30.0)  # fmt: skip
    await supervisor.start(env={})
    [pid] = await read_pids(pids)

    result, elapsed_s = await timed_stop_now(supervisor)

    assert result is not None
    if result.survivors:
        # LOOSENED for a loaded machine (a fresh-clone CI run saw it): SIGKILLed, the child can
        # still be runnable when stop()'s 0.1 s reap slack runs out. stop() then reports it as a
        # survivor (which withholds the release: safe), and it must die of the SIGKILL soon after.
        assert result.survivors == (pid,), result
        await until(lambda: not running(pid), timeout_s=10)
    else:
        # No signal when the SIGKILL reached the child but its exit was not seen by the slack's
        # end (dying, so no survivor: see running()).
        assert result.signal in (signal.SIGKILL, None) and not running(pid), result
    assert not (tmp_path / "terms").exists(), "no SIGTERM first"
    assert elapsed_s < 10.0, "not the 30 s grace"


@pytest.mark.parametrize(
    ("program", "message"),
    [("elector-no-such-command", "No such file"), ("job.sh", "Permission denied")],
    ids=["not-found", "not-executable"],
)
async def test_a_command_that_cannot_run_is_a_start_error(
    tmp_path: Path, exits: list[ChildExit], program: str, message: str
) -> None:
    (tmp_path / "job.sh").write_text("#!/bin/sh\nexit 0\n")  # not executable
    command = program if program.startswith("elector") else str(tmp_path / program)
    supervisor = ChildSupervisor([command], kill_grace_s=1.0, on_exit=exits.append)

    with pytest.raises(ChildStartError, match=rf"{program}'.*{message}"):
        await supervisor.start(env={})

    assert not supervisor.running and await supervisor.stop() is None
    with pytest.raises(ChildStartError):  # and the supervisor is still usable
        await supervisor.start(env={})


async def test_an_on_exit_that_raises_is_logged_not_fatal(exits: list[ChildExit]) -> None:
    logger = CapturingLogger()

    def broken(exit_: ChildExit) -> None:
        exits.append(exit_)
        raise ValueError("daemon bug")

    supervisor = ChildSupervisor(["true"], kill_grace_s=1.0, on_exit=broken, logger=logger)
    await supervisor.start(env={})
    await until(lambda: any(call.args == ("child_on_exit_failed",) for call in logger.calls))

    assert len(exits) == 1
    result, elapsed_s = await timed_stop(supervisor)
    # Immediate: not the 1 s grace of a group still to be ended (a fixed 0.1 s was loop-load luck).
    assert result == exits[0] and elapsed_s < 1.0, "nothing left: stop() after a clean exit is immediate"


@pytest.mark.parametrize("grace_s", [-1.0, float("nan"), float("inf")])
def test_a_bad_grace_or_empty_command_is_refused(grace_s: float) -> None:
    with pytest.raises(ValueError, match="kill_grace_s"):
        ChildSupervisor(["true"], kill_grace_s=grace_s, on_exit=lambda _: None)
    with pytest.raises(ValueError, match="empty"):
        ChildSupervisor([], kill_grace_s=1.0, on_exit=lambda _: None)


# -- Subreaper and reaper: in a fresh process each, as becoming a subreaper is permanent. -------

SCENARIOS = """
import asyncio, contextlib, json, os, subprocess, sys, time
from pathlib import Path
from elector.daemon.execmode.supervisor import (
    AwaitedChildren, ChildSupervisor, OrphanReaper, become_subreaper,
)
from elector.daemon.execmode.treestop import dying

TMP = Path(sys.argv[2])
#: One registry for the process, as the daemon wires it: the reaper never takes the supervisor's.
CHILDREN = AwaitedChildren()
ME = os.getpid()


def stat(pid):  # [state, ppid, ...], None once reaped
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return text[text.rindex(")") + 2 :].split()


async def until(predicate):
    for _ in range(500):
        if predicate():
            return True
        await asyncio.sleep(0.01)
    return False


async def pid_in(name):
    path = TMP / name
    assert await until(lambda: path.exists() and path.read_text().endswith("\\n")), name
    return int(path.read_text())


def supervise(script, exits):
    return ChildSupervisor(["sh", "-c", script], kill_grace_s=0.5, on_exit=exits.append, children=CHILDREN)


async def escaped_daemon():
    # The daemon double-forks out of the child's session (and ignores TERM): only its
    # reparenting to us can find it.
    subreaper, exits = become_subreaper(), []
    supervisor = supervise(
        f"(setsid sh -c 'trap \\"\\" TERM; echo $$ > {TMP}/daemon; exec sleep 1000' &); sleep 1000", exits
    )
    await supervisor.start(env={})
    daemon = await pid_in("daemon")
    reparented = await until(lambda: int(stat(daemon)[1]) == ME)
    left_session = os.getsid(daemon) != os.getsid(supervisor.pid)
    started = time.monotonic()
    result = await supervisor.stop()
    elapsed_s = time.monotonic() - started
    daemon_stat = stat(daemon)
    dying_after = dying(daemon)
    # A survivor stop() reported (SIGKILLed, still runnable after the slack on a loaded machine)
    # must die of it soon: we are its subreaper, so reap it here once it is a zombie.
    def gone():
        with contextlib.suppress(ChildProcessError):
            os.waitpid(daemon, os.WNOHANG)
        return stat(daemon) is None
    return dict(subreaper=subreaper, reparented=reparented, left_session=left_session, elapsed_s=elapsed_s,
                daemon=daemon, daemon_stat=daemon_stat, dying_after=dying_after, gone_after=await until(gone),
                signal=result.signal,
                survivors=list(result.survivors), exits=len(exits))


async def leftover_orphan():
    # The child exits; its grandchild, reparented to us, is killed and reaped by stop().
    become_subreaper()
    exits = []
    supervisor = supervise(f"sleep 1000 & echo $! > {TMP}/leftover; exit 0", exits)
    await supervisor.start(env={})
    leftover = await pid_in("leftover")
    await until(lambda: exits)
    reparented = await until(lambda: int(stat(leftover)[1]) == ME)
    result = await supervisor.stop()
    return dict(reparented=reparented, leftover_stat=stat(leftover), returncode=result.returncode,
                survivors=result.survivors)


async def reaper():
    become_subreaper()
    # A direct child its owner waits for later, by pid: excluded, so the reaper leaves it.
    other = subprocess.Popen(["sh", "-c", "exit 4"])
    # A sweep interval far beyond the test: reaping within it proves SIGCHLD drives the reaper.
    async with OrphanReaper(sweep_interval_s=60, exclude=lambda: other.pid, children=CHILDREN) as reaper:
        exits = []
        supervisor = supervise(f"sh -c 'echo $$ > {TMP}/orphan; sleep 0.2' & exit 0", exits)
        await supervisor.start(env={})
        orphan = await pid_in("orphan")
        reaped = await until(lambda: exits and stat(orphan) is None)
        await supervisor.stop()
        # Children that exit at once while their orphans' SIGCHLDs make the reaper sweep: it must
        # never take their exit status from asyncio (which would then report 255).
        returncodes = []
        for _ in range(15):
            exits.clear()
            quick = supervise("sleep 0 & exit 7", exits)
            await quick.start(env={})
            await until(lambda: exits)
            returncodes.append((await quick.stop()).returncode)
        await asyncio.sleep(0.1)
        other_returncode = other.wait(timeout=1)
        zombies = [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
                   if (fields := stat(pid)) and fields[0] == "Z" and int(fields[1]) == ME]
        return dict(uses_sigchld=reaper.uses_sigchld, orphan_reaped=reaped, reaped_total=reaper.reaped_total,
                    returncodes=returncodes, other_returncode=other_returncode, zombies=zombies)


async def no_theft():
    # The pidfd watcher (3.12's default) reaps in the event loop: with the loop blocked, the child
    # stays an unreaped zombie, just what a careless reaper would take.
    if sys.version_info < (3, 12):
        watcher = asyncio.PidfdChildWatcher()
        watcher.attach_loop(asyncio.get_running_loop())
        asyncio.set_child_watcher(watcher)
    exits = []
    supervisor = supervise("sleep 0.1; exit 6", exits)
    await supervisor.start(env={})
    time.sleep(0.3)
    child_state = stat(supervisor.pid)[0]
    swept = OrphanReaper(sweep_interval_s=60, children=CHILDREN).sweep()
    await until(lambda: exits)
    await supervisor.stop()
    return dict(child_state=child_state, swept=swept, returncode=exits[0].returncode)


async def scan_only_for_zombies():
    # The /proc scan of a sweep (every process's stat) runs only when some child is a zombie.
    import elector.daemon.execmode.reaper as reaper_module
    scans, real = [], reaper_module.all_procs
    reaper_module.all_procs = lambda **kw: scans.append(1) or real(**kw)
    child = subprocess.Popen(["sleep", "5"])
    reaper = OrphanReaper(sweep_interval_s=60, exclude=lambda: child.pid, children=CHILDREN)
    swept_running = reaper.sweep()
    scans_running = len(scans)
    child.kill()
    zombie = await until(lambda: (stat(child.pid) or ["?"])[0] == "Z")
    swept_zombie = reaper.sweep()
    scans_zombie = len(scans) - scans_running
    returncode = child.wait(timeout=1)
    return dict(swept_running=swept_running, scans_running=scans_running, zombie=zombie,
                swept_zombie=swept_zombie, scans_zombie=scans_zombie, returncode=returncode)


(TMP / "result.json").write_text(json.dumps(asyncio.run(globals()[sys.argv[1]]())))
"""


def run_scenario(name: str, tmp_path: Path) -> dict[str, Any]:
    script = tmp_path / "scenarios.py"
    script.write_text(SCENARIOS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    # Output to a file, not a pipe: a process the scenario failed to kill would hold a pipe open.
    with (tmp_path / "stderr.log").open("w+") as stderr:
        command = [sys.executable, str(script), name, str(tmp_path)]
        done = subprocess.run(command, stdout=stderr, stderr=stderr, timeout=20, env=env, check=False)
        stderr.seek(0)
        assert done.returncode == 0, stderr.read()
    result: dict[str, Any] = json.loads((tmp_path / "result.json").read_text())
    return result


def test_a_daemon_that_escaped_the_session_is_killed_and_reaped(tmp_path: Path) -> None:
    found = run_scenario("escaped_daemon", tmp_path)

    assert found["subreaper"] and found["reparented"] and found["left_session"]
    # Killed, and reaped: no zombie left. Or, on a loaded machine, still there when stop()'s reap
    # slack (0.1 s) ran out: then stop() reports it as a survivor (which withholds the release:
    # the lease lapses instead) unless the SIGKILL already reached it (pending, exiting, a zombie:
    # treestop.dying, so it can never run its own code again), and it must die of the SIGKILL soon
    # after. Each outcome is safe; a kill that did not happen, or a live process not reported, fails.
    # (Loaded run #35: still there, dying, not reported; the test predated treestop.dying.)
    if found["daemon_stat"] is None:
        assert found["survivors"] == []
    else:
        reported, was_dying = found["survivors"] == [found["daemon"]], found["dying_after"]
        assert reported or (found["survivors"] == [] and was_dying), found
        assert found["gone_after"], "a process still there after stop() that the SIGKILL did not end"
    assert GRACE_S - 0.02 <= found["elapsed_s"] <= stop_budget_s(GRACE_S) + NOISE_S, "it ignored TERM"
    assert found["signal"] == signal.SIGTERM
    assert found["exits"] == 0


def test_a_leftover_reparented_to_us_is_killed_and_reaped_by_stop(tmp_path: Path) -> None:
    found = run_scenario("leftover_orphan", tmp_path)

    assert found["reparented"] and found["leftover_stat"] is None, "killed, and reaped: no zombie left"
    assert found["returncode"] == 0 and found["survivors"] == []


def test_the_reaper_reaps_orphans_on_sigchld_and_never_a_supervised_child(tmp_path: Path) -> None:
    found = run_scenario("reaper", tmp_path)

    assert found["uses_sigchld"] and found["orphan_reaped"] and found["reaped_total"] >= 1
    assert found["returncodes"] == [7] * 15
    assert found["other_returncode"] == 4, "an excluded child's status is left to its owner"
    assert found["zombies"] == []


def test_the_reaper_leaves_a_supervised_childs_zombie_to_asyncio(tmp_path: Path) -> None:
    found = run_scenario("no_theft", tmp_path)

    assert found["child_state"] == "Z", "the scenario did hold an unreaped child"
    assert found["swept"] == []
    assert found["returncode"] == 6


def test_a_sweep_scans_proc_only_when_a_child_is_a_zombie(tmp_path: Path) -> None:
    # A keeper's exit (SIGCHLD) on a step-down's way to the release must not cost a /proc scan
    # once asyncio has reaped it; a zombie, even an excluded one, still gets the scan.
    found = run_scenario("scan_only_for_zombies", tmp_path)

    assert found["swept_running"] == [] and found["scans_running"] == 0
    assert found["zombie"] and found["scans_zombie"] == 1
    assert found["swept_zombie"] == [], "the excluded child's status is left to its owner"
    assert found["returncode"] == -signal.SIGKILL


# -- Under a keeper (exec mode): the supervisor sees the keeper, and the command's own ending. ---


def keeper_link() -> KeeperLink:
    return KeeperLink(valid_until=boottime() + 60, kill_grace_s=GRACE_S, margin_s=GRACE_S + 0.1)


async def test_under_a_keeper_stop_reports_the_commands_signal_and_leaves_nothing(
    tmp_path: Path, exits: list[ChildExit]
) -> None:
    pids = tmp_path / "pids"
    supervisor = shell(f"sleep 1000 & echo $! >> {pids}; echo $$ >> {pids}; wait", exits, grace_s=5.0)
    assert await supervisor.start(env={}, keeper=keeper_link()) is True
    grandchild, command = await read_pids(pids, count=2)
    keeper = supervisor.pid
    assert keeper is not None and keeper not in (grandchild, command)
    assert os.getpgid(command) == keeper == os.getsid(command)

    result, elapsed_s = await timed_stop(supervisor)

    assert result is not None and result.pid == keeper and result.signal == signal.SIGTERM
    assert result.survivors == () and elapsed_s < 2.0, "TERM honoured: no grace waited out"
    assert not any(running(pid) for pid in (command, grandchild))
    await supervisor.settle()  # the stop went on at the keeper's report, before its own exit
    await until(lambda: not running(keeper), timeout_s=30)  # (settle's wait is bounded)


async def test_under_a_keeper_a_missing_command_is_still_a_start_error(exits: list[ChildExit]) -> None:
    supervisor = ChildSupervisor(["elector-no-such-command"], kill_grace_s=1.0, on_exit=exits.append)
    with pytest.raises(ChildStartError, match=r"elector-no-such-command'.*No such file"):
        await supervisor.start(env={}, keeper=keeper_link())
    assert not supervisor.running


async def test_under_a_keeper_a_natural_exit_reports_the_commands_code(exits: list[ChildExit]) -> None:
    supervisor = shell("exit 5", exits)
    await supervisor.start(env={}, keeper=keeper_link())
    await until(lambda: exits)
    assert exits[0].returncode == 5 and exits[0].signal is None
    assert supervisor.extend_validity(boottime() + 120) is False, "nobody left to tell"
