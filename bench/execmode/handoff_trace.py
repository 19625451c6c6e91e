"""handoff_trace: where a graceful handoff's milliseconds go: exec mode, SIGTERM to the leader's
daemon until the new leader's command writes its first line.

A benchmark of `python -m bench` (the runtime-only venv run the image's way), and a tool:

    python -m bench.execmode.handoff_trace [--python PY] [--runs N] [--perf FILE]

Two `elector run --ttl 2s -- CMD` daemons on a private redis-server, CMD the peers benchmark's
work command (bench/peers/candidates/work.py: its first act journals `time.time()`). Each run
SIGTERMs the leader and collects, on the host's one wall clock:

- the signal (`time.time()` right before `os.kill`);
- the old daemon's `shutting_down` (signal handled) and `command_stopped` (its command's tree
  gone: the keeper reported it and exited) log lines;
- the release script and the new leader's acquire script as Redis ran them (MONITOR's
  timestamps, the same clock);
- the new daemon's `command_started` line (start order written to its parked keeper);
- the new command's journal line.

It prints each step's median over the runs, beside the spawn floor (Popen of CMD -> its journal
line) measured in the same process. `--perf FILE` traces the last run with `perf trace -a`
(kernel tracepoints: no ptrace stops) and writes the system calls of the processes taking part
(bench, daemons and their threads, keepers, commands, redis-server) to FILE, one clock from the
kill() to the journal write(); perf's own load makes that run slower than the others.

`--python` defaults to this venv's; the peers benchmark runs the runtime-only venv the image's
way (PYTHONOPTIMIZE=2): pass bench.harness.context's `python-as-image` wrapper to match it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.harness.common import (
    BenchError,
    BenchResult,
    Daemon,
    RedisLab,
    Table,
    parse_timestamp,
    read_json_log,
    wait_until,
)
from bench.harness.context import Context
from bench.peers.probes import process_tree
from bench.peers.systems import work_cmd
from bench.peers.trials import read_journal, spawn_floor

NAME = "handoff_trace"
LOCK = "bench-trace"
STEPS = (
    ("signal handled (old daemon: shutting_down)", "shutting_down"),
    ("old command's tree gone (old daemon: command_stopped)", "command_stopped"),
    ("release script run (Redis)", "release"),
    ("acquire script run (Redis, new leader)", "acquire"),
    ("start order written to the parked keeper (new daemon: command_started)", "command_started"),
    ("new command's first line (journal)", "journal"),
)


METHOD = (
    "Two `elector run --ttl 2s -- CMD` daemons ({venv}) on a private redis-server; CMD is the peers "
    "benchmark's work command (`python -I -S work.py`, whose first act journals `time.time()`). Each "
    "handoff SIGTERMs the leader and reads, on the host's one wall clock: the old daemon's "
    "`shutting_down` and `command_stopped` log lines, the release and acquire scripts as Redis ran them "
    "(MONITOR), the new daemon's `command_started` line and the new command's journal line; the spawn "
    "floor (Popen of CMD -> its journal line) is sampled after each handoff, once the restarted daemon "
    "follows again (before issue 25 it was sampled beside that daemon's start, and came out high). What "
    "each step holds, from one handoff traced with `python -m bench.execmode.handoff_trace --perf FILE` "
    "(perf trace -a: every system call of the processes taking part, one clock): "
    "(1) signal handled: the daemon's signal handler and the election's stop request. "
    "(2) old tree gone: the supervisor's killpg(SIGTERM) reaches the command and its keeper about 1-2 ms "
    "after the signal; the command dies at once, the keeper reaps it and writes TREE_GONE, with the "
    "command's exit status, on its status pipe, which the daemon's loop watches: the daemon goes on at "
    "once and scans nothing. Before, it went on only once it had seen the keeper's own exit (through a "
    "pidfd, and on Python 3.11 a child-watcher thread that then wanted the GIL back): an interpreter's "
    "teardown and one more wake-up later; now the keeper exits at nice +10 and the daemon waits for "
    "that exit after the release. "
    "(3) release: one EVALSHA, which also publishes `released`. Before issue 25 two things sat here: "
    "the orphan reaper's SIGCHLD sweep read every process's /proc stat (6-20 ms on this shared host), "
    "and a daemon's first release met NOSCRIPT (EVALSHA, SCRIPT LOAD, EVALSHA again: two more round "
    "trips). Now a sweep looks with waitid(WNOWAIT) first and scans only for a zombie, and the term's "
    "scripts are loaded once per client after the first answered acquire. "
    "(4) acquire: the follower's pub/sub connection delivers `released` (no polling); it sends ACQUIRE "
    "at once (a lone call is not held back by the script batcher). "
    "(5) start order: the grant, on_started_leading, and one write of the start order (validity end "
    "and environment) to the keeper parked while following: no interpreter starts here. "
    "(6) first line: the parked keeper reads the order, forks, the child resets its signals, arms "
    "PR_SET_PDEATHSIG, looks at the deadline once more and execs CMD; then CMD's own interpreter starts, "
    "which is the spawn floor. Before issue 25 the old daemon's interpreter teardown (0.1-0.5 s of "
    "CPU without a system call, after its last log line) also ran during this step, beside the new "
    "command's start on a shared host; a daemon with no thread to join now leaves with os._exit after "
    "its atexit handlers, and the rest of its shutdown after the release (~5 ms of CPU, traced) runs "
    "at nice +10. The safety order is kept throughout: the release goes out only after "
    "the old tree is gone, and the new command only after the new grant. On this 2-core machine, "
    "shared and loaded, most of each step is waiting for a CPU: compare steps with the floor of the "
    "same run."
)


class Monitor:
    """Wall-clock times of the EVALSHA calls Redis ran, by the connection that sent them."""

    def __init__(self, port: int) -> None:
        self._sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self._sock.sendall(b"MONITOR\r\n")
        self._file = self._sock.makefile("rb")
        self._file.readline()
        self._sock.settimeout(None)
        self.calls: list[tuple[float, str, str]] = []  # (time, client address, sha)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            for raw in self._file:
                parts = raw.decode(errors="replace").split(" ", 4)
                if len(parts) >= 5 and parts[3] == '"EVALSHA"':
                    self.calls.append((float(parts[0][1:]), parts[2].rstrip("]"), parts[4][1:41]))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(timeout=5)


def _sha(script: str) -> str:
    import hashlib

    return hashlib.sha1(script.encode()).hexdigest()


def _event_time(daemon: Daemon, name: str, after: float) -> float | None:
    for entry in read_json_log(daemon.log_path):
        if entry.get("event") == name:
            t = parse_timestamp(entry["timestamp"])
            if t >= after:
                return t
    return None


def one_handoff(
    lab: RedisLab, leader: Daemon, waiters: list[Daemon], journal: Path, *, perf_to: Path | None
) -> tuple[dict[str, float], Daemon]:
    """SIGTERM the leader; the steps' times after the signal, in seconds, and the new leader."""
    from elector.backend.lua import lease as scripts

    for waiter in waiters:
        waiter.wait_following()
    time.sleep(0.3)
    before = len(read_journal(journal))
    monitor = Monitor(lab.server.port)
    pids = _pids_of(lab, leader, *waiters)
    perf = _start_perf(perf_to)
    by_identity = {waiter.identity: waiter for waiter in waiters}
    try:
        signalled_at = time.time()
        os.kill(leader.pid, signal.SIGTERM)
        line = wait_until(
            lambda: next((x for x in read_journal(journal)[before:] if x.cid in by_identity), None),
            timeout_s=20,
            what="the new command's journal line",
        )
        follower = by_identity[line.cid]
        assert leader.proc is not None
        leader.proc.wait(timeout=10)
        time.sleep(0.05)
    finally:
        monitor.close()
        if perf is not None:
            perf.send_signal(signal.SIGINT)
            perf.wait(timeout=30)
    steps: dict[str, float] = {"journal": line.t - signalled_at}
    for name in ("shutting_down", "command_stopped"):
        if (t := _event_time(leader, name, signalled_at)) is not None:
            steps[name] = t - signalled_at
    if (t := _event_time(follower, "command_started", signalled_at)) is not None:
        steps["command_started"] = t - signalled_at
    release, acquire = _sha(scripts.RELEASE), _sha(scripts.ACQUIRE)
    for t, _, sha in monitor.calls:
        if t < signalled_at:
            continue
        if sha == release and "release" not in steps:
            steps["release"] = t - signalled_at
        if sha == acquire and "release" in steps and "acquire" not in steps:
            steps["acquire"] = t - signalled_at
    if perf_to is not None:
        _keep_ours(perf_to, pids=pids | {line.pid})
    return steps, follower


def _start_perf(path: Path | None) -> subprocess.Popen[bytes] | None:
    if path is None:
        return None
    if shutil.which("perf") is None:
        raise SystemExit("--perf needs perf (linux-perf)")
    proc = subprocess.Popen(
        ["perf", "trace", "-a", "-o", str(path.with_suffix(".all"))], stderr=subprocess.DEVNULL
    )
    time.sleep(1.0)  # perf attaches its tracepoints
    return proc


def _pids_of(lab: RedisLab, *daemons: Daemon) -> set[int]:
    """Us, redis-server, the daemons' trees (keepers, the old command) and all their threads."""
    pids = {os.getpid(), lab.server.pid}
    for daemon in daemons:
        pids.update(process_tree(daemon.pid))
    for pid in list(pids):
        with contextlib.suppress(OSError):
            pids.update(int(tid) for tid in os.listdir(f"/proc/{pid}/task"))
    return pids


def _keep_ours(path: Path, *, pids: set[int]) -> None:
    """FILE: the lines of `pids` and of the processes and threads they cloned, from our kill() on."""
    raw = path.with_suffix(".all").read_text(errors="replace").splitlines()
    ours = set(pids)
    changed = True
    while changed:  # children and threads: `clone(...) = PID` lines of a process of ours
        changed = False
        for text in raw:
            who = _who(text)
            if who in ours and "clone" in text and "= " in text:
                tail = text.rsplit("= ", 1)[1].split()[0]
                if tail.isdigit() and int(tail) not in ours:
                    ours.add(int(tail))
                    changed = True
    kept, started = [], None
    for text in raw:
        if _who(text) not in ours:
            continue
        try:
            at = float(text.split()[0])
        except ValueError:  # "? ( ): ... [continued]": a call that began before perf attached
            continue
        if started is None and f"/{os.getpid()} kill(" in text:
            started = at
        if started is not None:
            kept.append(f"{at - started:9.3f} ms  {text.split(':', 1)[1].strip()}")
    path.write_text("\n".join(kept) + "\n")
    path.with_suffix(".all").unlink()


def _who(text: str) -> int | None:
    for token in text.split():
        if "/" in token:
            pid = token.rsplit("/", 1)[1]
            return int(pid) if pid.isdigit() else None
    return None


def measure(
    python: str, *, runs: int, workdir: Path, perf_to: Path | None = None, candidates: int = 2
) -> tuple[list[dict[str, float]], list[float]]:
    """(the steps of each handoff, the spawn floor's samples), one floor sample after each handoff.
    `candidates`: daemons in all (the peers benchmark runs 3: one leader, two waiters)."""
    journal = workdir / "journal"
    floor: list[float] = []
    trials: list[dict[str, float]] = []
    daemons: list[Daemon] = []
    try:
        with RedisLab() as lab:
            lab.seed(LOCK)

            def daemon(identity: str, incarnation: int) -> Daemon:
                d = Daemon(
                    python=python,
                    redis_url=lab.url,
                    lock=LOCK,
                    identity=identity,
                    ttl="2s",
                    log_path=workdir / f"{identity}-{incarnation}.log",
                    extra_args=("--", *work_cmd(journal, identity)),
                ).start()
                daemons.append(d)
                return d

            leader = daemon("c0", 0)
            wait_until(lambda: read_journal(journal) or None, timeout_s=20, what="the first command")
            waiters = [daemon(f"c{i}", 0) for i in range(1, candidates)]
            for n in range(runs):
                last = n == runs - 1
                steps, new_leader = one_handoff(
                    lab, leader, waiters, journal, perf_to=perf_to if last else None
                )
                trials.append(steps)
                waiters = [w for w in waiters if w is not new_leader] + [daemon(leader.identity, n + 1)]
                leader = new_leader
                # After the replacement has started (imports: ~0.5 s of CPU) and its keeper is
                # parked, as at the next handoff: a floor sampled beside that start came out high.
                for waiter in waiters:
                    waiter.wait_following()
                time.sleep(0.3)
                floor += spawn_floor(work_cmd(workdir / "floor", "floor"), workdir / "floor", runs=1)
    finally:
        for d in daemons:
            with contextlib.suppress(Exception):
                d.stop()
    return trials, floor


def run(ctx: Context) -> BenchResult:
    try:
        python, venv = ctx.runtime_python_as_image(), "the runtime-only venv run the image's way"
    except BenchError as exc:
        ctx.say(f"handoff_trace: runtime venv unavailable ({exc}); the dev venv runs the daemons")
        python, venv = ctx.dev_python, "the dev venv"
    trials, floor = measure(python, runs=6 if ctx.quick else 20, workdir=ctx.dir("handoff-trace"))
    table = Table(
        f"Exec-mode graceful handoff, step by step ({len(trials)} handoffs, ms after the SIGTERM, "
        "medians; the step: the median minus the previous step's median)",
        ["step", "median at", "step", "min at", "max at"],
    )
    previous = 0.0
    for label, key in STEPS:
        values = [trial[key] * 1000 for trial in trials if key in trial]
        if not values:
            table.add(label, "-", "-", "-", "-")
            continue
        at = statistics.median(values)
        table.add(label, f"{at:.2f}", f"+{at - previous:.2f}", f"{min(values):.2f}", f"{max(values):.2f}")
        previous = at
    floor_ms = statistics.median(floor) * 1000
    table.add("spawn floor (Popen of CMD -> its journal line)", f"{floor_ms:.2f}", "", "", "")
    total = statistics.median(t["journal"] for t in trials) * 1000
    table.add("handoff minus the spawn floor", f"{total - floor_ms:.2f}", "", "", "")
    return BenchResult(
        name=NAME,
        title="Where a handoff's milliseconds go",
        method=METHOD.format(venv=venv),
        tables=[table],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.execmode.handoff_trace", description=__doc__)
    parser.add_argument("--python", default=sys.executable, help="the daemons' python")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--perf", type=Path, help="trace the last run with perf trace -a into this file")
    parser.add_argument("--candidates", type=int, default=2, help="daemons in all (the peers bench: 3)")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="elector-trace-"))
    runs, floor = measure(
        args.python, runs=args.runs, workdir=workdir, perf_to=args.perf, candidates=args.candidates
    )
    _print(runs, floor, python=args.python)
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


def _print(runs: list[dict[str, float]], floor: list[float], *, python: str) -> None:
    print(f"{len(runs)} handoffs, daemons on {python}; ms after the SIGTERM (median, and its step)")
    previous = 0.0
    for label, key in STEPS:
        values = [r[key] * 1000 for r in runs if key in r]
        if not values:
            print(f"  {label:78} -")
            continue
        at = statistics.median(values)
        print(f"  {label:78} {at:7.2f}  (+{at - previous:5.2f})  [{min(values):.2f} .. {max(values):.2f}]")
        previous = at
    floor_ms = statistics.median(floor) * 1000
    print(f"  spawn floor (Popen of CMD -> its journal line, after each handoff): median {floor_ms:.2f} ms")
    total = statistics.median(r["journal"] for r in runs) * 1000
    print(f"  handoff minus floor: {total - statistics.median(floor) * 1000:.2f} ms")


if __name__ == "__main__":
    sys.exit(main())
