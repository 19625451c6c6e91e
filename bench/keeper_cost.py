"""keeper_cost: what exec mode's keeper (elector/daemon/execmode/keeper.py) costs, in memory and in
handoff time.

    python -m bench.keeper_cost [--runs N]

Memory: the keeper's resident set (VmRSS) and proportional set (Pss, from smaps_rollup: shared
pages split among their users), measured 0.5 s after it started the command (`sleep`), median of
the runs. Time: the two halves of a handoff that the keeper sits in, each run A/B on one
`ChildSupervisor`, once spawning the command directly and once under a keeper:

* start: from `start()` to the command's first act (it writes CLOCK_BOOTTIME first thing);
* stop: `stop()` of a command that exits on SIGTERM, until the tree is gone and reaped.

And the keeper's CPU while the command runs: user + system time over `--idle-s` seconds of a
term with a renewal every 0.6 s (0.3 x a 2 s ttl), as CPU milliseconds per minute.

The keeper is started with `python -I -S` (no site-packages), so its start-up is a bare
interpreter's. The runs alternate A and B, so that a busy machine weighs on both alike.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from elector.daemon.execmode.keeper import KeeperLink, boottime
from elector.daemon.execmode.supervisor import ChildSupervisor

#: Records the command's first moment (CLOCK_BOOTTIME, the keeper's clock), then waits for TERM.
COMMAND = (
    "import sys, time; open(sys.argv[1], 'w').write(repr(time.clock_gettime(time.CLOCK_BOOTTIME))); "
    "time.sleep(1000)"
)


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} for pid {pid}")


def _pss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    raise RuntimeError(f"no Pss for pid {pid}")


def _link() -> KeeperLink:
    return KeeperLink(valid_until=boottime() + 600, kill_grace_s=2.0, margin_s=2.1)


def _read(path: Path) -> str:
    try:
        with open(path) as file:
            return file.read()
    except FileNotFoundError:
        return ""


async def _wait_file(path: Path, *, timeout_s: float = 10.0) -> float:
    """The time the command wrote; polled every ms (an await per look: the loop must go on)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if text := _read(path):
            return float(text)
        await asyncio.sleep(0.001)
    raise RuntimeError(f"the command did not start within {timeout_s}s")


async def one_run(directory: Path, *, keeper: bool) -> tuple[float, float, tuple[int, int] | None]:
    """(start seconds, stop seconds, keeper (RSS KiB, PSS KiB) or None)."""
    marker = directory / f"started-{time.monotonic_ns()}"
    supervisor = ChildSupervisor(
        [sys.executable, "-c", COMMAND, str(marker)], kill_grace_s=2.0, on_exit=lambda _: None
    )
    began = boottime()
    await supervisor.start(env={}, keeper=_link() if keeper else None)
    start_s = await _wait_file(marker) - began
    memory = None
    if keeper:
        await asyncio.sleep(0.5)
        pid = supervisor.pid
        assert pid is not None
        memory = (_status_kib(pid, "VmRSS"), _pss_kib(pid))
    began = time.monotonic()
    ended = await supervisor.stop()
    stop_s = time.monotonic() - began
    if ended is None or ended.survivors:
        raise RuntimeError(f"the command was not stopped cleanly: {ended}")
    return start_s, stop_s, memory


async def measure(runs: int) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {k: [] for k in ("start", "start_k", "stop", "stop_k", "rss", "pss")}
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        await one_run(directory, keeper=True)  # warm-up: the page cache, the first imports
        for _ in range(runs):
            start_s, stop_s, _ = await one_run(directory, keeper=False)
            results["start"].append(start_s)
            results["stop"].append(stop_s)
            start_s, stop_s, memory = await one_run(directory, keeper=True)
            results["start_k"].append(start_s)
            results["stop_k"].append(stop_s)
            assert memory is not None
            results["rss"].append(memory[0] / 1024)
            results["pss"].append(memory[1] / 1024)
    return results


async def idle_cpu_ms_per_min(idle_s: float) -> float:
    """The keeper's CPU time (user + system) per minute of a term, renewals included."""
    supervisor = ChildSupervisor(["sleep", "1000"], kill_grace_s=2.0, on_exit=lambda _: None)
    await supervisor.start(env={}, keeper=_link())
    pid = supervisor.pid
    assert pid is not None
    await asyncio.sleep(0.5)  # past the start-up

    def cpu_s() -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    before, began = cpu_s(), time.monotonic()
    while time.monotonic() - began < idle_s:
        supervisor.extend_validity(boottime() + 600)
        await asyncio.sleep(0.6)
    used_s, elapsed_s = cpu_s() - before, time.monotonic() - began
    await supervisor.stop()
    return used_s / elapsed_s * 60 * 1000


def table(results: dict[str, list[float]], runs: int) -> str:
    def ms(values: list[float]) -> str:
        return f"{statistics.median(values) * 1000:.1f} ms"

    def mib(values: list[float]) -> str:
        return f"{statistics.median(values):.1f} MiB"

    rows = [
        ("command start (spawn to first act)", ms(results["start"]), ms(results["start_k"]),
         f"{(statistics.median(results['start_k']) - statistics.median(results['start'])) * 1000:+.1f} ms"),
        ("command stop (SIGTERM honoured, reaped)", ms(results["stop"]), ms(results["stop_k"]),
         f"{(statistics.median(results['stop_k']) - statistics.median(results['stop'])) * 1000:+.1f} ms"),
        ("keeper resident set (VmRSS)", "-", mib(results["rss"]), ""),
        ("keeper proportional set (Pss)", "-", mib(results["pss"]), ""),
        ("keeper CPU while the command runs", "-", f"{results['cpu'][0]:.0f} ms/min", ""),
    ]  # fmt: skip
    header = ("measure", "direct", "under a keeper", "cost")
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(4)]
    lines = [f"keeper cost: medians of {runs} alternating runs each, on {os.cpu_count()} cores"]
    for i, row in enumerate([header, *rows]):
        lines.append(
            "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )
        if i == 0:
            lines.append("  ".join("-" * width for width in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.keeper_cost", description=__doc__)
    parser.add_argument("--runs", type=int, default=20, help="runs of each variant (default 20)")
    parser.add_argument("--idle-s", type=float, default=30.0, help="CPU measuring window (default 30)")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.idle_s <= 0:
        parser.error("--runs must be at least 1 and --idle-s positive")
    results = asyncio.run(measure(args.runs))
    results["cpu"] = [asyncio.run(idle_cpu_ms_per_min(args.idle_s))]
    print(table(results, args.runs))


if __name__ == "__main__":
    main()
