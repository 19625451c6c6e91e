"""The keeper: exec mode's watchdog, a tiny process between the daemon and the leader's command.

The daemon stops its command when it steps down, but only while it lives and its event loop
runs. SIGKILL of the daemon alone (an OOM kill, systemd's KillMode=process), a SIGSTOP or a
stalled loop would leave the command running past the lease, beside the next leader's. The
keeper closes that gap without depending on the daemon:

    daemon --(pipe: validity ends)--> keeper --(fork+exec, same process group)--> COMMAND

* The daemon starts the keeper (in a new session, as its supervisor's child); the keeper spawns
  the command in the keeper's own process group, so the supervisor's group and session logic
  still reaches every process. The keeper ignores the supervisor's SIGTERM (the command gets it too)
  and exits with the command's own status, re-raising the command's fatal signal on itself.
* After every renewal the daemon writes the new validity end (`CycleOutcome.valid_until`,
  CLOCK_BOOTTIME seconds, one ASCII line) to the pipe. Without a fresh one, the keeper sends
  SIGTERM to the command's tree at `valid_until + margin - grace` and SIGKILL at
  `valid_until + margin`; the daemon sets `margin` to the stop time its lease timing reserves,
  so everything is dead before the lease can expire on Redis (see `Schedule`).
* EOF on the pipe, or PR_SET_PDEATHSIG's signal, means the daemon died: SIGTERM at once, SIGKILL
  after the grace, never later than the deadline above.
* CLOCK_BOOTTIME counts a suspend: a resumed machine finds the deadline passed and kills at once.
  (Waits are capped at `MAX_WAIT_S`, since select() itself sleeps on the monotonic clock.)
* The command's tree is its process group, its session (members that moved to another group)
  and, the keeper being a child subreaper, every process reparented to it (escaped daemons),
  and the transitive closure of all these (descendants, and the groups and sessions they lead),
  built from one /proc snapshot: a chain of processes that each left the session while their
  parents live is killed in one pass, not one level per scan as its parents die.
* The command gets PR_SET_PDEATHSIG (SIGKILL) towards the keeper, armed between fork and exec:
  a keeper killed alone (an OOM kill) takes the command with it. The daemon then kills the rest
  of the tree (supervisor.py: `keeper_lost`). Linux clears it when the command execs a set-user-ID
  program; the daemon's kill covers that case.
* It never starts the command once the validity end it was given has passed (a fresh keeper
  given a past deadline, a parked one thawed after its order's deadline): it looks right before
  the fork and again right before the exec, writes `DEADLINE_PASSED` (and `TREE_GONE`) on its
  status pipe and exits with `EXIT_DEADLINE_PASSED`.
* When the command exits by itself the keeper stops what it left behind (TERM, KILL after the
  grace) before exiting, so no leftover runs unwatched.
* "Tree gone" (`--status-fd`): right before it exits with the tree verified empty, the keeper
  writes `TREE_GONE` on its status pipe, so that the daemon can skip a /proc scan of its own. Only
  as a child subreaper: then every process of the tree is a descendant of the keeper (orphans are
  reparented to it, the session and group are forked from it), so "no child left" (waitpid: ECHILD)
  proves the whole tree gone, and nothing can escape to the daemon (a subreaper too) while the
  keeper lives. Without the report (no subreaper, killed before it) the daemon scans as before.
  With it, in the same write, comes the command's wait status (`EXIT_STATUS_PREFIX`), the one the
  keeper exits like: the daemon goes on (releases) on the report, without waiting for the
  keeper's own exit, which is all that is left of it.
* Cheap stop: after the supervisor's SIGTERM (which reached the whole group) the keeper first
  waits up to `TERM_SCAN_DELAY_S` for the command's exit, then scans /proc only if processes are
  left (members that moved out of the group); the verification above needs no scan at all.
* Parked (`--parked`): the daemon starts a keeper ahead of time, while it does not lead, so that
  an acquisition costs no interpreter start. It waits on its pipe for the start order
  (`encode_start`: the first validity end and the command's environment, in one write) and then
  spawns the command at once. Without a whole order it never spawns: EOF, the parent's death,
  SIGTERM or a malformed order end it quietly (exit 0, or 2 for a malformed order).

Standard library only, and no `elector` imports: it is started with `python -I -S` and costs a
bare interpreter's memory (see bench/execmode/keeper_cost.py) plus what it imports, kept small:
`_signal` rather than `signal` (no enum), a local `suppress` rather than contextlib, ctypes only
for prctl (measured: 4.1 MiB of anonymous memory parked before, 3.3 after). The daemon side is
`KeeperLink` (keeper_link.py).

PR_SET_PDEATHSIG fires when the *thread* that forked the keeper exits: the daemon spawns it from
its event loop's thread, which lives as long as the daemon (from a short-lived thread the keeper
would stop the command early: the safe direction).
"""

from __future__ import annotations

import errno
import math
import os
import select
import sys
import time

#: `typing.TYPE_CHECKING` without importing typing (mypy treats the name the same way).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal
    from collections.abc import Iterable, Mapping, Sequence
else:
    # The C module that `signal` wraps: the same functions and constants, as plain ints. `signal`
    # itself adds enums, and importing enum (and what it imports) cost the keeper 0.7 MiB.
    import _signal as signal

try:  # imported now, not on the exit path (exit_like)
    import resource
except ImportError:  # pragma: no cover - not on Linux
    resource = None  # type: ignore[assignment]


class suppress:
    """`contextlib.suppress`, here so that the keeper need not import contextlib (and with it
    collections, functools, ...: each module costs the keeper's interpreter memory)."""

    __slots__ = ("_kinds",)

    def __init__(self, *kinds: type[BaseException]) -> None:
        self._kinds = kinds

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, value: object, traceback: object) -> bool:
        return kind is not None and issubclass(kind, self._kinds)


def _boottime_clock_id() -> int | None:
    """CLOCK_BOOTTIME's id, or None where it is missing or refused (as election/clock.py does)."""
    clock_id = getattr(time, "CLOCK_BOOTTIME", None)
    if clock_id is None:
        return None
    try:
        time.clock_gettime(clock_id)
    except OSError:
        return None
    return int(clock_id)


_CLOCK_ID = _boottime_clock_id()


def boottime() -> float:
    """CLOCK_BOOTTIME seconds (the daemon's election clock); the monotonic clock without it."""
    return time.monotonic() if _CLOCK_ID is None else time.clock_gettime(_CLOCK_ID)


#: The signal the kernel sends the keeper when the daemon (its parent thread) dies.
PARENT_DEATH_SIGNAL = signal.SIGUSR1
#: Longest single wait: select() sleeps on the monotonic clock, which stops during a suspend.
MAX_WAIT_S = 0.25
#: How often the tree is looked at again while it is being stopped.
STOP_POLL_S = 0.01
#: After the supervisor's SIGTERM to the group, how long the keeper waits for the command to exit
#: before it scans /proc for members outside the group (the scan would slow the dying command).
TERM_SCAN_DELAY_S = STOP_POLL_S
#: Written on the status pipe right before the keeper exits with its tree verified empty.
TREE_GONE = b"gone\n"
#: How much the keeper lowers its CPU priority (nice) after reporting its tree gone.
AFTER_REPORT_NICE_INCREMENT = 10
#: Comes with TREE_GONE (in the same write) when the command ran: its wait status, the one the
#: keeper is about to exit like, so that the daemon need not wait for the keeper's own exit.
EXIT_STATUS_PREFIX = b"status "
#: The longest validity line accepted; anything longer is garbage, not a deadline.
_MAX_LINE = 64
#: The start order: its header line's longest length, and the largest environment it may carry
#: (execve itself refuses more than a few MiB of environment).
_MAX_HEADER = 64
MAX_START_ENV = 16 * 1024 * 1024
#: A parked keeper looks at its parent this often even without a wake-up (PR_SET_PDEATHSIG may be
#: missing); signals and the pipe wake it at once.
PARKED_WAIT_S = 30.0
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36
EXIT_CANNOT_START = 127
#: The keeper's exit when the validity end it was given had passed before the command could start
#: (a fresh keeper given a past deadline; a parked one thawed after its order's): nothing ran.
EXIT_DEADLINE_PASSED = 124
#: Written on the status pipe (before TREE_GONE) when the keeper refused to start the command.
DEADLINE_PASSED = b"late\n"
#: The signal the kernel sends the command when the keeper (its parent) dies: nothing watches the
#: command any more, so it goes at once (the daemon kills the rest of the tree, see supervisor.py).
COMMAND_DEATH_SIGNAL = signal.SIGKILL


class DeadlinePassed(Exception):
    """The lease's validity end passed before the command was started: it must not start."""


class Schedule:
    """When the keeper must signal the command's tree. Pure: every method takes the time.

    `valid_until` is the latest validity end the daemon sent; `margin_s` how long after it the
    tree may live (the daemon's reserved stop time, minus the reap slack). So SIGKILL is due at
    `valid_until + margin_s` and SIGTERM one grace earlier. A stop that begins earlier (the
    daemon died, the supervisor's SIGTERM, the command exited) sends SIGTERM at once and SIGKILL
    one grace later, but never after the deadline. Once stopping, later validity ends are
    ignored: a command that was told to stop is not told to go on.
    """

    __slots__ = ("kill_grace_s", "margin_s", "stop_began_at", "valid_until")

    def __init__(self, *, valid_until: float, kill_grace_s: float, margin_s: float) -> None:
        for name, value in (("kill_grace_s", kill_grace_s), ("margin_s", margin_s)):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, not {value!r}")
        if not math.isfinite(valid_until):
            raise ValueError(f"valid_until must be a finite clock reading, not {valid_until!r}")
        self.kill_grace_s = kill_grace_s
        self.margin_s = margin_s
        self.valid_until = valid_until
        self.stop_began_at: float | None = None

    @property
    def stopping(self) -> bool:
        return self.stop_began_at is not None

    def extend(self, valid_until: float) -> bool:
        """A fresh validity end from the daemon; False when ignored (stopping, or not later)."""
        if self.stopping or not math.isfinite(valid_until) or valid_until <= self.valid_until:
            return False
        self.valid_until = valid_until
        return True

    def begin_stop(self, now: float) -> None:
        if self.stop_began_at is None:
            self.stop_began_at = now

    @property
    def deadline(self) -> float:
        """SIGKILL is due by then, whatever happens."""
        return self.valid_until + self.margin_s

    @property
    def term_at(self) -> float:
        scheduled = self.deadline - self.kill_grace_s
        return scheduled if self.stop_began_at is None else min(scheduled, self.stop_began_at)

    @property
    def kill_at(self) -> float:
        if self.stop_began_at is None:
            return self.deadline
        return min(self.deadline, self.stop_began_at + self.kill_grace_s)

    def due(self, now: float) -> signal.Signals | None:
        """The strongest signal due at `now`, if any."""
        if now >= self.kill_at:
            return signal.SIGKILL
        if now >= self.term_at:
            return signal.SIGTERM
        return None

    def wait_s(self, now: float) -> float:
        """How long the keeper may sleep before it must look again."""
        if now >= self.kill_at + 1.0:
            return 0.1  # a process stuck past SIGKILL (uninterruptible sleep): no need to spin
        if now >= self.term_at:
            return STOP_POLL_S  # the tree is being stopped: watch it go, and KILL on time
        return max(0.0, min(MAX_WAIT_S, self.term_at - now))


class LineReader:
    """Validity ends from the pipe: one decimal number a line; torn lines wait for their end."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[float]:
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        if len(self._buffer) > _MAX_LINE:
            self._buffer = b""  # no number is this long: drop it rather than grow
        values = []
        for line in lines:
            try:
                values.append(float(line))
            except ValueError:
                _log("keeper_bad_line", line=line[:_MAX_LINE].decode("ascii", "replace"))
        return values


def encode_start(valid_until: float, env: Mapping[str, str]) -> bytes:
    """The start order of a parked keeper: `start VALID_UNTIL SIZE\\n`, then SIZE bytes of
    environment, `KEY=VALUE` entries separated by NUL bytes (neither may hold a NUL)."""
    if not math.isfinite(valid_until):
        raise ValueError(f"valid_until must be a finite clock reading, not {valid_until!r}")
    entries = []
    for key, value in env.items():
        raw_key, raw_value = os.fsencode(key), os.fsencode(value)
        if not raw_key or b"=" in raw_key or b"\0" in raw_key or b"\0" in raw_value:
            raise ValueError(f"illegal environment variable {key!r}")
        entries.append(raw_key + b"=" + raw_value)
    payload = b"\0".join(entries)
    return b"start %s %d\n" % (repr(float(valid_until)).encode(), len(payload)) + payload


def exit_status_line(status: int) -> bytes:
    """The status pipe's line for the command's wait status (see EXIT_STATUS_PREFIX)."""
    return EXIT_STATUS_PREFIX + b"%d\n" % status


def decode_start(buffer: bytes) -> tuple[float, dict[str, str], bytes] | None:
    """(valid_until, environment, the bytes after the order) from what the pipe gave so far;
    None while the order is incomplete; ValueError when it is not one."""
    end = buffer.find(b"\n")
    if end < 0:
        if len(buffer) > _MAX_HEADER:
            raise ValueError("no start order header")
        return None
    words = buffer[:end].split(b" ")
    if len(words) != 3 or words[0] != b"start":
        raise ValueError("not a start order")
    try:
        valid_until, size = float(words[1]), int(words[2])
    except ValueError:
        raise ValueError("a start order takes a number and a size") from None
    if not math.isfinite(valid_until) or not 0 <= size <= MAX_START_ENV:
        raise ValueError("a start order's validity end or size is out of range")
    body = buffer[end + 1 :]
    if len(body) < size:
        return None
    env = {}
    for entry in body[:size].split(b"\0") if size else ():
        key, sep, value = entry.partition(b"=")
        if not sep or not key:
            raise ValueError("a start order's environment entry has no name")
        env[os.fsdecode(key)] = os.fsdecode(value)
    return valid_until, env, body[size:]


def _log(event: str, **fields: object) -> None:
    """One JSON line on stderr, like the daemon's own (numbers and plain words only)."""
    parts = [f'"event":"{event}"', '"logger":"elector.keeper"', f'"pid":{os.getpid()}']
    for key, value in fields.items():
        text = repr(value) if isinstance(value, int | float) else '"' + str(value).replace('"', "'") + '"'
        parts.append(f'"{key}":{text}')
    with suppress(OSError):
        os.write(2, ("{" + ",".join(parts) + "}\n").encode())


# -- the command's tree ------------------------------------------------------------------------


def _stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, ppid, pgid, sid) of a process, None when it is gone."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)  # a third of open()'s cost
        try:
            raw = os.read(fd, 4096)
        finally:
            os.close(fd)
        fields = raw[raw.rindex(b")") + 2 :].split()
        return fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[3])
    except (OSError, ValueError, IndexError):
        return None


def tree_of(me: int) -> list[tuple[int, int]]:
    """(pid, pgid) of the live processes of the command's tree, from one /proc snapshot: our
    group, our session, our children (reparented to us, the subreaper, when they escaped both),
    and the transitive closure of these (`closure`)."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    table: dict[int, tuple[str, int, int, int]] = {}
    for name in names:
        if name.isdigit() and int(name) != me:
            info = _stat(int(name))
            if info is not None:
                table[int(name)] = info
    # Zombies too: a dead group leader's group may still have live members.
    found = closure([me], ((pid, ppid, pgid, sid) for pid, (_, ppid, pgid, sid) in table.items()))
    found.discard(me)
    return [(pid, table[pid][2]) for pid in found if table[pid][0] not in ("Z", "X", "x")]


def closure(roots: Iterable[int], table: Iterable[tuple[int, int, int, int]]) -> set[int]:
    """The process tree's one definition, here and in the daemon (treestop.py): `roots` and,
    transitively, every process of `table` (pid, ppid, pgid, sid) reachable from one of them: its
    children, and the members of the group and session it leads (a group's or session's id is its
    leader's pid). So a chain of processes that each left the session while its parent lives is
    found whole, not one level per scan as its parents die."""
    related: dict[int, list[int]] = {}
    for pid, ppid, pgid, sid in table:
        for key in {ppid, pgid, sid}:
            related.setdefault(key, []).append(pid)
    found = set(roots)
    pending = list(found)
    while pending:
        for pid in related.get(pending.pop(), ()):
            if pid not in found:
                found.add(pid)
                pending.append(pid)
    return found


def _send(pid: int, sig: int) -> None:
    with suppress(OSError):  # gone meanwhile, or not ours to signal
        os.kill(pid, sig)


#: The C library, loaded once (a list, filled on first use).
_LIBC: list[object] = []


def _prctl(option: int, value: int) -> bool:
    """prctl(2) through ctypes; False where it is missing or refused. The C library is loaded
    once, in the keeper, so that the command's side of a fork only calls it."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        if not _LIBC:
            _LIBC.append(ctypes.CDLL(None, use_errno=True))
        args = (ctypes.c_ulong(value), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
        return bool(_LIBC[0].prctl(option, *args) == 0)  # type: ignore[attr-defined]
    except (OSError, AttributeError):
        return False


# -- the keeper process ------------------------------------------------------------------------


class Keeper:
    """The keeper's main loop. See the module doc."""

    def __init__(
        self,
        command: Sequence[str],
        *,
        schedule: Schedule,
        control_fd: int,
        parent_pid: int,
        status_fd: int | None = None,
    ) -> None:
        self.command = list(command)
        self.schedule = schedule
        self.control_fd: int | None = control_fd
        self.status_fd = status_fd
        #: Whether orphans of the tree are reparented to us (then children = the whole tree).
        self.subreaper = False
        self.parent_pid = parent_pid
        self.me = os.getpid()
        self.child_pid = 0
        self.child_status: int | None = None
        self.reason = ""
        self._term_seen = False
        self._parent_gone = False
        self._group_termed = False
        self._termed: set[int] = set()
        self._killed = False
        self._reader = LineReader()
        self._wake_r, self._wake_w = os.pipe()

    def _install_signals(self) -> None:
        os.set_blocking(self._wake_w, False)
        os.set_blocking(self._wake_r, False)
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)

        def on_term(signum: int, frame: object) -> None:
            self._term_seen = True

        def on_parent_death(signum: int, frame: object) -> None:
            self._parent_gone = True

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(PARENT_DEATH_SIGNAL, on_parent_death)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # only to wake select()
        for name in ("SIGINT", "SIGHUP"):  # the daemon's terminal is not the keeper's business
            signal.signal(getattr(signal, name), signal.SIG_IGN)

    def start(self) -> None:
        self.prepare()
        self.spawn()

    def prepare(self) -> None:
        """Everything before the spawn: signals, the pipe, subreaper and parent-death signal."""
        self._install_signals()
        if self.control_fd is not None:
            os.set_inheritable(self.control_fd, False)  # the command must not hold the daemon's pipe
            os.set_blocking(self.control_fd, False)
        if self.status_fd is not None:
            try:
                os.set_inheritable(self.status_fd, False)  # nor the status pipe: its EOF is ours
            except OSError:  # not open: report nothing (the daemon then scans for itself)
                self.status_fd = None
        self.subreaper = _prctl(_PR_SET_CHILD_SUBREAPER, 1)
        if _prctl(_PR_SET_PDEATHSIG, PARENT_DEATH_SIGNAL) and os.getppid() != self.parent_pid:
            self._parent_gone = True  # it died before the death signal was armed

    def spawn(self, env: Mapping[str, str] | None = None) -> None:
        """Start the command with `env` (ours by default) in our process group; DeadlinePassed,
        starting nothing, once the validity end has passed; OSError if it cannot be executed.

        fork and exec rather than posix_spawn, for what must happen in between: the command's
        PR_SET_PDEATHSIG towards us (our death, an OOM kill, kills it at once) and a last look
        at the clock right before the exec (a keeper frozen between the two looks at it here)."""
        if boottime() >= self.schedule.valid_until:
            raise DeadlinePassed
        command_env = os.environ if env is None else env
        error_r, error_w = os.pipe()  # close-on-exec: EOF means the exec went through
        # All signals blocked across the fork: the command's side resets them to their defaults
        # first, so that a SIGTERM sent to the group meanwhile is not lost in our handler.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        try:
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the command's side; it never returns
                self._exec_command(command_env, error_w)
        except OSError:
            os.close(error_r)
            raise
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            os.close(error_w)
        try:
            report = b""
            while chunk := os.read(error_r, 64):
                report += chunk
        finally:
            os.close(error_r)
        if not report:
            self.child_pid = pid
            return
        with suppress(ChildProcessError):
            os.waitpid(pid, 0)
        if report == DEADLINE_PASSED:
            raise DeadlinePassed
        code = int(report) if report.isdigit() else errno.EINVAL
        raise OSError(code, os.strerror(code))

    def _exec_command(self, env: Mapping[str, str], error_w: int) -> None:  # pragma: no cover - forked
        """The command's side of the fork: signals back to their defaults, the death signal
        towards us, the deadline looked at once more, then exec; never returns."""
        try:
            # Python itself ignores SIGPIPE and SIGXFSZ, and an ignored signal stays ignored across
            # exec: reset them as subprocess does, or `yes | head` in the command would spin on EPIPE.
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGTERM, PARENT_DEATH_SIGNAL, signal.SIGCHLD, signal.SIGINT, signal.SIGHUP,
                        signal.SIGPIPE, signal.SIGXFSZ):  # fmt: skip
                signal.signal(sig, signal.SIG_DFL)
            # Fires when we die (we are single-threaded: our only thread is the one that forked).
            # Cleared by the exec of a set-user-ID program: the daemon's kill covers that case.
            if _prctl(_PR_SET_PDEATHSIG, COMMAND_DEATH_SIGNAL) and os.getppid() != self.me:
                os._exit(EXIT_CANNOT_START)  # we died before it was armed: run nothing
            if boottime() >= self.schedule.valid_until:
                os.write(error_w, DEADLINE_PASSED)
                os._exit(EXIT_DEADLINE_PASSED)
            signal.pthread_sigmask(signal.SIG_SETMASK, [])
            os.execvpe(self.command[0], self.command, env)
        except OSError as exc:
            with suppress(OSError):
                os.write(error_w, b"%d" % (exc.errno or errno.EINVAL))
        except BaseException:
            with suppress(OSError):
                os.write(error_w, b"%d" % errno.EINVAL)
        os._exit(EXIT_CANNOT_START)

    def park(self) -> dict[str, str] | None:
        """Parked: wait for the start order, then take its validity end as the schedule's; the
        command's environment, or None (start nothing) after EOF, the parent's death, SIGTERM or
        a malformed order. Call after `prepare()`."""
        buffer = b""
        while True:
            if self._term_seen or self._parent_gone or os.getppid() != self.parent_pid:
                return None
            data = self._read_some()
            if data == b"":
                return None  # EOF: the daemon closed the pipe (or died) before any order
            if data:
                buffer += data
                try:
                    order = decode_start(buffer)
                except ValueError as exc:
                    _log("keeper_bad_start", error=str(exc))
                    raise
                if order is not None:
                    valid_until, env, rest = order
                    self.schedule = Schedule(
                        valid_until=valid_until,
                        kill_grace_s=self.schedule.kill_grace_s,
                        margin_s=self.schedule.margin_s,
                    )
                    for later in self._reader.feed(rest):  # renewals written right after the order
                        self.schedule.extend(later)
                    return env
                continue  # the rest of a long order may already be there
            self._wait(PARKED_WAIT_S)

    def _read_some(self) -> bytes | None:
        """What the pipe holds now (b"" at EOF), None when it holds nothing yet."""
        if self.control_fd is None:
            return b""
        while True:
            try:
                return os.read(self.control_fd, 65536)
            except BlockingIOError:
                return None
            except InterruptedError:
                continue
            except OSError:
                return b""

    def run(self) -> int:
        """Watch until the command and its tree are gone; the command's wait status."""
        while True:
            now = boottime()
            self._reap()
            self._read_control()
            if not self.schedule.stopping:
                why = self._stop_reason()
                if why:
                    self.reason = why
                    self.schedule.begin_stop(now)
                    if why == "daemon_gone":  # the other reasons are the daemon's to log
                        _log("keeper_stopping", reason=why, command_pid=self.child_pid)
            if self.child_status is not None and self._descendants_gone():
                self._report_gone()
                return self.child_status
            if self._scan_deferred(now):
                # The group has the supervisor's TERM: give it a moment to exit (each exit of a
                # child wakes us) before the scan for members outside the group.
                self._wait(min(self.schedule.wait_s(now), self.schedule.term_at + TERM_SCAN_DELAY_S - now))
                continue
            if self.child_status is not None or self.schedule.due(now) is not None:
                # The /proc scan is the costly part: only when the tree is being stopped.
                tree = tree_of(self.me)
                if self.child_status is not None and not tree:
                    # As a subreaper, an empty scan is proof too: the descendants that left the
                    # session and group were reparented to us when their parents died.
                    if self.subreaper:
                        self._report_gone()
                    return self.child_status
                self._act(now, tree)
            self._wait(self.schedule.wait_s(boottime()))

    def _scan_deferred(self, now: float) -> bool:
        """Whether the first scan of a stop that the supervisor's TERM began may wait a little."""
        return (
            self.reason == "terminated"
            and not self._group_termed
            and self.schedule.due(now) == signal.SIGTERM
            and now < self.schedule.term_at + TERM_SCAN_DELAY_S
        )

    def _descendants_gone(self) -> bool:
        """As a subreaper, whether no child is left (all reaped): then no process of the tree is
        (see the module doc). Cheaper than a /proc scan; False when it cannot tell."""
        if not self.subreaper:
            return False
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return True
            if pid == 0:
                return False  # a child still runs
            if pid == self.child_pid:
                self.child_status = status

    def _report_gone(self) -> None:
        """Tell the daemon the tree is gone, and the status we exit like: nothing runs after this
        but our own exit, so the daemon may go on at once (a keeper's exit takes milliseconds)."""
        status = b"" if self.child_status is None else exit_status_line(self.child_status)
        self.report(status + TREE_GONE)
        # What is left (our exit, the teardown of an interpreter) is not urgent; the daemon's
        # release, the next leader's acquire and its command's start on a shared host are.
        with suppress(OSError, AttributeError):
            os.nice(AFTER_REPORT_NICE_INCREMENT)

    def report(self, status: bytes) -> None:
        """Write `status` on the status pipe (if any): right before our exit."""
        if self.status_fd is not None:
            with suppress(OSError):
                os.write(self.status_fd, status)

    def _stop_reason(self) -> str:
        if self._parent_gone:
            return "daemon_gone"
        if self._term_seen:
            return "terminated"
        if self.child_status is not None:
            return "command_exited"
        return ""

    def _act(self, now: float, tree: list[tuple[int, int]]) -> None:
        sig = self.schedule.due(now)
        if sig is None:
            return
        if sig == signal.SIGKILL:
            if not self._killed:
                self._killed = True
                _log("keeper_kill", reason=self.reason or "deadline", remaining=len(tree))
            for pid, _ in tree:  # one by one: killpg would hit the keeper itself
                _send(pid, signal.SIGKILL)
            return
        if not self.reason:
            self.reason = "deadline"
            self.schedule.begin_stop(now)
            _log("keeper_stopping", reason="deadline", valid_until=self.schedule.valid_until)
        if not self._group_termed:
            self._group_termed = True
            if not self._term_seen:  # the supervisor's TERM already reached the whole group
                _send(-self.me, signal.SIGTERM)  # killpg: atomic for the group; we ignore it
        for pid, group in tree:
            # Moved to another group, or escaped: reached one by one, each once (also those
            # forked or found since the last look).
            if group != self.me and pid not in self._termed:
                self._termed.add(pid)
                _send(pid, signal.SIGTERM)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.child_pid:
                self.child_status = status

    def _read_control(self) -> None:
        while self.control_fd is not None:
            try:
                data = os.read(self.control_fd, 4096)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                data = b""
            if not data:
                os.close(self.control_fd)
                self.control_fd = None
                self._parent_gone = True
                return
            for valid_until in self._reader.feed(data):
                self.schedule.extend(valid_until)

    def _wait(self, timeout_s: float) -> None:
        fds = [self._wake_r] + ([self.control_fd] if self.control_fd is not None else [])
        with suppress(InterruptedError):
            select.select(fds, [], [], timeout_s)
        try:
            while os.read(self._wake_r, 512):
                pass
        except OSError:
            pass


def exit_like(status: int) -> None:
    """Leave the way the command did: its exit code, or death by its signal."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        with suppress(AttributeError, OSError, ValueError):  # AttributeError: no resource
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the command's core is not ours to dump
        signal.set_wakeup_fd(-1)
        with suppress(OSError, ValueError):  # SIGKILL's disposition cannot change
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)  # a signal that does not kill by default
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def parse_args(argv: Sequence[str]) -> tuple[dict[str, float], list[str]]:
    """`--control-fd N --parent-pid P (--valid-until T | --parked) --kill-grace-s G --margin-s M
    [--status-fd S] -- COMMAND...`; `--parked` shows as `values["parked"] == 1.0`."""
    if "--" not in argv:
        raise ValueError("no command: the arguments must end with -- COMMAND [ARGS...]")
    split = list(argv).index("--")
    options, command = list(argv[:split]), list(argv[split + 1 :])
    if not command:
        raise ValueError("the command after -- is empty")
    values: dict[str, float] = {}
    if "--parked" in options:
        options.remove("--parked")
        values["parked"] = 1.0
    names: tuple[str, ...] = ("--control-fd", "--parent-pid", "--kill-grace-s", "--margin-s")
    names += () if values else ("--valid-until",)
    while options:
        name = options.pop(0)
        if name not in (*names, "--status-fd") or not options:
            raise ValueError(f"unknown option or missing value: {name!r}")
        try:
            values[name[2:].replace("-", "_")] = float(options.pop(0))
        except ValueError:
            raise ValueError(f"{name} takes a number") from None
    missing = [name for name in names if name[2:].replace("-", "_") not in values]
    if missing:
        raise ValueError(f"missing {', '.join(missing)}")
    return values, command


def main(argv: Sequence[str]) -> None:
    try:
        values, command = parse_args(argv)
        parked = "parked" in values
        schedule = Schedule(
            # Parked: a stand-in, replaced by the start order's before anything runs.
            valid_until=boottime() if parked else values["valid_until"],
            kill_grace_s=values["kill_grace_s"],
            margin_s=values["margin_s"],
        )
    except ValueError as exc:
        _log("keeper_bad_arguments", error=str(exc))
        os._exit(2)
    status_fd = values.get("status_fd")
    keeper = Keeper(
        command,
        schedule=schedule,
        control_fd=int(values["control_fd"]),
        parent_pid=int(values["parent_pid"]),
        status_fd=None if status_fd is None else int(status_fd),
    )
    env = None
    try:
        keeper.prepare()
        if parked:
            try:
                env = keeper.park()
            except ValueError:
                os._exit(2)
            if env is None:
                os._exit(0)  # parked and never ordered to start: nothing ran, nothing to report
        keeper.spawn(env)
    except DeadlinePassed:
        _log(
            "keeper_deadline_passed",
            valid_until=keeper.schedule.valid_until,
            late_s=round(boottime() - keeper.schedule.valid_until, 3),
            detail="the command was not started",
        )
        keeper.report(DEADLINE_PASSED + TREE_GONE)
        os._exit(EXIT_DEADLINE_PASSED)
    except OSError as exc:
        _log("keeper_cannot_start", command=command[0], error=exc.strerror or str(exc))
        keeper.report(TREE_GONE)  # nothing runs: the fork that failed its exec was reaped
        os._exit(EXIT_CANNOT_START)
    exit_like(keeper.run())


if __name__ == "__main__":  # `python elector/daemon/execmode/keeper.py ...`; the daemon uses keeper_link.py
    main(sys.argv[1:])
