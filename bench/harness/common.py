"""Shared helpers: statistics, tables, results, child processes, daemons and their JSON logs.

Percentiles are NEAREST-RANK: the p-th percentile of n sorted values is the value at rank
ceil(p/100 * n) (1-based). With fewer than 100 values the p99 is therefore the maximum.
Medians are `statistics.median` (the mean of the two middle values when n is even).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import signal
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import redis

from elector.testing.redis_server import RedisServerProcess, free_tcp_port

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]
#: Polling of log files only detects an event; the timing comes from the log's own timestamp,
#: so a coarse period keeps the bench from competing with the daemons for the 2 cores.
POLL_S = 0.02


class BenchError(RuntimeError):
    """A benchmark could not produce its measurement (a process died, an event never came)."""


# -- statistics ------------------------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (see the module docstring)."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclasses.dataclass(frozen=True)
class Stats:
    n: int
    median: float
    p99: float
    max: float
    min: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Stats:
        return cls(len(values), statistics.median(values), percentile(values, 99), max(values), min(values))


# -- results and tables ----------------------------------------------------------------------


@dataclasses.dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[str]] = dataclasses.field(default_factory=list)

    def add(self, *cells: object) -> None:
        self.rows.append([str(cell) for cell in cells])

    def render(self) -> str:
        """A Markdown pipe table, padded so that it also reads well in a terminal."""
        widths = [len(h) for h in self.headers]
        for row in self.rows:
            widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]

        def line(cells: Sequence[str]) -> str:
            return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

        rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
        return "\n".join([f"**{self.title}**", "", line(self.headers), rule, *map(line, self.rows)])


@dataclasses.dataclass
class Target:
    what: str
    goal: str
    figure: str
    met: bool | None  # None: not measurable in this run
    #: Why a missed target is missed (what the profile or the protocol says), shown only when MISSED.
    reason: str = ""

    @property
    def verdict(self) -> str:
        return {True: "met", False: "MISSED", None: "not measured"}[self.met]

    @property
    def why(self) -> str:
        """`reason` of a missed target, else empty."""
        return self.reason if self.met is False else ""


@dataclasses.dataclass
class BenchResult:
    name: str
    title: str
    method: str  # what was measured, how, against which target
    tables: list[Table] = dataclasses.field(default_factory=list)
    targets: list[Target] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    #: PNGs (see bench/harness/plots.py) and their captions, shown in the module's section.
    images: list[tuple[Path, str]] = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None
    #: The module that measured it, from the repository's root (`bench/lease/takeover.py`): set by the
    #: runner, named in the module's section of docs/benchmarks.md.
    source: str = ""


# -- child processes -------------------------------------------------------------------------

_CHILDREN: list[subprocess.Popen[bytes]] = []


def spawn(
    argv: Sequence[str], *, log_path: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start a child in its own session (so its whole process group can be signalled)."""
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
    _CHILDREN.append(proc)
    return proc


def signal_group(proc: subprocess.Popen[bytes], signum: int) -> None:
    """Signal the child's process group; after the leader is reaped only if its PID is unused.

    A reaped leader's PID can be reused only once its group is empty, so when /proc/PID is gone
    the group still holds only orphans of ours (e.g. an etcdctl's `sleep`)."""
    if proc.poll() is not None and Path(f"/proc/{proc.pid}").exists():
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signum)


def stop(proc: subprocess.Popen[bytes], *, signum: int = signal.SIGTERM, timeout_s: float = 5.0) -> None:
    """Signal the group, wait, then SIGKILL it; also removes orphans left in the group."""
    signal_group(proc, signum)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        signal_group(proc, signal.SIGKILL)
        proc.wait(timeout=timeout_s)
    signal_group(proc, signal.SIGKILL)
    with contextlib.suppress(ValueError):
        _CHILDREN.remove(proc)


def stop_all() -> None:
    """Kill every child this run started and has not stopped yet (called on any exit)."""
    for proc in list(_CHILDREN):
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            stop(proc, signum=signal.SIGKILL, timeout_s=3.0)
    _CHILDREN.clear()


def wait_until(predicate: Callable[[], T | None], *, timeout_s: float, what: str) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise BenchError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(POLL_S)


def sleep_until_wall(when: float) -> None:
    remaining = when - time.time()
    if remaining > 0:
        time.sleep(remaining)


# -- JSON logs -------------------------------------------------------------------------------


def parse_timestamp(text: str) -> float:
    """Epoch seconds of structlog's ISO UTC timestamp, e.g. 2026-11-21T21:43:22.255272Z."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def read_json_log(path: Path) -> list[dict[str, Any]]:
    """Complete JSON lines of a log file; a half-written last line is skipped until next time."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return []
    lines = []
    for raw in text.splitlines():
        with contextlib.suppress(ValueError):
            entry = json.loads(raw)
            if isinstance(entry, dict):
                lines.append(entry)
    return lines


class Daemon:
    """One `<python> -m elector run` child with a JSON log file of its own."""

    def __init__(
        self,
        *,
        python: str,
        redis_url: str,
        lock: str,
        identity: str,
        ttl: str,
        log_path: Path,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.identity = identity
        self.log_path = log_path
        self.argv = [
            python, "-m", "elector", "run",
            "--redis-url", redis_url,
            "--lock", lock,
            "--identity", identity,
            "--ttl", ttl,
            "--http-address", f"127.0.0.1:{free_tcp_port()}",
            "--log-format", "json",
            *extra_args,
        ]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None
        self.spawned_at = 0.0  # wall clock taken right before Popen

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> Daemon:
        self.log_path.unlink(missing_ok=True)
        self.spawned_at = time.time()
        self.proc = spawn(self.argv, log_path=self.log_path)
        return self

    def event(self, name: str) -> dict[str, Any] | None:
        """The first log line of this event, or None; raises if the process died meanwhile."""
        for entry in read_json_log(self.log_path):
            if entry.get("event") == name:
                return entry
        if self.proc is not None and self.proc.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-2000:]
            raise BenchError(f"{self.identity} exited with {self.proc.returncode} before {name!r}:\n{tail}")
        return None

    def wait_event(self, name: str, *, timeout_s: float) -> float:
        """Epoch seconds of the event's log timestamp."""
        entry = wait_until(lambda: self.event(name), timeout_s=timeout_s, what=f"{self.identity}: {name}")
        return parse_timestamp(entry["timestamp"])

    def wait_following(self, *, timeout_s: float = 15.0) -> None:
        """A follower logs `new_leader_observed` at its first look at the lock: it is subscribed."""
        self.wait_event("new_leader_observed", timeout_s=timeout_s)

    def stop(self, *, signum: int = signal.SIGTERM) -> None:
        if self.proc is not None:
            stop(self.proc, signum=signum)


# -- Redis -----------------------------------------------------------------------------------


class RedisLab:
    """A private redis-server on a free port plus a redis-py client to seed and inspect it."""

    def __init__(self, binary: str | None = None) -> None:
        self.server = RedisServerProcess(binary=binary)
        self.client: redis.Redis | None = None

    def __enter__(self) -> RedisLab:
        self.server.start()
        self.client = redis.Redis.from_url(self.server.url, socket_timeout=5)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.client is not None:
            self.client.close()
        self.server.stop()

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def redis(self) -> redis.Redis:
        assert self.client is not None
        return self.client

    def seed(self, lock: str) -> None:
        """Make LOCK an "already used" lock: a brand-new one has a one-ttl quiet period by design."""
        # The counter, and the run_id of this server as recorded at a grant (see the ACQUIRE script).
        self.redis.set(f"elector:{{{lock}}}:fencing", 1)
        self.redis.set(f"elector:{{{lock}}}:server", self.redis.info("server")["run_id"])

    def lock_free(self, lock: str) -> bool:
        return not self.redis.exists(f"elector:{{{lock}}}:lease")
