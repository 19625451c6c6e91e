"""The workload of the peers benchmark, the same for every system: three candidates, crash trials,
graceful trials and an idle window; and the spawn floor of CMD.

All times end at a CMD's journal line (`time.time()` written by CMD as its first act) and start
at the wall clock taken right before `os.kill` (or Popen, for the floor): one host clock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import signal
import statistics
import subprocess
import time
from pathlib import Path

from bench.harness.common import BenchError, sleep_until_wall, stop, wait_until
from bench.peers.probes import (
    RedisMonitor,
    cpu_seconds,
    local_tcp_ports,
    process_tree,
    requests_of,
    rss_kib,
)
from bench.peers.systems import TTL_S, WORK, Candidate, System

N_CANDIDATES = 3
READY_TIMEOUT_S = 30.0
#: A takeover longer than this is a failure of the run, not a sample.
EVENT_TIMEOUT_S = 20.0


@dataclasses.dataclass(frozen=True)
class Line:
    t: float
    pid: int
    cid: str


def read_journal(path: Path) -> list[Line]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    lines = []
    for raw in text.splitlines():
        parts = raw.split()
        if len(parts) == 3:
            lines.append(Line(float(parts[0]), int(parts[1]), parts[2]))
    return lines


def _next_line(path: Path, after: int, *, not_from: str, what: str) -> Line:
    def found() -> Line | None:
        return next((line for line in read_journal(path)[after:] if line.cid != not_from), None)

    return wait_until(found, timeout_s=EVENT_TIMEOUT_S, what=what)


def kill_orphan(line: Line, journal: Path) -> None:
    """SIGKILL a killed candidate's CMD if it still runs (checked by its command line, since the
    PID may have been reused)."""
    try:
        cmdline = Path(f"/proc/{line.pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return
    if str(WORK).encode() in cmdline and str(journal).encode() in cmdline:
        with contextlib.suppress(ProcessLookupError):
            os.kill(line.pid, signal.SIGKILL)


class Cluster:
    """The candidates of one system, the first of which is started alone and leads."""

    def __init__(self, system: System) -> None:
        self.system = system
        self.candidates: dict[str, Candidate] = {}
        self.incarnations: dict[str, int] = {}

    def start(self) -> None:
        ids = [f"c{i}" for i in range(N_CANDIDATES)]
        self._spawn(ids[0])
        first = self.candidates[ids[0]]

        def first_line() -> Line | None:
            lines = read_journal(self.system.journal)
            if lines:
                return lines[0]
            first.ready()  # raises, with its log's tail, if the candidate died
            return None

        wait_until(first_line, timeout_s=EVENT_TIMEOUT_S, what=f"{self.system.key}: the first leader's CMD")
        for cid in ids[1:]:
            self._spawn(cid)
        self.wait_ready()

    def _spawn(self, cid: str) -> None:
        incarnation = self.incarnations.get(cid, -1) + 1
        self.incarnations[cid] = incarnation
        self.candidates[cid] = self.system.spawn(cid, incarnation)

    def leader_line(self) -> Line:
        lines = read_journal(self.system.journal)
        if not lines:
            raise BenchError(f"{self.system.key}: no CMD has run")
        return lines[-1]

    def waiters(self) -> list[Candidate]:
        leader = self.leader_line().cid
        return [c for cid, c in self.candidates.items() if cid != leader]

    def wait_ready(self) -> None:
        wait_until(
            lambda: self.system.waiters_ready(self.waiters()),
            timeout_s=READY_TIMEOUT_S,
            what=f"{self.system.key}: the waiters to queue",
        )

    def replace(self, cid: str) -> None:
        """Stop what is left of CID (its process group) and start it again as a waiter."""
        stop(self.candidates[cid].proc, signum=signal.SIGKILL)
        self._spawn(cid)

    def close(self) -> None:
        for candidate in self.candidates.values():
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                stop(candidate.proc)
        for line in read_journal(self.system.journal):
            kill_orphan(line, self.system.journal)


def crash_trials(cluster: Cluster, *, runs: int, rng: random.Random) -> list[float]:
    """SIGKILL the leader at a random point of its term; time to the next CMD's journal line."""
    journal = cluster.system.journal
    samples = []
    for _ in range(runs):
        cluster.wait_ready()
        leader_line = cluster.leader_line()
        # Uniform over one ttl after it took over: every system renews at least once a ttl, so
        # this covers every phase of its renewal cycle.
        kill_at = leader_line.t + rng.uniform(0.1, TTL_S)
        if kill_at < time.time() + 0.02:
            kill_at = time.time() + rng.uniform(0.1, TTL_S)
        sleep_until_wall(kill_at)
        before = len(read_journal(journal))
        leader = cluster.candidates[leader_line.cid]
        killed_at = time.time()
        os.kill(leader.proc.pid, signal.SIGKILL)
        line = _next_line(journal, before, not_from=leader.cid, what=f"{cluster.system.key}: crash takeover")
        samples.append(line.t - killed_at)
        kill_orphan(leader_line, journal)
        cluster.replace(leader.cid)
    return samples


def graceful_trials(cluster: Cluster, *, runs: int, rng: random.Random) -> list[float]:
    """Graceful stop of the leader; time to the next CMD's journal line."""
    journal = cluster.system.journal
    samples = []
    for _ in range(runs):
        cluster.wait_ready()
        time.sleep(rng.uniform(0.2, 0.6))  # not at one phase of anything
        leader_line = cluster.leader_line()
        before = len(read_journal(journal))
        leader = cluster.candidates[leader_line.cid]
        signalled_at = time.time()
        cluster.system.graceful_stop(leader, cmd_pid=leader_line.pid)
        line = _next_line(journal, before, not_from=leader.cid, what=f"{cluster.system.key}: handoff")
        samples.append(line.t - signalled_at)
        try:
            leader.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            raise BenchError(f"{cluster.system.key}: the stopped leader did not exit in 10 s") from None
        cluster.replace(leader.cid)
    return samples


@dataclasses.dataclass(frozen=True)
class Idle:
    requests_per_s: float  # per waiter (mean of the waiters)
    rss_mib: float  # per waiter, its process tree
    cpu_percent: float  # per waiter, of one core
    method: str


def idle_window(cluster: Cluster, *, seconds: float, alone_seconds: float) -> Idle:
    """One holder and two waiters left alone for SECONDS.

    Redis systems: the waiters' own commands, attributed through MONITOR. etcd and ZooKeeper: the
    server's total over the window minus the holder's own rate, measured afterwards over
    ALONE_SECONDS with the waiters stopped, split evenly between the waiters."""
    system = cluster.system
    cluster.wait_ready()
    time.sleep(1.0)  # past the waiters' start-up requests
    waiters = cluster.waiters()
    trees = [process_tree(w.proc.pid) for w in waiters]
    monitor = RedisMonitor(*system.redis_address()) if system.monitor else None
    total_before = None if monitor else system.request_total()
    cpu_before = [cpu_seconds(tree) for tree in trees]
    started = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - started
    cpu_after = [cpu_seconds(tree) for tree in trees]
    rss = [rss_kib(tree) / 1024 for tree in trees]
    cpu = [100 * (after - before) / elapsed for before, after in zip(cpu_before, cpu_after, strict=True)]
    if monitor is not None:
        counts = monitor.close()
        per_waiter = [requests_of(counts, local_tcp_ports(tree)) / elapsed for tree in trees]
        rate = statistics.mean(per_waiter)
        method = "MONITOR, per client"
    else:
        assert total_before is not None
        both = (system.request_total() - total_before) / elapsed
        for waiter in waiters:
            stop(waiter.proc, signum=signal.SIGKILL)
        time.sleep(0.5)
        alone_before = system.request_total()
        alone_started = time.monotonic()
        time.sleep(alone_seconds)
        alone = (system.request_total() - alone_before) / (time.monotonic() - alone_started)
        rate = max(0.0, (both - alone) / len(waiters))
        method = f"server total {both:.2f}/s with 2 waiters - {alone:.2f}/s holder alone, / 2"
    return Idle(rate, statistics.mean(rss), statistics.mean(cpu), method)


def spawn_floor(cmd: list[str], journal: Path, *, runs: int) -> list[float]:
    """Popen of CMD -> its journal line, each run with a fresh journal."""
    samples = []
    for _ in range(runs):
        journal.unlink(missing_ok=True)
        started = time.time()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
        try:
            line = wait_until(
                lambda: next(iter(read_journal(journal)), None), timeout_s=10, what="CMD's journal line"
            )
        finally:
            proc.terminate()
            proc.wait(timeout=10)
        samples.append(line.t - started)
    return samples
