"""The keeper (elector/daemon/execmode/keeper.py): its deadline logic without real time, then the
real process.

The process tests start the keeper as the daemon does (`KeeperLink.argv`, a new session, the
pipe's read end passed on) but from the test itself, so that the daemon's death, its stall and
its renewals are each in the test's hands. Commands journal what they see (their pid, a SIGTERM)
with CLOCK_BOOTTIME, the keeper's clock; deaths are seen through pidfds (late, never early).
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from elector.daemon.execmode.keeper import (
    MAX_WAIT_S,
    STOP_POLL_S,
    LineReader,
    Schedule,
    boottime,
    decode_start,
    encode_start,
    parse_args,
)
from elector.daemon.execmode.keeper_link import _BOOTSTRAP, KeeperLink

GRACE_S = 0.3
#: Scheduling noise allowed on top of a time the keeper computes: the CI box is a loaded 2-core
#: machine. The tight bound (gone before the lease can expire) is judged end to end by the fault
#: suite; here the bounds only tell the keeper's paths apart (a grace, a deadline: never 60 s).
NOISE_S = 2.0

# -- Schedule: pure, every method takes the time ---------------------------------------------


def schedule(valid_until: float = 100.0, *, grace_s: float = 2.0, margin_s: float = 2.1) -> Schedule:
    return Schedule(valid_until=valid_until, kill_grace_s=grace_s, margin_s=margin_s)


def test_without_news_term_comes_one_grace_before_the_deadline_and_kill_at_it() -> None:
    plan = schedule(100.0)
    assert plan.deadline == pytest.approx(102.1)
    assert (plan.term_at, plan.kill_at) == (pytest.approx(100.1), pytest.approx(102.1))
    assert plan.due(100.0) is None
    assert plan.due(100.1) == signal.SIGTERM
    assert plan.due(102.1) == signal.SIGKILL


def test_a_renewal_moves_both_and_an_older_or_broken_one_is_ignored() -> None:
    plan = schedule(100.0)
    assert plan.extend(103.0) and plan.kill_at == pytest.approx(105.1)
    assert not plan.extend(102.0) and not plan.extend(float("nan")) and not plan.extend(float("inf"))
    assert plan.kill_at == pytest.approx(105.1)


def test_a_stop_sends_term_now_and_kill_one_grace_later_but_never_after_the_deadline() -> None:
    plan = schedule(100.0)
    plan.begin_stop(50.0)  # the daemon died long before the deadline
    assert (plan.term_at, plan.kill_at) == (50.0, 52.0)
    late = schedule(100.0)
    late.begin_stop(101.5)  # it died during the last grace: the deadline still holds
    assert (late.term_at, late.kill_at) == (pytest.approx(100.1), pytest.approx(102.1))


def test_once_stopping_later_renewals_change_nothing() -> None:
    plan = schedule(100.0)
    plan.begin_stop(60.0)
    plan.begin_stop(70.0)  # the first stop counts
    assert not plan.extend(200.0)
    assert (plan.term_at, plan.kill_at, plan.deadline) == (60.0, 62.0, pytest.approx(102.1))


def test_waits_are_capped_so_that_a_suspend_is_noticed_and_stopping_polls() -> None:
    plan = schedule(100.0)
    assert plan.wait_s(0.0) == MAX_WAIT_S  # far away: still look again soon (poll() stops in a suspend)
    assert plan.wait_s(100.05) == pytest.approx(0.05)
    assert plan.wait_s(101.0) == STOP_POLL_S  # TERM is due: watch the tree go, KILL on time
    assert plan.wait_s(105.0) == 0.1  # long past SIGKILL: something is stuck, no need to spin
    plan.begin_stop(10.0)
    assert plan.wait_s(10.0) == STOP_POLL_S


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("kill_grace_s", {"kill_grace_s": -1.0}),
        ("margin_s", {"margin_s": float("nan")}),
        ("valid_until", {"valid_until": float("inf")}),
    ],
)
def test_bad_timing_is_refused_naming_the_value(field: str, kwargs: dict[str, float]) -> None:
    values = {"valid_until": 1.0, "kill_grace_s": 1.0, "margin_s": 1.0, **kwargs}
    with pytest.raises(ValueError, match=field):
        Schedule(**values)


def test_the_line_reader_waits_for_torn_lines_and_skips_garbage() -> None:
    reader = LineReader()
    assert reader.feed(b"12.5\n13") == [12.5]
    assert reader.feed(b".25\nnot a number\n14\n") == [13.25, 14.0]
    assert reader.feed(b"9" * 100) == []  # no number is that long: dropped, not buffered forever
    assert reader.feed(b"\n15\n") == [15.0]


def test_the_arguments_are_checked() -> None:
    values, command = parse_args(
        ["--control-fd", "5", "--parent-pid", "1", "--valid-until", "9.5", "--kill-grace-s", "1",
         "--margin-s", "1.1", "--", "sh", "-c", "true"]
    )  # fmt: skip
    assert values["valid_until"] == 9.5 and command == ["sh", "-c", "true"]
    with pytest.raises(ValueError, match="no command"):
        parse_args(["--control-fd", "5"])
    with pytest.raises(ValueError, match="missing --parent-pid"):
        parse_args(
            ["--control-fd", "5", "--valid-until", "1", "--kill-grace-s", "1", "--margin-s", "1", "--", "x"]
        )
    with pytest.raises(ValueError, match="takes a number"):
        parse_args(["--control-fd", "x", "--", "true"])


def test_sending_never_blocks_even_when_nobody_reads() -> None:
    link = KeeperLink(valid_until=1.0, kill_grace_s=1.0, margin_s=1.0)
    try:
        sent = [link.send(1.0 + i) for i in range(1, 20_000)]  # ~20 bytes each: > a 64 KiB pipe
        assert all(sent[:100]) and not all(sent) and link.dropped > 0
        assert not link.send(0.5), "an older validity end is not news"
    finally:
        link.close()


# -- the keeper process ------------------------------------------------------------------------


class Started:
    """A keeper started by the test in the daemon's place."""

    def __init__(self, link: KeeperLink, process: subprocess.Popen[bytes], log: Path) -> None:
        self.link, self.process, self.log = link, process, log

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@pytest.fixture
def keepers(tmp_path: Path) -> Iterator[list[Started]]:
    started: list[Started] = []
    yield started
    for keeper in started:
        keeper.link.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(keeper.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            keeper.process.wait(timeout=5)
    for path in tmp_path.glob("*.pid"):
        for pid in pids_in(path):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def start_keeper(
    keepers: list[Started], tmp_path: Path, script: str, *, valid_in_s: float, grace_s: float = GRACE_S,
    margin_s: float | None = None,
) -> Started:  # fmt: skip
    link = KeeperLink(
        valid_until=boottime() + valid_in_s,
        kill_grace_s=grace_s,
        margin_s=grace_s + 0.1 if margin_s is None else margin_s,
    )
    log = tmp_path / f"keeper-{len(keepers)}.log"
    with log.open("ab") as out:
        process = subprocess.Popen(
            link.argv(["sh", "-c", script]), pass_fds=link.pass_fds, start_new_session=True,
            stdin=subprocess.DEVNULL, stdout=out, stderr=out,
        )  # fmt: skip
    link.spawned()
    started = Started(link, process, log)
    keepers.append(started)
    return started


def pids_in(path: Path) -> list[int]:
    try:
        return [int(word) for word in path.read_text().split() if word.isdigit()]
    except FileNotFoundError:
        return []


def wait_for_pids(path: Path, count: int, *, timeout_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while len(found := pids_in(path)) < count:
        assert time.monotonic() < deadline, f"{path.name}: {count} pid(s) not written in {timeout_s}s"
        time.sleep(0.01)
    return found


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def gone_at(pids: list[int], *, timeout_s: float) -> float:
    """The CLOCK_BOOTTIME moment every one of `pids` was seen dead (pidfds: no polling lag)."""
    fds = []
    try:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                fds.append(os.pidfd_open(pid))
        deadline = time.monotonic() + timeout_s
        pending = list(fds)
        while pending:
            left = deadline - time.monotonic()
            assert left > 0, f"still running after {timeout_s}s: {[p for p in pids if running(p)]}"
            ready, _, _ = select.select(pending, [], [], left)
            pending = [fd for fd in pending if fd not in ready]
        seen = boottime()
        # A zombie is dead, but pidfds of non-children only fire once it is reaped: check too.
        assert not [pid for pid in pids if running(pid)]
        return seen
    finally:
        for fd in fds:
            os.close(fd)


#: A command that records its pid and every SIGTERM (with the boottime), and ignores SIGTERM.
STUBBORN = textwrap.dedent(
    """\
    import os, sys, time
    import signal
    out = sys.argv[1]
    if sys.argv[2:] == ["own-group"]:  # as a job-control shell does with each job
        os.setpgid(0, 0)
    def note(signum, frame):
        with open(out + ".terms", "a") as f:
            f.write(repr(time.clock_gettime(time.CLOCK_BOOTTIME)) + "\\n")
    signal.signal(signal.SIGTERM, note)
    with open(out + ".pid", "a") as f:
        f.write(f"{os.getpid()}\\n")
    while True:
        time.sleep(1)
    """
)


def stubborn(tmp_path: Path, name: str, *, own_group: bool = False) -> str:
    program = tmp_path / "stubborn.py"
    program.write_text(STUBBORN)
    return f"{sys.executable} {program} {tmp_path / name}" + (" own-group" if own_group else "")


def terms(tmp_path: Path, name: str) -> list[float]:
    path = tmp_path / f"{name}.terms"
    return [float(line) for line in path.read_text().split()] if path.exists() else []


def test_the_keeper_exits_with_the_commands_code_or_its_signal(
    keepers: list[Started], tmp_path: Path
) -> None:
    coded = start_keeper(keepers, tmp_path, "exit 7", valid_in_s=60)
    killed = start_keeper(keepers, tmp_path, "kill -SEGV $$", valid_in_s=60)
    assert coded.process.wait(timeout=10) == 7
    assert killed.process.wait(timeout=10) == -signal.SIGSEGV, killed.log_text()


def test_the_command_starts_with_no_signal_ignored(keepers: list[Started], tmp_path: Path) -> None:
    # Python ignores SIGPIPE and SIGXFSZ; a command must not inherit that (as with subprocess).
    keeper = start_keeper(keepers, tmp_path, f"grep SigIgn /proc/$$/status > {tmp_path}/ign", valid_in_s=60)
    assert keeper.process.wait(timeout=10) == 0
    ignored = int((tmp_path / "ign").read_text().split()[1], 16)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        assert not ignored & (1 << (sig - 1)), f"{sig.name} is ignored in the command"


def test_the_groups_sigterm_reaches_the_command_and_the_keeper_outlives_it(
    keepers: list[Started], tmp_path: Path
) -> None:
    keeper = start_keeper(
        keepers, tmp_path, f"trap 'echo term >> {tmp_path}/seen; exit 0' TERM; echo $$ > {tmp_path}/c.pid; "
        "sleep 1000 & wait", valid_in_s=60,
    )  # fmt: skip
    [command] = wait_for_pids(tmp_path / "c.pid", 1)
    assert os.getpgid(command) == keeper.process.pid, "the command runs in the keeper's group"

    os.killpg(keeper.process.pid, signal.SIGTERM)  # what the supervisor does

    assert keeper.process.wait(timeout=10) == 0, "the command's own status, not the keeper's TERM"
    assert (tmp_path / "seen").read_text().split() == ["term"], "one SIGTERM: the keeper adds none"


def test_a_dead_daemon_means_term_at_once_and_kill_one_grace_later(
    keepers: list[Started], tmp_path: Path
) -> None:
    keeper = start_keeper(keepers, tmp_path, f"{stubborn(tmp_path, 'c')} & wait", valid_in_s=60)
    [command] = wait_for_pids(tmp_path / "c.pid", 1)

    closed_at = boottime()
    keeper.link.close()  # EOF: what the daemon's death looks like from the keeper
    dead_at = gone_at([command, keeper.process.pid], timeout_s=10)

    [term] = terms(tmp_path, "c")
    assert closed_at <= term, "SIGTERM came after the EOF"
    assert dead_at - closed_at >= GRACE_S, "SIGKILL waited for the grace"
    assert dead_at - closed_at < GRACE_S + NOISE_S, "...and no longer: the lease deadline was far"
    assert '"reason":"daemon_gone"' in keeper.log_text()


def test_without_renewals_the_tree_is_gone_by_the_deadline(keepers: list[Started], tmp_path: Path) -> None:
    # The daemon is alive (its pipe open) but sends nothing: frozen, or its loop is stuck.
    keeper = start_keeper(keepers, tmp_path, f"{stubborn(tmp_path, 'c')} & wait", valid_in_s=1.0)
    [command] = wait_for_pids(tmp_path / "c.pid", 1)
    assert keeper.link.valid_until is not None
    schedule = Schedule(
        valid_until=keeper.link.valid_until,
        kill_grace_s=keeper.link.kill_grace_s,
        margin_s=keeper.link.margin_s,
    )

    dead_at = gone_at([command], timeout_s=10)

    [term] = terms(tmp_path, "c")
    assert term >= schedule.term_at, "never before its time: the lease is still ours until then"
    assert dead_at < schedule.deadline + NOISE_S, f"{dead_at - schedule.deadline:.3f}s past the deadline"
    assert keeper.process.wait(timeout=5) == -signal.SIGTERM, "the command's (sh's) own end"


def test_renewals_keep_the_command_running(keepers: list[Started], tmp_path: Path) -> None:
    keeper = start_keeper(keepers, tmp_path, f"{stubborn(tmp_path, 'c')} & wait", valid_in_s=1.5)
    [command] = wait_for_pids(tmp_path / "c.pid", 1)
    until = time.monotonic() + 5.0  # more than three validities
    while time.monotonic() < until:
        assert keeper.link.send(boottime() + 1.5)
        time.sleep(0.1)
    assert running(command) and terms(tmp_path, "c") == []
    keeper.link.close()
    gone_at([command], timeout_s=10)


def test_escaped_and_regrouped_processes_are_killed_too(keepers: list[Started], tmp_path: Path) -> None:
    # One leaves the session (setsid, double fork: reparented to the keeper, the subreaper), one
    # moves to another group of the session; both ignore SIGTERM.
    escaped = stubborn(tmp_path, "escaped")
    regrouped = stubborn(tmp_path, "regrouped", own_group=True)
    script = f"(setsid {escaped} &); {regrouped} & exec sleep 1000"
    keeper = start_keeper(keepers, tmp_path, script, valid_in_s=60)
    [escapee] = wait_for_pids(tmp_path / "escaped.pid", 1)
    [member] = wait_for_pids(tmp_path / "regrouped.pid", 1)
    assert os.getsid(escapee) != keeper.process.pid
    assert os.getpgid(member) != keeper.process.pid and os.getsid(member) == keeper.process.pid

    keeper.link.close()

    gone_at([escapee, member], timeout_s=10)
    assert terms(tmp_path, "escaped") and terms(tmp_path, "regrouped"), "each got its SIGTERM first"


def test_a_natural_exit_stops_the_leftovers_before_the_keeper_reports_it(
    keepers: list[Started], tmp_path: Path
) -> None:
    keeper = start_keeper(
        keepers, tmp_path, f"{stubborn(tmp_path, 'left')} & sleep 0.5; exit 3", valid_in_s=60
    )
    [leftover] = wait_for_pids(tmp_path / "left.pid", 1)
    assert keeper.process.wait(timeout=10) == 3
    assert not running(leftover), "nothing of the tree outlives the keeper's report"


PARENT = textwrap.dedent(
    """\
    import os, subprocess, sys, time
    sys.path.insert(0, sys.argv[1])
    from elector.daemon.execmode.keeper import boottime
    from elector.daemon.execmode.keeper_link import KeeperLink
    link = KeeperLink(valid_until=boottime() + 60, kill_grace_s=0.3, margin_s=0.4)
    keeper = subprocess.Popen(link.argv(["sh", "-c", sys.argv[3]]), pass_fds=link.pass_fds,
                              start_new_session=True)
    link.spawned()
    # Someone else holds the pipe's write end too: our death shows no EOF, only the death signal.
    os.set_inheritable(link._write_fd, True)
    holder = subprocess.Popen(["sleep", "1000"], pass_fds=(link._write_fd,))
    with open(sys.argv[2], "w") as f:
        f.write(f"{keeper.pid} {holder.pid}\\n")
    time.sleep(1000)
    """
)


def test_the_parents_death_signal_stops_the_command_when_the_pipe_shows_nothing(tmp_path: Path) -> None:
    (tmp_path / "parent.py").write_text(PARENT)
    repo = str(Path(__file__).resolve().parents[3])
    script = f"{stubborn(tmp_path, 'c')} & wait"
    parent = subprocess.Popen(
        [sys.executable, str(tmp_path / "parent.py"), repo, str(tmp_path / "k"), script]
    )
    try:
        _, holder = wait_for_pids(tmp_path / "k", 2)
        [command] = wait_for_pids(tmp_path / "c.pid", 1)
        parent.kill()
        parent.wait()
        gone_at([command], timeout_s=5)  # the pipe's EOF never came: PR_SET_PDEATHSIG did it
        assert terms(tmp_path, "c"), "TERM first"
        assert running(holder)
    finally:
        for pid in pids_in(tmp_path / "k"):  # the keeper's group: the command and its shell too
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL) if pid == os.getsid(pid) else os.kill(pid, signal.SIGKILL)


# -- the parked keeper -------------------------------------------------------------------------


def test_a_start_order_round_trips_and_waits_for_its_end() -> None:
    env = {"ELECTOR_FENCING_TOKEN": "42", "EMPTY": "", "EQUALS": "a=b=c", "UNICODE": "ünï"}
    order = encode_start(123.25, env) + b"124.5\n"
    for cut in (0, 5, order.index(b"\n"), order.index(b"\n") + 3, len(order) - 7):
        assert decode_start(order[:cut]) is None, f"incomplete at {cut} bytes"
    valid_until, decoded, rest = decode_start(order) or (0.0, {}, b"")
    assert (valid_until, decoded, rest) == (123.25, env, b"124.5\n"), "renewals after it are kept"
    assert decode_start(encode_start(1.0, {})) == (1.0, {}, b"")


@pytest.mark.parametrize(
    "order",
    [b"go 1.0 0\n", b"start x 0\n", b"start 1.0 -1\n", b"start inf 0\n", b"start 1.0 4\nnoeq",
     b"x" * 100, b"start 1.0 99999999999\n"],
)  # fmt: skip
def test_a_malformed_start_order_is_refused(order: bytes) -> None:
    with pytest.raises(ValueError, match="start order"):
        decode_start(order)


def test_an_environment_that_cannot_be_one_is_refused_when_encoding() -> None:
    for env in ({"A=B": "x"}, {"": "x"}, {"A": "x\0y"}):
        with pytest.raises(ValueError, match="illegal environment variable"):
            encode_start(1.0, env)
    with pytest.raises(ValueError, match="finite"):
        encode_start(math.inf, {})


def test_parked_arguments_need_no_validity_end() -> None:
    values, command = parse_args(
        ["--control-fd", "5", "--parent-pid", "1", "--parked", "--kill-grace-s", "1", "--margin-s", "1",
         "--", "x"]
    )  # fmt: skip
    assert values == {"parked": 1.0, "control_fd": 5, "parent_pid": 1, "kill_grace_s": 1, "margin_s": 1}
    assert command == ["x"]


def park_keeper(keepers: list[Started], tmp_path: Path, script: str, *, grace_s: float = GRACE_S) -> Started:
    link = KeeperLink.parked(kill_grace_s=grace_s, margin_s=grace_s + 0.1)
    assert "--parked" in link.argv(["x"]) and "--valid-until" not in link.argv(["x"])
    log = tmp_path / f"keeper-{len(keepers)}.log"
    with log.open("ab") as out:
        process = subprocess.Popen(
            link.argv(["sh", "-c", script]), pass_fds=link.pass_fds, start_new_session=True,
            stdin=subprocess.DEVNULL, stdout=out, stderr=out,
            env={"PATH": os.environ["PATH"], "KEEPER_OWN": "1"},
        )  # fmt: skip
    link.spawned()
    started = Started(link, process, log)
    keepers.append(started)
    return started


def test_a_parked_keeper_starts_the_command_with_the_orders_environment(
    keepers: list[Started], tmp_path: Path
) -> None:
    keeper = park_keeper(keepers, tmp_path, f"env > {tmp_path}/env; exit 5")
    time.sleep(0.3)  # parked, waiting on its pipe
    assert not (tmp_path / "env").exists(), "nothing starts before the order"
    assert not keeper.link.send(boottime() + 60), "no validity end before the start order"

    env = {"PATH": os.environ["PATH"], "ELECTOR_FENCING_TOKEN": "7", "ELECTOR_LOCK": "jobs"}
    assert keeper.link.launch(valid_until=boottime() + 60, env=env)
    assert keeper.link.send(boottime() + 61), "renewals go through once launched"

    assert keeper.process.wait(timeout=10) == 5, "the command's own status"
    seen = dict(line.split("=", 1) for line in (tmp_path / "env").read_text().splitlines() if "=" in line)
    assert seen["ELECTOR_FENCING_TOKEN"] == "7" and seen["ELECTOR_LOCK"] == "jobs"
    assert "KEEPER_OWN" not in seen, "the order's environment, not the keeper's"
    assert not keeper.link.launch(valid_until=boottime() + 60, env=env), "one order per keeper"


def test_a_parked_keepers_order_sets_the_deadline(keepers: list[Started], tmp_path: Path) -> None:
    keeper = park_keeper(keepers, tmp_path, f"{stubborn(tmp_path, 'c')} & wait")
    valid_until = boottime() + 1.0
    assert keeper.link.launch(valid_until=valid_until, env=dict(os.environ))
    [command] = wait_for_pids(tmp_path / "c.pid", 1)
    dead_at = gone_at([command], timeout_s=10)
    [term] = terms(tmp_path, "c")
    assert term >= valid_until + 0.1 - GRACE_S, "TERM one grace before the order's deadline, not earlier"
    assert dead_at <= valid_until + 0.1 + NOISE_S


@pytest.mark.parametrize("how", ["eof", "sigterm", "garbage", "half an order"])
def test_a_parked_keeper_that_gets_no_whole_order_exits_without_starting_anything(
    keepers: list[Started], tmp_path: Path, how: str
) -> None:
    keeper = park_keeper(keepers, tmp_path, f"echo started > {tmp_path}/started")
    time.sleep(0.3)
    if how == "eof":
        keeper.link.close()
    elif how == "sigterm":
        keeper.process.send_signal(signal.SIGTERM)
    else:
        order = encode_start(boottime() + 60, {"A": "b" * 1000})
        os.write(keeper.link._write_fd, b"start now please\n" if how == "garbage" else order[:-10])
        keeper.link.close()
    assert keeper.process.wait(timeout=10) == (2 if how == "garbage" else 0), keeper.log_text()
    assert not (tmp_path / "started").exists()
    assert ("keeper_bad_start" in keeper.log_text()) == (how == "garbage")


# The same parent, with a parked keeper (no validity end until a start message).
PARKED_PARENT = PARENT.replace("from elector.daemon.execmode.keeper import boottime\n", "").replace(
    "KeeperLink(valid_until=boottime() + 60, kill_grace_s=0.3, margin_s=0.4)",
    "KeeperLink.parked(kill_grace_s=0.3, margin_s=0.4)",
)
assert "KeeperLink.parked(" in PARKED_PARENT


def test_a_parked_keeper_exits_when_its_parent_dies(tmp_path: Path) -> None:
    (tmp_path / "parent.py").write_text(PARKED_PARENT)
    repo = str(Path(__file__).resolve().parents[3])
    parent = subprocess.Popen(
        [sys.executable, str(tmp_path / "parent.py"), repo, str(tmp_path / "k"), f"touch {tmp_path}/started"]
    )
    try:
        keeper, holder = wait_for_pids(tmp_path / "k", 2)
        time.sleep(0.3)
        parent.kill()
        parent.wait()
        gone_at([keeper], timeout_s=10)  # no EOF came: the death signal (or its parent check) did it
        assert running(holder)
        assert not (tmp_path / "started").exists()
    finally:
        for pid in pids_in(tmp_path / "k"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


#: Runs the keeper as the daemon does, but with its stop poll made useless (an hour): whatever
#: ends it promptly must be a wake-up (SIGCHLD, the pipe), not the poll.
NO_POLL_BOOTSTRAP = (
    "import sys, importlib.util as util; path = sys.argv.pop(1); "
    "spec = util.spec_from_file_location('elector_keeper', path); keeper = util.module_from_spec(spec); "
    "spec.loader.exec_module(keeper); keeper.STOP_POLL_S = 3600.0; keeper.main(sys.argv[1:])"
)


@pytest.mark.parametrize("parked", [False, True])
def test_a_command_that_exits_on_term_ends_the_keeper_without_its_stop_poll(
    keepers: list[Started], tmp_path: Path, parked: bool
) -> None:
    # A grace and margin of 10 minutes: neither can be what ends it.
    if parked:
        link = KeeperLink.parked(kill_grace_s=600.0, margin_s=600.1)
    else:
        link = KeeperLink(valid_until=boottime() + 3600, kill_grace_s=600.0, margin_s=600.1)
    argv = link.argv(["sh", "-c", f"echo $$ > {tmp_path}/c.pid; sleep 1000 & wait"])
    assert argv[3:5] == ["-c", _BOOTSTRAP]
    argv[4] = NO_POLL_BOOTSTRAP
    process = subprocess.Popen(argv, pass_fds=link.pass_fds, start_new_session=True, stdin=subprocess.DEVNULL)
    link.spawned()
    keepers.append(Started(link, process, tmp_path / "none.log"))
    if parked:
        assert link.launch(valid_until=boottime() + 3600, env=dict(os.environ))
    wait_for_pids(tmp_path / "c.pid", 1)

    os.killpg(process.pid, signal.SIGTERM)  # what the supervisor does; the shell and its sleep exit

    # Far below the hour of the poll: a wake-up (SIGCHLD) ended it.
    assert process.wait(timeout=30) == -signal.SIGTERM


def test_the_keeper_loads_few_modules() -> None:
    # Every module costs the keeper's interpreter memory, in every exec-mode pod: its bootstrap
    # and keeper.py import neither typing nor enum (signal's), contextlib nor importlib.util.
    listing = "print(' '.join(sorted(sys.modules)))"
    bootstrap = _BOOTSTRAP.replace("keeper.main(sys.argv[1:])", "keeper._prctl(1, 0); " + listing)
    assert bootstrap != _BOOTSTRAP
    keeper_path = str(Path(__file__).parents[3] / "elector/daemon/execmode/keeper.py")
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", bootstrap, keeper_path],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    loaded = set(done.stdout.split())
    assert "elector_keeper" not in loaded and "ctypes" in loaded, "the listing is the keeper's"
    assert not loaded & {"typing", "enum", "signal", "contextlib", "importlib.util", "collections"}, loaded
