"""Exec mode end to end: `elector run ... -- COMMAND` with real daemons, commands and Redis.

Each command is a `sh -c` script that records its pid, a grandchild's pid and a journal line
(identity and fencing token), so the tests can check which processes run where, and when.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
import structlog
import structlog.testing

from elector.daemon.execmode.runner import ExecMode, command_backoff
from elector.daemon.execmode.supervisor import AwaitedChildren
from elector.daemon.service import SHUTDOWN_NICE_INCREMENT
from elector.daemon.settings import ChildExitPolicy, ExecSettings
from elector.daemon.testing_hooks import BLOCK_LOOP_ENV
from elector.election import ElectionStatus, State, StepDownReason
from elector.election.clock import boottime
from elector.lease import Lease
from tests.support.daemon import DaemonProcess, DaemonStarter, wait_until
from tests.support.tcp_proxy import TcpProxy

LEASE_KEY = "elector:{jobs}:lease"

#: Writes the journal line, keeps a grandchild (so `sh -c` is not exec-optimised away), waits.
SCRIPT = (
    'echo "start $ELECTOR_IDENTITY $ELECTOR_FENCING_TOKEN $ELECTOR_LEASE_TTL_MS $ELECTOR_LOCK" '
    ">> {dir}/journal; "
    "sleep 1000 & echo $! > {dir}/$ELECTOR_IDENTITY.grandchild; echo $$ > {dir}/$ELECTOR_IDENTITY.child; "
    "wait"
)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        # A zombie still answers kill(0); it no longer runs.
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def pids(directory: Path, identity: str) -> list[int]:
    found = []
    for kind in ("child", "grandchild"):
        path = directory / f"{identity}.{kind}"
        if path.exists() and path.read_text().strip():
            found.append(int(path.read_text()))
    return found


def journal(directory: Path) -> list[list[str]]:
    path = directory / "journal"
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def work(tmp_path: Path) -> Path:
    directory = tmp_path / "work"
    directory.mkdir()
    return directory


@pytest.fixture
def daemon(daemon: DaemonStarter, work: Path) -> Iterator[Callable[..., DaemonProcess]]:
    """The shared `daemon` starter, running a command (SCRIPT by default); its children are killed after."""

    def _start(
        identity: str,
        *extra_args: str,
        script: str = SCRIPT,
        command: tuple[str, ...] | None = None,
        url: str | None = None,
        ttl: str = "1s",
        env: dict[str, str] | None = None,
    ) -> DaemonProcess:
        argv = command if command is not None else ("sh", "-c", script.format(dir=work))
        return daemon(identity, *extra_args, "--", *argv, redis_url=url or daemon.redis_url, ttl=ttl, env=env)

    yield _start
    daemon.stop_all()
    for path in work.glob("*.child"):
        for pid in pids(work, path.stem):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_the_command_runs_only_on_the_leader_with_the_lease_in_its_environment(daemon, seeded, work) -> None:
    # 2 s leases: the premise is that a leads throughout (one journal entry); at 1 s a stall at a
    # load average of 8 can lapse a's lease, and b's command would start from a lapse, not a bug.
    a = daemon("a", ttl="2s")
    wait_until(a.is_leader, timeout_s=3)
    b = daemon("b", ttl="2s")
    wait_until(lambda: len(pids(work, "a")) == 2, timeout_s=3)
    time.sleep(1.5)
    assert all(alive(pid) for pid in pids(work, "a"))
    assert pids(work, "b") == []
    (entry,) = journal(work)
    leader = a.leader()
    assert leader is not None
    assert entry == ["start", "a", str(leader["fencing_token"]), "2000", "jobs"]
    assert not b.is_leader()


def test_sigterm_drains_the_command_releases_and_the_next_command_gets_a_higher_token(
    daemon, seeded, work
) -> None:
    # ttl 3 s: the test needs a to lead until its SIGTERM and b from then on. At 1 s (0.15 s
    # requests) and a load average of 10 (`make test-loaded`, run #21) a third term came in
    # between (three journal entries), which is no drain's doing.
    a = daemon("a", ttl="3s")
    wait_until(lambda: len(pids(work, "a")) == 2, timeout_s=10)
    b = daemon("b", ttl="3s")
    a_pids = pids(work, "a")
    a.signal(signal.SIGTERM)
    assert a.wait() == 0
    assert not any(alive(pid) for pid in a_pids)  # gone before the daemon exited
    wait_until(lambda: len(pids(work, "b")) == 2, timeout_s=10)
    first, second = journal(work)
    assert (first[1], second[1]) == ("a", "b")
    assert int(second[2]) > int(first[2])
    assert b.is_leader()


def parked_keepers(daemon_pid: int) -> list[int]:
    """The daemon's children that are keepers waiting for a start order."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError):
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == daemon_pid and b"\0--parked\0" in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
    return found


def test_a_follower_keeps_a_keeper_parked_and_the_takeover_runs_the_command_under_it(
    daemon, seeded, work
) -> None:
    a = daemon("a")
    wait_until(lambda: len(pids(work, "a")) == 2, timeout_s=3)
    b = daemon("b")
    assert a.process is not None and b.process is not None
    wait_until(lambda: parked_keepers(b.process.pid), timeout_s=5)
    parked = parked_keepers(b.process.pid)
    assert len(parked) == 1, "one parked keeper"
    assert parked_keepers(a.process.pid) == [], "the leader's keeper runs the command: none is parked"

    a.signal(signal.SIGTERM)
    assert a.wait() == 0

    wait_until(lambda: len(pids(work, "b")) == 2, timeout_s=3)
    command = pids(work, "b")[0]
    assert os.getsid(command) == parked[0], "the command runs under the parked keeper"
    first, second = journal(work)
    assert second[1] == "b" and int(second[2]) > int(first[2]), "with the new term's token"
    b.signal(signal.SIGTERM)
    assert b.wait() == 0
    assert not alive(command)
    # The daemon waited for its keeper's exit after the release, within a bound (see settle()).
    wait_until(lambda: not alive(parked[0]), timeout_s=10)


def nice_of(pid: int) -> int:
    """The niceness of the process's main thread (its event loop's)."""
    return int(Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def test_once_its_lease_is_released_the_daemon_steps_back_on_the_cpu(daemon, seeded, work) -> None:
    # The rest of a shutdown (and the exit) is not urgent; a successor's start on the same host is.
    a = daemon("a", "--shutdown-linger", "60s")
    wait_until(lambda: len(pids(work, "a")) == 2, timeout_s=3)
    assert a.process is not None
    leading_nice = nice_of(a.process.pid)

    a.signal(signal.SIGTERM)
    wait_until(lambda: a.logged_at("lingering") is not None, timeout_s=10)

    assert a.logged_at("released") is not None
    assert nice_of(a.process.pid) == min(19, leading_nice + SHUTDOWN_NICE_INCREMENT)
    a.signal(signal.SIGTERM)
    assert a.wait() == 0


def test_a_followers_parked_keeper_ends_with_the_daemon(daemon, seeded, work) -> None:
    daemon("a")
    wait_until(lambda: len(pids(work, "a")) == 2, timeout_s=3)
    b = daemon("b")
    assert b.process is not None
    wait_until(lambda: parked_keepers(b.process.pid), timeout_s=5)
    [parked] = parked_keepers(b.process.pid)

    b.signal(signal.SIGTERM)

    assert b.wait() == 0
    assert not alive(parked)
    assert pids(work, "b") == [], "a parked keeper never starts the command by itself"
    assert "keeper_bad_start" not in b.logs_text()


async def test_a_cut_redis_link_kills_the_command_and_grandchildren_before_the_lease_expires(
    daemon, seeded, work, tcp_proxy: TcpProxy, redis_url: str
) -> None:
    a = await asyncio.to_thread(daemon, "a", url=tcp_proxy.url, ttl="2s")
    for _ in range(300):
        if len(pids(work, "a")) == 2:
            break
        await asyncio.sleep(0.01)
    b = await asyncio.to_thread(daemon, "b", ttl="2s")
    await asyncio.sleep(1.0)
    a_pids = pids(work, "a")
    assert len(a_pids) == 2 and all(alive(pid) for pid in a_pids)

    watcher = redis.Redis.from_url(redis_url)
    tcp_proxy.blackhole()  # no answers, no resets: only the leader's own deadline can save it
    cut_at = time.monotonic()
    # The latest expiry Redis will apply: a renewal already in flight may still land, so look
    # for a little while and keep the latest.
    expiry = 0.0
    for _ in range(20):
        pttl = await asyncio.to_thread(watcher.pttl, LEASE_KEY)
        expiry = max(expiry, time.monotonic() + pttl / 1000)
        await asyncio.sleep(0.005)
    gone_at = None
    while time.monotonic() < cut_at + 4:
        if not any(alive(pid) for pid in a_pids):
            gone_at = time.monotonic()
            break
        await asyncio.sleep(0.002)
    assert gone_at is not None, "the command outlived the lease"
    assert gone_at < expiry, f"command gone {gone_at - expiry:.3f}s after the lease expired"
    # The follower starts its command only after the expiry, with a higher token.
    for _ in range(400):
        if len(pids(work, "b")) == 2:
            break
        await asyncio.sleep(0.01)
    assert len(journal(work)) == 2
    first, second = journal(work)
    assert second[1] == "b" and int(second[2]) > int(first[2])
    assert await asyncio.to_thread(b.is_leader)
    watcher.close()
    tcp_proxy.restore()
    await asyncio.to_thread(a.stop)


def test_on_child_exit_release_hands_leadership_to_another_replica(daemon, seeded, work) -> None:
    once = SCRIPT.replace("wait", 'if [ "$ELECTOR_IDENTITY" = a ]; then exit 3; fi; wait')
    a = daemon("a", script=once)
    wait_until(lambda: journal(work), timeout_s=3)  # a led (briefly: its command exits at once)
    b = daemon("b", script=once)
    wait_until(b.is_leader, timeout_s=3)
    lines = [
        line for line in a.log_lines() if line["event"] in ("command_exited", "resigning_after_command_exit")
    ]
    assert lines[0]["exit_code"] == 3
    assert lines[1]["stand_back_s"] == 1.0
    # The command starts right after the grant (behind its keeper): look for its line a moment.
    wait_until(lambda: [entry[1] for entry in journal(work)][-1] == "b", timeout_s=3)
    time.sleep(1.5)
    assert b.is_leader() and not a.is_leader()


def test_on_child_exit_restart_restarts_while_still_leading(daemon, seeded, work) -> None:
    flaky = 'echo "start $ELECTOR_IDENTITY $ELECTOR_FENCING_TOKEN" >> {dir}/journal; exit 1'
    a = daemon("a", "--on-child-exit", "restart", script=flaky)
    wait_until(lambda: len(journal(work)) >= 3, timeout_s=6)  # back-off 1 s, then 2 s
    tokens = {entry[2] for entry in journal(work)}
    assert len(tokens) == 1  # the same term throughout
    assert a.is_leader()
    exits = [line for line in a.log_lines() if line["event"] == "command_restart_scheduled"]
    assert [line["delay_s"] for line in exits[:2]] == [1.0, 2.0]


def test_on_child_exit_exit_releases_and_exits_with_the_commands_code(daemon, seeded, work) -> None:
    a = daemon("a", "--on-child-exit", "exit", script="sleep 0.5; exit 7")
    b = daemon("b", "--on-child-exit", "exit", script="exec sleep 1000")
    assert a.wait() == 7
    # Released, not left to expire: by a's own log, not a 1 s poll deadline a loaded machine can miss.
    assert "released" in [line["event"] for line in a.log_lines()], a.logs_text()[-3000:]
    wait_until(b.is_leader, timeout_s=10)


def test_a_command_that_cannot_start_is_reported_and_backs_off(daemon, seeded, work) -> None:
    a = daemon("a", command=("/nonexistent/worker", "--flag"))
    # Each failure is logged before its resignation: wait for the second resignation itself (a
    # loaded CI run read the lines between the two and saw one back-off). A bound on a hang.
    wait_until(
        lambda: len([x for x in a.log_lines() if x["event"] == "resigning_after_command_exit"]) >= 2,
        timeout_s=30,
    )
    failures = [line for line in a.log_lines() if line["event"] == "command_failed_to_start"]
    assert "/nonexistent/worker" in failures[0]["error"]
    stand_backs = [
        line["stand_back_s"] for line in a.log_lines() if line["event"] == "resigning_after_command_exit"
    ]
    assert stand_backs[:2] == [1.0, 2.0]  # backing off, not a hot loop
    assert a.get("/healthz")[0] == 200 and a.process is not None and a.process.poll() is None


def test_the_command_does_not_see_the_daemons_own_settings(daemon, seeded, work) -> None:
    script = "env > {dir}/env; exec sleep 1000"
    daemon("a", script=script, env={"ELECTOR_REDIS_URL": "redis://:secret@nowhere:1/0", "KEEP_ME": "yes"})
    wait_until(lambda: (work / "env").exists() and "KEEP_ME" in (work / "env").read_text(), timeout_s=3)
    env = (work / "env").read_text()
    assert "secret" not in env
    assert "ELECTOR_FENCING_TOKEN=" in env and "KEEP_ME=yes" in env


# -- The command never outlives the lease, whatever happens to the daemon ----------------------
# Each of these ran two leaders' commands at once before the keeper: the daemon SIGKILLed alone
# left its command running for ever, a frozen daemon or a stalled event loop left it running past
# the lease. "Gone" is judged on the commands' own processes, against the expiry Redis applies.

TTL = "2s"


def session_members(session: int) -> list[int]:
    """Live processes of a session (the command's tree, keeper included): orphans if any remain."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[3]) == session and fields[0] != "Z":
                    found.append(int(name))
    return found


def latest_expiry(client: redis.Redis, *, samples: int = 20) -> float:
    """The latest moment (monotonic) the lease can expire, as Redis has it: a renewal in flight may
    still land, so look for a little while and keep the latest."""
    expiry = 0.0
    for _ in range(samples):
        pttl = client.pttl(LEASE_KEY)
        if pttl > 0:
            expiry = max(expiry, time.monotonic() + pttl / 1000)
        time.sleep(0.005)
    return expiry


def gone_before(pids_: list[int], *, expiry: float, timeout_s: float) -> float:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(alive(pid) for pid in pids_):
            gone_at = time.monotonic()  # after the check: late, never early
            assert gone_at < expiry, f"the command outlived the lease by {gone_at - expiry:.3f}s"
            return gone_at
        time.sleep(0.002)
    raise AssertionError(f"the command still runs {timeout_s}s later: {[p for p in pids_ if alive(p)]}")


def leader_and_follower(
    daemon, work: Path, **kwargs: object
) -> tuple[DaemonProcess, DaemonProcess, list[int]]:
    a = daemon("a", ttl=TTL, **kwargs)
    wait_until(lambda: len(pids(work, "a")) == 2, timeout_s=5)
    b = daemon("b", ttl=TTL, **kwargs)
    time.sleep(0.5)
    assert a.is_leader() and not b.is_leader()
    return a, b, pids(work, "a")


def assert_successor_after(work: Path, b: DaemonProcess) -> None:
    wait_until(lambda: len(pids(work, "b")) == 2, timeout_s=10)
    entries = journal(work)
    first, second = entries[:2]
    assert (first[1], second[1]) == ("a", "b") and int(second[2]) > int(first[2])
    # More terms may follow on a loaded machine (loaded run #5: b's 2 s term ended and began
    # again); each with a higher token than the one before.
    tokens = [int(entry[2]) for entry in entries]
    assert tokens == sorted(set(tokens)), entries
    wait_until(b.is_leader, timeout_s=10)


@pytest.mark.parametrize("fault", ["sigkill", "sigstop", "blocked_loop"])
def test_the_command_is_gone_before_the_lease_can_expire_when_the_daemon_alone_dies_or_stalls(
    daemon, seeded: redis.Redis, work: Path, fault: str
) -> None:
    env = {BLOCK_LOOP_ENV: "4"} if fault == "blocked_loop" else None  # 2 ttl
    a, b, a_pids = leader_and_follower(daemon, work, env=env)
    session = os.getsid(a_pids[0])
    assert a.process is not None
    if fault == "sigkill":  # an OOM kill of the daemon alone, systemd's KillMode=process
        a.process.kill()
    elif fault == "sigstop":
        a.signal(signal.SIGSTOP)
    else:
        a.signal(signal.SIGUSR2)  # the daemon's loop sleeps for 2 ttl
    expiry = latest_expiry(seeded)

    gone_before([*a_pids, session], expiry=expiry, timeout_s=6)  # the session's leader: the keeper

    members = session_members(session)
    assert members == [], [Path(f"/proc/{pid}/stat").read_text() for pid in members]
    assert_successor_after(work, b)
    if fault == "sigstop":
        a.signal(signal.SIGCONT)
    if fault != "sigkill":
        wait_until(lambda: any(line.get("event") == "stepped_down" for line in a.log_lines()), timeout_s=8)
        reasons = [line["reason"] for line in a.log_lines() if line.get("event") == "stepped_down"]
        # Stalled past its renew deadline and its lease's end, the daemon meets two overdue timers
        # when it runs again; which comes first is the scheduler's choice (renew_deadline came first
        # at load 11). Either is a step-down for time it lost, and the command was gone before the
        # lease could expire (above): that is what this test proves.
        assert reasons[0] in ("lease_expired", "lost", "resigned", "renew_deadline"), reasons
        assert a.process.poll() is None, "the daemon itself lives on, and contends again"
    if fault == "blocked_loop":
        assert [line for line in a.log_lines() if line.get("event") == "testing_hook_blocking_loop"]


def test_a_lost_lease_kills_the_command_at_once_without_a_sigterm(
    daemon, seeded: redis.Redis, work: Path
) -> None:
    # The lease may already be someone else's: the command gets no grace to go on working.
    script = (
        "trap 'echo term >> {dir}/$ELECTOR_IDENTITY.terms' TERM; "
        'echo "start $ELECTOR_IDENTITY $ELECTOR_FENCING_TOKEN" >> {dir}/journal; '
        "sleep 1000 & echo $! > {dir}/$ELECTOR_IDENTITY.grandchild; echo $$ > {dir}/$ELECTOR_IDENTITY.child; "
        "while true; do wait; done"
    )
    a = daemon("a", "--kill-grace", "500ms", ttl=TTL, script=script)
    wait_until(lambda: len(pids(work, "a")) == 2, timeout_s=5)
    a_pids = pids(work, "a")
    session = os.getsid(a_pids[0])

    seeded.delete(LEASE_KEY)  # the next renewal finds the key gone: lost

    wait_until(lambda: not any(alive(pid) for pid in a_pids), timeout_s=5)
    assert not (work / "a.terms").exists(), "SIGKILL at once: no SIGTERM, no grace"
    # The command's processes are gone; the keeper (in the same session) exits right after it
    # has reaped them, a few milliseconds later on a loaded machine.
    wait_until(lambda: session_members(session) == [], timeout_s=5)
    wait_until(lambda: any(line.get("event") == "stepped_down" for line in a.log_lines()), timeout_s=5)
    reasons = [line.get("reason") for line in a.log_lines() if line.get("event") == "stepped_down"]
    assert reasons[:1] == ["lost"], reasons


FREEZER = Path("/sys/fs/cgroup/freezer")


@pytest.mark.skipif(
    os.geteuid() != 0 or not (FREEZER / "cgroup.procs").exists(),
    reason="needs root and the cgroup v1 freezer (a frozen process survives SIGKILL)",
)
def test_a_command_that_survives_sigkill_is_not_released_but_left_to_lapse(
    daemon, seeded: redis.Redis, work: Path
) -> None:
    cgroup = FREEZER / f"elector-test-{os.getpid()}-{time.monotonic_ns()}"
    cgroup.mkdir()
    try:
        a = daemon("a", ttl=TTL)
        wait_until(lambda: len(pids(work, "a")) == 2, timeout_s=5)
        a_pids = pids(work, "a")
        for pid in a_pids:  # frozen: a SIGKILL stays pending, the process stays alive (state D)
            (cgroup / "cgroup.procs").write_text(str(pid))
        (cgroup / "freezer.state").write_text("FROZEN")

        lapses_after = time.monotonic() + seeded.pttl(LEASE_KEY) / 1000  # at the earliest
        a.signal(signal.SIGTERM)
        a.wait(timeout_s=10)

        # Not released: the key is still there, unless the daemon's stop outlasted the lease
        # itself (loaded run #6: at load 12 it had lapsed by the time the daemon exited). The
        # logs below say it was withheld either way.
        if time.monotonic() < lapses_after - 0.05:
            assert seeded.pttl(LEASE_KEY) > 0, "not released: the lease is left to lapse by its ttl"
        events = [line.get("event") for line in a.log_lines()]
        assert "release_withheld" in events and "released" not in events, events
        assert [line for line in a.log_lines() if line.get("event") == "child_tree_survived_kill"]
    finally:
        with contextlib.suppress(OSError):
            (cgroup / "freezer.state").write_text("THAWED")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                cgroup.rmdir()
                break
            time.sleep(0.05)


# -- The restart race of --on-child-exit restart (exec mode against a stand-in election) ---------


class StandInElection:
    """The election as exec mode sees it (status, resign): this test is about the restart."""

    def __init__(self, token: int) -> None:
        self.token = token
        self.resigned: list[float] = []

    def status(self) -> ElectionStatus:
        return ElectionStatus(
            lock="jobs", identity="a", state=State.LEADER, is_leader=True, holder=None,
            fencing_token=self.token, lease_remaining_s=60.0, started=True, last_backend_ok_at=None,
            cycle_due_by=None, backend_up=True, now=boottime(),
        )  # fmt: skip

    def resign(self, *, stand_back_s: float) -> None:
        self.resigned.append(stand_back_s)


async def test_a_step_down_cancels_a_restart_whose_start_is_under_way(tmp_path: Path) -> None:
    # The command exits and leaves a process that ignores SIGTERM. The restart's start waits out
    # the (long) grace for it when the lease is lost: the step-down must not wait for that grace,
    # nor start a new command with the old token.
    journal_file, leftovers, terms = tmp_path / "journal", tmp_path / "leftovers", tmp_path / "terms"
    (tmp_path / "leftover.py").write_text(
        "import os, signal, sys, time\n"
        f"signal.signal(signal.SIGTERM, lambda *_: open({str(terms)!r}, 'a').write('term\\n'))\n"
        f"open({str(leftovers)!r}, 'a').write(f'{{os.getpid()}}\\n')\n"
        "while True: time.sleep(1)\n"
    )
    script = (
        f'echo "start $ELECTOR_FENCING_TOKEN" >> {journal_file}; '
        f"{sys.executable} {tmp_path / 'leftover.py'} & sleep 0.3; exit 1"
    )
    settings = ExecSettings(
        command=("sh", "-c", script), kill_grace_s=30.0, on_child_exit=ChildExitPolicy.RESTART
    )
    exec_mode = ExecMode(
        settings, log=structlog.get_logger("test"), request_exit=lambda code: None,
        children=AwaitedChildren(),
        keeper_margin_s=None,  # the race is the daemon's own: no keeper between it and the command
    )  # fmt: skip
    exec_mode.attach(StandInElection(token=7))
    lease = Lease(lock="jobs", identity="a", fencing_token=7, ttl_ms=60_000, value="secret")
    try:
        await exec_mode.on_started_leading(lease)
        for _ in range(2000):  # the exit, the 1 s back-off, then the restart's clean-up: its SIGTERM
            if terms.exists():
                break
            await asyncio.sleep(0.01)
        [leftover] = [int(x) for x in leftovers.read_text().split()]
        assert terms.exists() and alive(leftover), "the restart is waiting out the grace"

        async with asyncio.timeout(10):  # not the 30 s grace, let alone two of them
            await exec_mode.on_stopped_leading(StepDownReason.LOST)

        await asyncio.sleep(0.5)
        assert journal_file.read_text().split() == ["start", "7"], "no new command for a lost lease"
        assert not alive(leftover) and exec_mode.child_pid is None
    finally:
        for pid in [int(x) for x in leftovers.read_text().split()] if leftovers.exists() else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_the_commands_back_off_doubles_to_a_minute_and_starts_over_after_a_healthy_run() -> None:
    backoff = command_backoff()
    assert [backoff.after_run(0.5) for _ in range(8)] == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    assert backoff.after_run(60.0) == 1.0  # it ran a minute: healthy, so from 1 s again
    assert backoff.after_run(59.0) == 2.0


async def test_a_stop_without_a_term_is_a_no_op(tmp_path: Path) -> None:
    # The election calls on_stopped_leading once at the end of a run that never led.
    settings = ExecSettings(command=("sh", "-c", f"touch {tmp_path / 'ran'}"), kill_grace_s=1.0)
    exec_mode = ExecMode(
        settings, log=structlog.get_logger("test"), request_exit=lambda code: None,
        children=AwaitedChildren(),
        keeper_margin_s=None,
    )  # fmt: skip
    exec_mode.attach(StandInElection(token=7))
    with structlog.testing.capture_logs() as logs:
        async with asyncio.timeout(5):
            await exec_mode.on_stopped_leading(StepDownReason.SHUTDOWN)
    assert logs == [] and exec_mode.child_pid is None
    assert not (tmp_path / "ran").exists()
