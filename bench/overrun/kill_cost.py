"""overrun_kill: what the hard stop of `on_overrun="exit"` costs, kernel timer against watchdog process.

    python -m bench --only overrun_kill

The stop must come from something that needs no Python thread of the process (a C call can hold
the GIL past the lease). Two candidates, both armed at each renewal's validity end (plus the
grace) from the election's outcome:

* `timer`: a POSIX timer of the process whose notification is SIGKILL (elector/library/_kill_timer.py),
  as `on_overrun="exit"` ships it (with its guard thread);
* `process`: a watchdog process (bench/overrun/watchdog.py, modelled on exec mode's keeper: a bare
  `python -I -S` interpreter with PR_SET_PDEATHSIG) fed one line per renewal on a pipe.

Measured, each against a baseline with nothing armed (`none`, on_overrun="withhold"):

* CPU per re-arm (one per renewal: every 0.6 s at ttl 2 s): the program's side, back to back
  (time.process_time over COUNT re-arms); the watchdog's own, from its /proc/PID/schedstat run
  time over COUNT/10 lines written 1 ms apart, minus its run time over as long without lines.
* Memory of the tree: a sync leader at ttl 2 s on a private redis-server, its body running, 2 s
  after it entered: PSS (smaps_rollup, summed over the tree: the host's view), the tree's PSS in
  a container of its own (distinct resident pages, from pagemap: root only), VmRSS summed.
* Kill latency: a process arms a kill 0.3 s ahead, then holds the GIL in C (`sleep(30)` through
  ctypes.PyDLL); this process waits on its pidfd and takes CLOCK_BOOTTIME when it is readable.
  The figure is that time minus the deadline: the kill's own latency plus this observer's wake-up.

Runs alternate the variants, so that the load of this shared 2-core machine weighs on each alike.
"""

from __future__ import annotations

import os
import select
import statistics
import subprocess
import sys
import time

from bench.harness.common import REPO, BenchError, BenchResult, RedisLab, Table
from bench.harness.context import Context
from bench.harness.footprint import tree_memory
from elector.election.clock import boottime

NAME = "overrun_kill"
VARIANTS = ("none", "timer", "process")
KILL_DELAY_S = 0.3
#: How long after its body entered a leader's memory is read (a few renewals at ttl 2 s).
SETTLE_S = 2.0


def _subject(*args: str, stdin: int | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.overrun.subject", *args],
        cwd=REPO,
        stdin=stdin,
        stdout=subprocess.PIPE,
        text=True,
    )


def _lines(*args: str) -> list[float]:
    done = subprocess.run(
        [sys.executable, "-m", "bench.overrun.subject", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return [float(line) for line in done.stdout.split()]


def rearm_cost(runs: int, count: int) -> dict[str, tuple[list[float], list[float]]]:
    """Per variant: (the program's CPU per re-arm, the watchdog's), one value per run, seconds."""
    found: dict[str, tuple[list[float], list[float]]] = {"timer": ([], []), "process": ([], [])}
    for _ in range(runs):
        for variant in found:
            values = _lines("rearm", variant, str(count))
            found[variant][0].append(values[0])
            if len(values) > 1:
                found[variant][1].append(values[1])
    return found


def memory(lab: RedisLab, runs: int) -> dict[str, list[tuple[int, int, int | None, int]]]:
    """Per variant: (tree PSS KiB on the host, VmRSS sum KiB, own-container PSS KiB, processes)."""
    found: dict[str, list[tuple[int, int, int | None, int]]] = {variant: [] for variant in VARIANTS}
    lab.seed("bench")
    for _ in range(runs):
        for variant in VARIANTS:
            process = _subject("leader", variant, lab.url, stdin=subprocess.PIPE)
            try:
                assert process.stdout is not None
                if process.stdout.readline().strip() != "READY":
                    raise BenchError(f"the {variant} leader did not lead")
                time.sleep(SETTLE_S)
                tree = tree_memory(process.pid)
                found[variant].append((tree.pss_kib, tree.rss_kib, tree.own_kib, len(tree.pids)))
            finally:
                assert process.stdin is not None
                process.stdin.close()  # EOF: the body leaves, the lease is released
                process.wait(timeout=30)
    return found


def kill_latency(runs: int) -> dict[str, list[float]]:
    """Per variant: the kill seen (pidfd readable) minus the armed deadline, seconds."""
    found: dict[str, list[float]] = {"timer": [], "process": []}
    for _ in range(runs):
        for variant, samples in found.items():
            process = _subject("victim", variant, str(KILL_DELAY_S))
            try:
                assert process.stdout is not None
                deadline = float(process.stdout.readline())
                pidfd = os.pidfd_open(process.pid)
                try:
                    if not select.select([pidfd], [], [], 60)[0]:
                        raise BenchError(f"the {variant} victim was not killed within 60 s")
                    seen = boottime()
                finally:
                    os.close(pidfd)
                if process.wait(timeout=10) != -9:
                    raise BenchError(f"the {variant} victim ended with {process.returncode}, not SIGKILL")
                samples.append(seen - deadline)
            finally:
                if process.poll() is None:
                    process.kill()
                    process.wait()
    return found


def _us(values: list[float]) -> str:
    return f"{statistics.median(values) * 1e6:.1f}" if values else "-"


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1e3:.2f}"


def _mib(kib: float) -> str:
    return f"{kib / 1024:.1f}"


def run(ctx: Context) -> BenchResult:
    runs = 3 if ctx.quick else 5
    latency_runs = 6 if ctx.quick else 15
    count = 20_000
    cpu = rearm_cost(runs, count)
    with RedisLab(ctx.redis_binary) as lab:
        mem = memory(lab, runs)
    latency = kill_latency(latency_runs)

    costs = Table(
        f"Hard stop of on_overrun='exit': costs per candidate (medians of {runs} runs; "
        f"latency of {latency_runs})",
        ["candidate", "program CPU per re-arm, us", "watchdog CPU per re-arm, us",
         "tree PSS MiB (host)", "tree PSS MiB (own container)", "tree VmRSS sum MiB", "processes",
         "kill after the deadline, ms: median", "max"],
    )  # fmt: skip
    for variant in VARIANTS:
        rows = mem[variant]
        own = [row[2] for row in rows if row[2] is not None]
        program, watchdog = cpu.get(variant, ([], []))
        costs.add(
            {"none": "none (withhold: the baseline)", "timer": "kernel timer (shipped)",
             "process": "watchdog process"}[variant],
            _us(program), _us(watchdog) if variant == "process" else "-",
            _mib(statistics.median(row[0] for row in rows)),
            _mib(statistics.median(own)) if own else "-",
            _mib(statistics.median(row[1] for row in rows)),
            statistics.median(row[3] for row in rows),
            _ms(latency[variant]) if variant in latency else "-",
            f"{max(latency[variant]) * 1e3:.2f}" if variant in latency else "-",
        )  # fmt: skip
    load = os.getloadavg()
    return BenchResult(
        NAME,
        "The hard stop of on_overrun='exit': kernel timer against watchdog process",
        (__doc__ or "").split("\n", 2)[2].strip(),
        tables=[costs],
        notes=[
            "The kernel timer was chosen: it costs a few microseconds of the program's CPU per "
            "renewal and no process (the watchdog: a second interpreter's memory and its own "
            "wake-up at every renewal), and its kill comes from the kernel at the deadline, where "
            "the watchdog must first be scheduled. It also dies with the process and is not "
            "inherited by fork without any code of ours, where a watchdog needs PR_SET_PDEATHSIG "
            "(armed from the right thread) and a check that its parent is still the one it "
            "guards.",
            f"Measured on a 2-core machine shared with other sessions' work (load average {load[0]:.1f} "
            f"{load[1]:.1f} {load[2]:.1f} at the end): the latencies include this observer's own "
            "wake-up.",
        ],
    )
