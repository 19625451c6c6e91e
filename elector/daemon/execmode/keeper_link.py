"""The daemon's end of a keeper (elector/daemon/execmode/keeper.py): the argv that starts it, and
the pipe that feeds it validity ends - or, for a parked keeper, first the start order.

keeper.py runs as a process of its own, with nothing of `elector` importable; this module is
the part the daemon imports.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import sys
from collections.abc import Callable, Mapping, Sequence

from elector.daemon.execmode import keeper as _keeper
from elector.daemon.execmode.keeper import (
    DEADLINE_PASSED,
    EXIT_STATUS_PREFIX,
    TREE_GONE,
    Schedule,
    encode_start,
)

#: Loads keeper.py in a bare interpreter (-I: no environment, -S: no site-packages) through the
#: import system, so that its cached bytecode is used, under a name of its own (not `elector`).
#: importlib.machinery's loader, not importlib.util: util imports contextlib, functools, types...
#: (memory the keeper would carry) that the keeper does not need.
_BOOTSTRAP = (
    "import sys, importlib.machinery as machinery; path = sys.argv.pop(1); "
    "keeper = type(sys)('elector_keeper'); keeper.__file__ = path; "
    "machinery.SourceFileLoader('elector_keeper', path).exec_module(keeper); keeper.main(sys.argv[1:])"
)
_KEEPER_PATH = os.path.abspath(_keeper.__file__)
#: A pipe's default capacity: an order up to this size goes into an empty pipe in one write.
_PIPE_CAPACITY = 65536
#: The most the status pipe is read: the keeper writes a few short lines at most.
_STATUS_MAX = 128


class KeeperLink:
    """The daemon's end of one keeper: the argv that starts it, and the pipe that feeds it.

    Make one per run of the command; pass `pass_fds` to the child and call `spawned()` after the
    spawn. `tree_gone()` tells whether the keeper reported its tree empty (see keeper.py), and
    `reported_exit_code()` the status it reported with it; `watch_report()` calls back as soon as
    the report (or the pipe's EOF) comes, from the event loop.
    `send` never blocks: a full pipe (a keeper that does not read) drops the update, which can
    only make the keeper stop the command earlier.

    `KeeperLink.parked()` makes the link of a parked keeper: it starts nothing until `launch()`
    hands it the first validity end and the command's environment.
    """

    def __init__(self, *, valid_until: float, kill_grace_s: float, margin_s: float) -> None:
        Schedule(valid_until=valid_until, kill_grace_s=kill_grace_s, margin_s=margin_s)  # checks them
        #: The last validity end the keeper was given; None while a parked keeper waits for launch().
        self.valid_until: float | None = valid_until
        self.kill_grace_s = kill_grace_s
        self.margin_s = margin_s
        self.read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)
        #: The keeper -> daemon status pipe: the keeper writes TREE_GONE on it before it exits.
        self._status_fd, self.status_write_fd = os.pipe()
        os.set_blocking(self._status_fd, False)
        self._status = b""
        self._status_eof = False
        #: The event loop watching the status pipe for `watch_report`, and what it calls.
        self._report_loop: asyncio.AbstractEventLoop | None = None
        self._on_report: Callable[[], None] | None = None
        self.dropped = 0

    @classmethod
    def parked(cls, *, kill_grace_s: float, margin_s: float) -> KeeperLink:
        link = cls(valid_until=0.0, kill_grace_s=kill_grace_s, margin_s=margin_s)
        link.valid_until = None
        return link

    @property
    def waiting(self) -> bool:
        """A parked keeper's link before `launch()`."""
        return self.valid_until is None

    @property
    def closed(self) -> bool:
        return self._write_fd < 0

    @property
    def pass_fds(self) -> tuple[int, ...]:
        """The keeper's ends of the pipes, for the spawn (empty once `spawned()`)."""
        return tuple(fd for fd in (self.read_fd, self.status_write_fd) if fd >= 0)

    def tree_gone(self) -> bool:
        """Whether the keeper reported that its command's whole tree is gone (it writes that
        right before it exits, so nothing of the tree can run any more). Never blocks."""
        self._read_status()
        return TREE_GONE in self._status

    def deadline_passed(self) -> bool:
        """Whether the keeper refused to start the command: its validity end had passed."""
        self._read_status()
        return DEADLINE_PASSED in self._status

    def reported_exit_code(self) -> int | None:
        """The command's exit code as asyncio would report the keeper's (negative: the killing
        signal), from the keeper's report of its tree gone; None before that report, or when it
        came without a status (nothing ran). Never blocks."""
        if not self.tree_gone():
            return None
        for line in self._status.split(b"\n"):
            if line.startswith(EXIT_STATUS_PREFIX):
                try:
                    return os.waitstatus_to_exitcode(int(line[len(EXIT_STATUS_PREFIX) :]))
                except ValueError:
                    return None
        return None

    def watch_report(self, on_report: Callable[[], None]) -> None:
        """Call `on_report` (from the running event loop) once the keeper reported its tree gone,
        or its end of the status pipe closed without that (a keeper killed); at once if either
        is known already. Until `unwatch_report()` or `close()`."""
        self._read_status()
        if self._status_final or self._status_fd < 0:
            on_report()
            return
        self._on_report = on_report
        if self._report_loop is None:
            self._report_loop = asyncio.get_running_loop()
            self._report_loop.add_reader(self._status_fd, self._status_readable)

    def unwatch_report(self) -> None:
        self._on_report = None
        if self._report_loop is not None:
            self._report_loop.remove_reader(self._status_fd)
            self._report_loop = None

    @property
    def _status_final(self) -> bool:
        """Nothing more will be read from the status pipe (or nothing more is wanted)."""
        return TREE_GONE in self._status or self._status_eof or len(self._status) >= _STATUS_MAX

    def _status_readable(self) -> None:
        self._read_status()
        if self._status_final:
            on_report = self._on_report
            self.unwatch_report()  # EOF stays readable: the loop would spin
            if on_report is not None:
                on_report()

    def _read_status(self) -> None:
        while TREE_GONE not in self._status and self._status_fd >= 0 and len(self._status) < _STATUS_MAX:
            try:
                data = os.read(self._status_fd, _STATUS_MAX)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:
                self._status_eof = True
                break
            self._status += data

    def argv(self, command: Sequence[str]) -> list[str]:
        timing = ["--parked"] if self.valid_until is None else ["--valid-until", repr(self.valid_until)]
        return [
            sys.executable, "-I", "-S", "-c", _BOOTSTRAP, _KEEPER_PATH,
            "--control-fd", str(self.read_fd),
            "--status-fd", str(self.status_write_fd),
            "--parent-pid", str(os.getpid()),
            *timing,
            "--kill-grace-s", repr(self.kill_grace_s),
            "--margin-s", repr(self.margin_s),
            "--", *command,
        ]  # fmt: skip

    def spawned(self) -> None:
        """The keeper holds its ends now: ours must go, or their EOFs would never come."""
        if self.read_fd >= 0:
            os.close(self.read_fd)
            self.read_fd = -1
        if self.status_write_fd >= 0:
            os.close(self.status_write_fd)
            self.status_write_fd = -1

    def launch(self, *, valid_until: float, env: Mapping[str, str]) -> bool:
        """Order a parked keeper to start the command: one write, never blocking. False when it
        could not take the whole order (gone, or the order too large): then the link is closed,
        so the keeper sees EOF and exits without starting anything."""
        if not self.waiting or self.closed:
            return False
        order = encode_start(valid_until, env)
        if len(order) > _PIPE_CAPACITY:
            with contextlib.suppress(OSError, AttributeError):  # capped by /proc/sys/fs/pipe-max-size
                fcntl.fcntl(self._write_fd, fcntl.F_SETPIPE_SZ, len(order))
        try:
            written = os.write(self._write_fd, order)
        except OSError:
            written = -1
        if written != len(order):  # half an order is no order: EOF will end the keeper
            self.close()
            return False
        self.valid_until = valid_until
        return True

    def send(self, valid_until: float) -> bool:
        """Hand the keeper a fresh validity end; False if it could not take it now."""
        if self.closed or self.valid_until is None or valid_until <= self.valid_until:
            return False
        try:
            os.write(self._write_fd, f"{valid_until!r}\n".encode())  # < PIPE_BUF: all or nothing
        except OSError:  # full (BlockingIOError), or the keeper is gone (BrokenPipeError)
            self.dropped += 1
            return False
        self.valid_until = valid_until
        return True

    def close(self) -> None:
        """Close our ends; `tree_gone()` keeps what it read (the stop asks after the close)."""
        self._read_status()
        self.unwatch_report()
        self.spawned()
        if self._write_fd >= 0:
            os.close(self._write_fd)
            self._write_fd = -1
        if self._status_fd >= 0:
            os.close(self._status_fd)
            self._status_fd = -1
