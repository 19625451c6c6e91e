"""leader_file_check: what the leader file costs its reader and its writer.

`python -m bench.lease.leader_file_check [--runs N]` prints two tables (medians of N runs):

- the reader: `elector leader-file check PATH` as a probe or a loop runs it (a new process each
  time), wall time and CPU time (user + system, from the child's rusage), next to a bare
  `python -c pass` for the interpreter's own floor;
- the writer: one `LeaderFileWriter.write` with a new `valid_until_ms`, as the daemon does at
  every renewal (mkstemp, write, fsync, rename, fsync of the directory), on a memory-backed file
  system (/dev/shm: what the chart's emptyDir uses) and on /tmp.

Measurements, never pass/fail.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from elector.daemon.leader_file import LeaderFileWriter

ELECTOR = Path(sys.executable).with_name("elector")


def _child_run(argv: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    wall_s = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall_s, cpu_s


def _median_ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.1f}"


def _p90_ms(values: list[float]) -> str:
    return f"{statistics.quantiles(values, n=10)[-1] * 1000:.1f}"


def reader_table(runs: int, directory: Path) -> list[str]:
    path = directory / "leader.json"
    content = {"lock": "jobs", "identity": "pod-a", "is_leader": True, "fencing_token": 7}
    path.write_text(json.dumps({**content, "valid_until_ms": round(time.time() * 1000) + 3_600_000}) + "\n")
    commands: dict[str, list[str]] = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "elector leader-file check PATH": [str(ELECTOR), "leader-file", "check", str(path)],
        "elector --version": [str(ELECTOR), "--version"],
    }
    lines = [
        "| command | wall median ms | wall p90 ms | CPU median ms |",
        "|---|---:|---:|---:|",
    ]
    for name, argv in commands.items():
        _child_run(argv)  # warm-up: page cache, .pyc files
        samples = [_child_run(argv) for _ in range(runs)]
        walls, cpus = [s[0] for s in samples], [s[1] for s in samples]
        lines.append(f"| `{name}` | {_median_ms(walls)} | {_p90_ms(walls)} | {_median_ms(cpus)} |")
    return lines


def _time_writes(directory: Path, runs: int) -> list[float]:
    writer = LeaderFileWriter(directory / "leader.json", lock="jobs", identity="pod-a")
    durations = []
    for n in range(runs + 1):
        started = time.perf_counter()
        writer.write(
            is_leader=True,
            fencing_token=7,
            valid_until_ms=1_800_000_000_000 + n,  # a renewal: new content every time
            holder="pod-a",
            holder_fencing_token=7,
            state="leader",
        )
        if n:
            durations.append(time.perf_counter() - started)
    return durations


def writer_table(runs: int) -> list[str]:
    lines = ["| file system | write median ms | write p90 ms |", "|---|---:|---:|"]
    places: dict[str, Callable[[], tempfile.TemporaryDirectory[str]]] = {
        "/dev/shm (tmpfs)": lambda: tempfile.TemporaryDirectory(dir="/dev/shm"),
        "/tmp": lambda: tempfile.TemporaryDirectory(dir="/tmp"),
    }
    for name, make in places.items():
        if not os.path.isdir(name.split()[0]):
            continue
        with make() as directory:
            durations = _time_writes(Path(directory), runs)
        lines.append(f"| {name} | {_median_ms(durations)} | {_p90_ms(durations)} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lease.leader_file_check", description=__doc__)
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as directory:
        print(f"reader, {args.runs} runs each, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
        print("\n".join(reader_table(args.runs, Path(directory))))
    print(f"\nwriter, {args.runs * 10} writes each")
    print("\n".join(writer_table(args.runs * 10)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
