"""keeper_cost: what exec mode's keeper (elector/daemon/execmode/keeper.py) costs, in memory and in
handoff time.

    python -m bench.execmode.keeper_cost [--runs N]

Memory: the keeper's resident set (VmRSS) and proportional set (Pss, from smaps_rollup: shared
pages split among their users), measured 0.5 s after it started the command (`sleep`), median of
the runs. Time: the two halves of a handoff that the keeper sits in, each run A/B on one
`ChildSupervisor`, once spawning the command directly and once under a keeper:

* start: from `start()` to the command's first act (it writes CLOCK_BOOTTIME first thing);
* stop: `stop()` of a command that exits on SIGTERM, until the tree is gone and reaped;

and a third variant, a keeper parked ahead of time (as a follower's is) and launched by `start()`,
whose memory is measured while it waits.

And the keeper's CPU while the command runs: user + system time over `--idle-s` seconds of a
term with a renewal every 0.6 s (0.3 x a 2 s ttl), as CPU milliseconds per minute.

The keeper is started with `python -I -S` (no site-packages), so its start-up is a bare
interpreter's. The runs alternate A and B, so that a busy machine weighs on both alike.

    python -m bench.execmode.keeper_cost --handoff [--rounds N]

The whole exec-mode handoff, for development (the official figures are bench/peers/benchmark.py's): three
`elector run` daemons at ttl 2 s on a private redis-server, each running the peers benchmark's
command (bench/peers/candidates/work.py under `python -I -S`: it appends `time.time()` to a journal
first thing). The leader's daemon gets SIGTERM N times; each sample is SIGTERM -> the next
leader's journal line. The spawn floor is bench/peers/benchmark.py's: Popen of that same command -> its line.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from elector.daemon.execmode.keeper import boottime
from elector.daemon.execmode.keeper_link import KeeperLink
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


async def one_run(
    directory: Path, *, keeper: bool, parked: bool = False
) -> tuple[float, float, tuple[int, int] | None]:
    """(start seconds, stop seconds, keeper (RSS KiB, PSS KiB) or None). `parked`: the keeper is
    parked first (as a follower's is) and its memory measured while it waits."""
    marker = directory / f"started-{time.monotonic_ns()}"
    supervisor = ChildSupervisor(
        [sys.executable, "-c", COMMAND, str(marker)], kill_grace_s=2.0, on_exit=lambda _: None
    )
    memory = None
    if parked:
        await supervisor.park(keeper=KeeperLink.parked(kill_grace_s=2.0, margin_s=2.1), env=dict(os.environ))
        await asyncio.sleep(0.5)
        pid = supervisor.parked_pid
        assert pid is not None
        memory = (_status_kib(pid, "VmRSS"), _pss_kib(pid))
    began = boottime()
    await supervisor.start(env={}, keeper=_link() if keeper else None)
    start_s = await _wait_file(marker) - began
    if keeper and not parked:
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
    names = ("start", "start_k", "start_p", "stop", "stop_k", "stop_p", "rss", "pss", "rss_p", "pss_p")
    results: dict[str, list[float]] = {k: [] for k in names}
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
            start_s, stop_s, memory = await one_run(directory, keeper=True, parked=True)
            results["start_p"].append(start_s)
            results["stop_p"].append(stop_s)
            assert memory is not None
            results["rss_p"].append(memory[0] / 1024)
            results["pss_p"].append(memory[1] / 1024)
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

    def cost(key: str, base: str) -> str:
        return f"{(statistics.median(results[key]) - statistics.median(results[base])) * 1000:+.1f} ms"

    rows = [
        ("command start (spawn to first act)", ms(results["start"]), ms(results["start_k"]),
         cost("start_k", "start"), ms(results["start_p"]), cost("start_p", "start")),
        ("command stop (SIGTERM honoured, reaped)", ms(results["stop"]), ms(results["stop_k"]),
         cost("stop_k", "stop"), ms(results["stop_p"]), cost("stop_p", "stop")),
        ("keeper resident set (VmRSS)", "-", mib(results["rss"]), "", mib(results["rss_p"]), "parked"),
        ("keeper proportional set (Pss)", "-", mib(results["pss"]), "", mib(results["pss_p"]), "parked"),
        ("keeper CPU while the command runs", "-", f"{results['cpu'][0]:.0f} ms/min", "", "", ""),
    ]  # fmt: skip
    header = ("measure", "direct", "under a keeper", "cost", "parked keeper", "cost")
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines = [f"keeper cost: medians of {runs} alternating runs each, on {os.cpu_count()} cores"]
    for i, row in enumerate([header, *rows]):
        lines.append(
            "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )
        if i == 0:
            lines.append("  ".join("-" * width for width in widths))
    return "\n".join(lines)


def handoff(rounds: int) -> tuple[list[float], list[float]]:
    """(SIGTERM -> next leader's first journal line per round, the spawn floor per run).

    The command, the journal and the floor are the peers benchmark's own (bench/peers/trials.py,
    bench/peers/candidates/work.py run as `python -I -S`), so the floor compares with its figures."""
    from bench.harness.common import Daemon, RedisLab  # imports redis: only here
    from bench.peers.systems import work_cmd
    from bench.peers.trials import read_journal
    from bench.peers.trials import spawn_floor as peers_spawn_floor

    lock = "bench-keeper-handoff"
    with tempfile.TemporaryDirectory() as tmp, RedisLab() as lab:
        directory = Path(tmp)
        floor_journal = directory / "floor"
        peers_spawn_floor(work_cmd(floor_journal, "floor"), floor_journal, runs=1)  # warms the page cache
        floor = peers_spawn_floor(work_cmd(floor_journal, "floor"), floor_journal, runs=rounds)
        journal = directory / "journal"
        lab.seed(lock)

        def line(count: int, *, timeout_s: float = 20.0) -> tuple[float, str]:
            """The `count`-th journal line (time, candidate), polled every ms."""
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                lines = read_journal(journal)
                if len(lines) >= count:
                    return lines[count - 1].t, lines[count - 1].cid
                time.sleep(0.001)
            raise RuntimeError(f"no journal line {count} within {timeout_s}s")

        def daemon(identity: str, incarnation: int) -> Daemon:
            return Daemon(
                python=sys.executable, redis_url=lab.url, lock=lock, identity=identity, ttl="2s",
                log_path=directory / f"{identity}-{incarnation}.log",
                extra_args=["--", *work_cmd(journal, identity)],
            ).start()  # fmt: skip

        daemons = {name: daemon(name, 0) for name in ("a", "b", "c")}
        samples: list[float] = []
        try:
            _, first = line(1)
            for d in daemons.values():
                if d.identity != first:
                    d.wait_following()
            for round_no in range(1, rounds + 1):
                time.sleep(random.uniform(0.3, 1.0))
                lines = read_journal(journal)
                leader = daemons[lines[-1].cid]
                signalled_at = time.time()
                os.kill(leader.pid, signal.SIGTERM)
                stamp, who = line(len(lines) + 1)
                if who == leader.identity:
                    raise RuntimeError(f"{who} started the command again after SIGTERM")
                samples.append(stamp - signalled_at)
                assert leader.proc is not None
                if leader.proc.wait(timeout=10) != 0:
                    raise RuntimeError(f"{leader.identity} exited {leader.proc.returncode} after SIGTERM")
                leader.stop()
                replacement = daemon(leader.identity, round_no)
                daemons[leader.identity] = replacement
                replacement.wait_event("new_leader_observed", timeout_s=15)
        finally:
            for d in daemons.values():
                d.stop()
    return samples, floor


def handoff_table(samples: list[float], floor: list[float]) -> str:
    from bench.harness.common import percentile

    def ms(values: list[float], p: float) -> str:
        return f"{percentile(values, p) * 1000:.1f} ms"

    floor_ms = statistics.median(floor) * 1000
    return "\n".join([
        f"exec-mode handoff, 3 daemons at ttl 2 s, {len(samples)} rounds, on {os.cpu_count()} cores",
        f"  spawn floor (Popen of `python -I -S work.py` -> first line, as bench/peers/benchmark.py):\n"
        f"                                        p50 {ms(floor, 50)}  p99 {ms(floor, 99)}",
        f"  SIGTERM -> new leader's first line:   p50 {ms(samples, 50)}  p99 {ms(samples, 99)}"
        f"  (max {max(samples) * 1000:.1f} ms)",
        f"  targets: p50 <= {floor_ms + 6:.1f} ms, p99 <= {floor_ms + 15:.1f} ms (floor p50 + 6 / + 15)",
        "  samples (ms): " + " ".join(f"{s * 1000:.0f}" for s in samples),
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.execmode.keeper_cost", description=__doc__)
    parser.add_argument("--runs", type=int, default=20, help="runs of each variant (default 20)")
    parser.add_argument("--idle-s", type=float, default=30.0, help="CPU measuring window (default 30)")
    parser.add_argument("--handoff", action="store_true", help="measure the whole exec-mode handoff instead")
    parser.add_argument("--rounds", type=int, default=20, help="--handoff: SIGTERMs (default 20)")
    args = parser.parse_args(argv)
    if args.handoff:
        print(handoff_table(*handoff(args.rounds)))
        return
    if args.runs < 1 or args.idle_s <= 0:
        parser.error("--runs must be at least 1 and --idle-s positive")
    results = asyncio.run(measure(args.runs))
    results["cpu"] = [asyncio.run(idle_cpu_ms_per_min(args.idle_s))]
    print(table(results, args.runs))


if __name__ == "__main__":
    main()
