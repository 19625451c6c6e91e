"""many_locks: one process holding many locks at ttl 10 s: its CPU, renew latency and Redis load.

The process under test holds N distinct locks (no rivals: it leads all of them) on a private
redis-server: a child Python process that builds the elections itself (`python -m
bench.many_locks ...`), as before the daemon shared anything (per lock: a pub/sub connection of
its own, a round trip per script call), sharing ONE `EventHub` (one pub/sub connection for every
channel), and also ONE `ScriptBatcher` (script calls of one event-loop iteration go out as one
pipeline), with and without a 5 ms linger; and the daemon itself, `elector run --locks-file`
(which shares a hub and a batcher). After a warm-up, over the window: CPU = utime+stime from
/proc/PID/stat as % of one core; renew latency = `CycleOutcome.duration_s` of every RENEWED outcome
sent in the window (p50/p99, nearest rank), for the daemon estimated from the deltas of its
elector_renew_duration_seconds histogram (linear within a bucket, like histogram_quantile);
Redis connections = INFO clients connected_clients (the bench's own left out); commands/s =
delta of INFO stats total_commands_processed.

`child_command` builds either command line.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import json
import random
import signal
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench import common
from bench.common import BenchError, BenchResult, RedisLab, Table, Target, percentile, read_json_log
from bench.context import Context
from bench.idle_resources import cpu_seconds, status_kib
from elector.testing.redis_server import free_tcp_port

NAME = "many_locks"
TTL_S = 10.0
WARMUP_S = 5.0
LOCK_COUNTS = (100, 1000)
TARGET_LOCKS = 1000
CPU_TARGET_PCT = 15.0
P99_TARGET_MS = 20.0


@dataclasses.dataclass(frozen=True)
class Mode:
    label: str
    hub: bool
    batcher: bool
    linger_ms: float = 0.0
    max_batch: int = 256
    #: `elector run --locks-file` instead of the bench's own child (always hub + batcher).
    daemon: bool = False

    @property
    def flags(self) -> list[str]:
        return [*(["--hub"] if self.hub else []), *(["--batcher"] if self.batcher else []),
                "--linger-ms", f"{self.linger_ms:g}", "--max-batch", str(self.max_batch)]  # fmt: skip


PER_LOCK = Mode("per lock (today)", hub=False, batcher=False)
HUB_ONLY = Mode("hub", hub=True, batcher=False)
SHARED = Mode("hub + batcher", hub=True, batcher=True)
LINGER = Mode("hub + batcher, 5 ms linger", hub=True, batcher=True, linger_ms=5.0)
DAEMON = Mode("elector run (hub + batcher)", hub=True, batcher=True, daemon=True)
MODES = [PER_LOCK, HUB_ONLY, SHARED, LINGER, DAEMON]
#: How the elections start: all at once (their renewals then fall due together, every renew
#: interval), or at random moments over one renew interval (renewals spread out). The daemon
#: starts every lock at once.
STARTS = {"burst": 0.0, "spread": TTL_S * 0.3}
HTTP_HOST = "127.0.0.1"


def child_command(
    python: str,
    *,
    redis_url: str,
    locks_file: Path,
    mode: Mode,
    stagger_s: float,
    report: Path,
    http_port: int,
) -> list[str]:
    """The process under test: leads every lock of `locks_file` until SIGTERM."""
    if mode.daemon:
        return [
            python, "-m", "elector", "run",
            "--redis-url", redis_url,
            "--locks-file", str(locks_file),
            "--identity", "bench-holder",
            "--ttl", f"{TTL_S:g}s",
            "--http-address", f"{HTTP_HOST}:{http_port}",
            "--log-format", "json",
        ]  # fmt: skip
    return [
        python, "-m", "bench.many_locks",
        "--redis-url", redis_url,
        "--locks-file", str(locks_file),
        "--identity", "bench-holder",
        "--ttl", f"{TTL_S:g}",
        "--report", str(report),
        "--stagger-s", f"{stagger_s:g}",
        *mode.flags,
    ]  # fmt: skip


def seed_locks(lab: RedisLab, locks: list[str]) -> None:
    """Every lock already used (see RedisLab.seed), in one pipeline."""
    run_id = lab.redis.info("server")["run_id"]
    pipe = lab.redis.pipeline(transaction=False)
    for lock in locks:
        pipe.set(f"elector:{{{lock}}}:fencing", 1)
        pipe.set(f"elector:{{{lock}}}:server", run_id)
    pipe.execute()


def redis_counters(lab: RedisLab) -> dict[str, float]:
    info = lab.redis.info()
    evalsha = lab.redis.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    return {
        "evalsha": float(evalsha),
        "commands": float(info["total_commands_processed"]),
        "cpu_s": float(info["used_cpu_sys"]) + float(info["used_cpu_user"]),
        "connections": float(info["connected_clients"]) - 1,  # less the bench's own
    }


def measure(
    ctx: Context, count: int, mode: Mode, *, stagger_s: float, window_s: float, run: int
) -> dict[str, float]:
    """One run: start the holder, wait until it leads every lock, warm up, measure the window."""
    work = ctx.dir(f"many-locks-{count}-{mode.label.replace(' ', '_')}-{stagger_s:g}-{run}")
    locks = [f"bench-many-{i}" for i in range(count)]
    (work / "locks").write_text("".join(f"{lock}\n" for lock in locks))
    log, report, port = work / "holder.log", work / "report.json", free_tcp_port()
    with RedisLab(ctx.redis_binary) as lab:
        seed_locks(lab, locks)
        argv = child_command(ctx.dev_python, redis_url=lab.url, locks_file=work / "locks", mode=mode,
                             stagger_s=stagger_s, report=report, http_port=port)  # fmt: skip
        proc = common.spawn(argv, log_path=log, env={"PYTHONPATH": str(common.REPO)})
        try:
            leading = lambda: _all_leading(log, proc.poll(), count, daemon=mode.daemon)  # noqa: E731
            common.wait_until(leading, timeout_s=120, what=f"{count} locks led")
            time.sleep(WARMUP_S)
            # Window start: the child notes its batcher counters; the daemon's metrics are read
            # before its CPU is (the scrape is work the daemon does for us).
            metrics0 = _scrape(port) if mode.daemon else None
            if not mode.daemon:
                proc.send_signal(signal.SIGUSR1)
            t0, cpu0, redis0 = time.monotonic(), cpu_seconds(proc.pid), redis_counters(lab)
            time.sleep(window_s)
            t1, cpu1, redis1 = time.monotonic(), cpu_seconds(proc.pid), redis_counters(lab)
            rss_kib = status_kib(proc.pid)["VmRSS"]
            metrics1 = _scrape(port) if mode.daemon else None
        finally:
            common.stop(proc, timeout_s=30)
    if mode.daemon:
        assert metrics0 is not None and metrics1 is not None
        renewals = _daemon_renewals(metrics0, metrics1)
    else:
        renewals = _child_renewals(json.loads(report.read_text()), t0, t1)
    return {
        **renewals,
        "cpu_pct": (cpu1 - cpu0) / (t1 - t0) * 100,
        "connections": redis1["connections"],
        "commands_per_s": (redis1["commands"] - redis0["commands"]) / (t1 - t0),
        "evalsha_per_s": (redis1["evalsha"] - redis0["evalsha"]) / (t1 - t0),
        "redis_cpu_pct": (redis1["cpu_s"] - redis0["cpu_s"]) / (t1 - t0) * 100,
        "rss_mib": rss_kib / 1024,
    }


def _child_renewals(data: dict[str, Any], t0: float, t1: float) -> dict[str, float]:
    durations = [d for at, d in data["renewals"] if t0 <= at < t1]
    if not durations:
        raise BenchError("no renewal in the window")
    at_start, at_end = data["batcher_at_window"], data["batcher_at_end"]
    pipelines = (at_end["pipelines"] - at_start["pipelines"]) if at_start else 0
    calls = (at_end["calls"] - at_start["calls"]) if at_start else 0
    return {
        "p50_ms": percentile(durations, 50) * 1000,
        "p99_ms": percentile(durations, 99) * 1000,
        "renewals": float(len(durations)),
        "trouble": float(sum(1 for at, _ in data["other"] if t0 <= at < t1)),
        "calls_per_pipeline": calls / pipelines if pipelines else 0.0,
    }


Scrape = dict[tuple[str, str], float]


def _scrape(port: int) -> Scrape:
    """Renewal counters and renew-duration buckets, summed over the locks: (name, label) -> value."""
    with urllib.request.urlopen(f"http://{HTTP_HOST}:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    totals: dict[tuple[str, str], float] = collections.defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "elector_renew_duration_seconds_bucket":
                totals[(sample.name, sample.labels["le"])] += sample.value
            elif sample.name == "elector_renewals_total":
                totals[(sample.name, sample.labels["result"])] += sample.value
    return totals


def _daemon_renewals(before: Scrape, after: Scrape) -> dict[str, float]:
    delta = {key: after[key] - before.get(key, 0.0) for key in after}
    buckets = sorted((float(le), n) for (name, le), n in delta.items() if name.endswith("_bucket"))
    results = {label: n for (name, label), n in delta.items() if name == "elector_renewals_total"}
    return {
        "p50_ms": _bucket_quantile(buckets, 0.50) * 1000,
        "p99_ms": _bucket_quantile(buckets, 0.99) * 1000,
        "renewals": results.get("ok", 0.0),
        "trouble": sum(n for label, n in results.items() if label != "ok"),
        "calls_per_pipeline": 0.0,
    }


def _bucket_quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """histogram_quantile: cumulative (upper bound, count) pairs, linear inside the bucket."""
    total = buckets[-1][1]
    if total <= 0:
        raise BenchError("no renewal in the window")
    lower, below = 0.0, 0.0
    for upper, cumulative in buckets:
        if cumulative >= q * total:
            if upper == float("inf"):
                return lower
            return lower + (upper - lower) * (q * total - below) / max(cumulative - below, 1e-9)
        lower, below = upper, cumulative
    return lower


def _all_leading(log: Path, returncode: int | None, count: int, *, daemon: bool) -> bool:
    entries = read_json_log(log)
    if daemon:
        leading = sum(1 for entry in entries if entry.get("event") == "acquired") >= count
    else:
        leading = any(entry.get("event") == "all_leading" for entry in entries)
    if not leading and returncode is not None:
        raise BenchError(f"the holder exited with {returncode}:\n{log.read_text()[-2000:]}")
    return leading


def run(ctx: Context) -> BenchResult:
    runs, window_s = (1, 10.0) if ctx.quick else (3, 30.0)
    counts, modes = ((TARGET_LOCKS,), [PER_LOCK, SHARED, DAEMON]) if ctx.quick else (LOCK_COUNTS, MODES)
    configs = [
        (n, start, mode)
        for n in counts
        for start in STARTS
        for mode in modes
        if not (mode.daemon and start != "burst")
    ]
    samples: dict[tuple[int, str, Mode], list[dict[str, float]]] = {config: [] for config in configs}
    for index in range(runs):  # interleaved, so that a noisy minute hits every configuration alike
        for count, start, mode in configs:
            ctx.say(f"many_locks: {count} locks, {start} start, {mode.label}, run {index + 1}/{runs}")
            result = measure(ctx, count, mode, stagger_s=STARTS[start], window_s=window_s, run=index)
            samples[(count, start, mode)].append(result)
    table = Table(
        f"{'One run' if runs == 1 else f'Medians of {runs} runs'}, ttl {TTL_S:g} s, {window_s:g} s window",
        ["locks", "start", "mode", "CPU % of one core", "renew p50 ms", "renew p99 ms", "Redis connections",
         "EVALSHA/s", "Redis commands/s", "Redis CPU %", "RSS MiB", "renewals", "calls per pipeline",
         "errors"],
    )  # fmt: skip
    medians: dict[tuple[int, str, Mode], dict[str, float]] = {}
    for (count, start, mode), of_runs in samples.items():
        med = {key: statistics.median(r[key] for r in of_runs) for key in of_runs[0]}
        medians[(count, start, mode)] = med
        table.add(
            count, start, mode.label, f"{med['cpu_pct']:.1f}", f"{med['p50_ms']:.2f}", f"{med['p99_ms']:.2f}",
            f"{med['connections']:.0f}", f"{med['evalsha_per_s']:.0f}", f"{med['commands_per_s']:.0f}",
            f"{med['redis_cpu_pct']:.1f}", f"{med['rss_mib']:.1f}", f"{med['renewals']:.0f}",
            f"{med['calls_per_pipeline']:.2f}" if mode.batcher and not mode.daemon else "-",
            f"{med['trouble']:.0f}",
        )  # fmt: skip
    targets = []
    for start in STARTS:
        shared = medians[(TARGET_LOCKS, start, SHARED)]
        where = f"{TARGET_LOCKS} locks, {start} start, {SHARED.label}"
        targets += [
            Target(f"CPU <= {CPU_TARGET_PCT:g} % of one core ({where})", f"<= {CPU_TARGET_PCT:g} %",
                   f"{shared['cpu_pct']:.1f} %", shared["cpu_pct"] <= CPU_TARGET_PCT),
            Target(f"renew p99 <= {P99_TARGET_MS:g} ms ({where})", f"<= {P99_TARGET_MS:g} ms",
                   f"{shared['p99_ms']:.2f} ms", shared["p99_ms"] <= P99_TARGET_MS),
        ]  # fmt: skip
    return BenchResult(
        name=NAME,
        title="Many locks in one process",
        method=(__doc__ or "").split("\n\n", 1)[1].replace("\n", " ").strip()
        + f" {'One run' if runs == 1 else f'Medians of {runs} interleaved runs'} per configuration"
        + (f" (quick: {TARGET_LOCKS} locks, two modes only), " if ctx.quick else ", ")
        + f"{WARMUP_S:g} s warm-up after the holder leads every lock. Start `burst`: every election starts "
        f"at once; `spread`: each at a random moment within one renew interval ({STARTS['spread']:g} s). "
        f"Targets: {TARGET_LOCKS} locks at ttl {TTL_S:g} s within {CPU_TARGET_PCT:g} % of one core, "
        f"renew p99 <= {P99_TARGET_MS:g} ms.",
        tables=[table],
        targets=targets,
        notes=[
            "Calls per pipeline: EVALSHA calls / pipelines sent by the batcher in the window. Errors: "
            "outcomes other than RENEWED in the window (renew errors, step-downs); 0 expected.",
            "Redis commands/s counts the commands run inside the Lua scripts too (total_commands_processed);"
            " EVALSHA/s is the requests (INFO commandstats).",
            "Per-lock mode raises the client's pool cap (redis-py's asyncio pool allows 100 connections "
            "by default, and each per-lock subscription holds one): without that, a process with ~100 "
            "locks starves its own requests (`Too many connections`) and never leads them all. Its "
            "`burst` start is not one: 1,000 subscriptions set up one connection each, which spreads "
            "the first acquisitions.",
        ],
    )


# -- the child: holds the locks ----------------------------------------------------------------


async def hold(args: argparse.Namespace, *, locks: list[str]) -> None:
    from elector.backend import RedisLeaseBackend, RedisSettings, make_client
    from elector.backend.pipeline import ScriptBatcher
    from elector.backend.pubsub.hub import EventHub
    from elector.election import CycleOutcome, Election, ElectionHooks, ElectionTiming, OutcomeKind

    timing = ElectionTiming.from_ttl(args.ttl)
    settings = RedisSettings(url=args.redis_url, request_timeout_s=timing.request_timeout_s)
    client = make_client(settings, client_name=f"elector-bench:{args.identity}")
    if not args.hub:
        # Every per-lock subscription holds a pooled connection, and redis-py caps a pool at 100
        # connections by default: without this, 100 locks already starve the requests.
        client.connection_pool.max_connections = 2 * len(locks) + 100
    keepalive_s = max(60.0, 6 * args.ttl)  # what the election itself uses per subscription
    hub = (
        EventHub(client, keepalive_s=keepalive_s, request_timeout_s=timing.request_timeout_s)
        if args.hub
        else None
    )
    batcher = (
        ScriptBatcher(client, linger_s=args.linger_ms / 1000, max_batch=args.max_batch)
        if args.batcher
        else None
    )
    renewals: list[tuple[float, float]] = []
    other: list[tuple[float, str]] = []
    leading: set[str] = set()
    all_leading, stopping = asyncio.Event(), asyncio.Event()
    snapshots: list[dict[str, int]] = []

    def hooks(lock: str) -> ElectionHooks:
        def on_outcome(outcome: CycleOutcome) -> None:
            if outcome.kind is OutcomeKind.RENEWED and outcome.duration_s is not None:
                renewals.append((outcome.at, outcome.duration_s))
                return
            other.append((outcome.at, outcome.kind.value))
            if outcome.kind is OutcomeKind.ACQUIRED:
                leading.add(lock)
                if len(leading) == len(locks):
                    all_leading.set()

        return ElectionHooks(on_outcome=on_outcome)

    elections = [
        Election(RedisLeaseBackend(client, lock=lock, hub=hub, batcher=batcher), identity=args.identity,
                 timing=timing, hooks=hooks(lock))
        for lock in locks
    ]  # fmt: skip
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stopping.set)
    loop.add_signal_handler(signal.SIGUSR1, lambda: snapshots.append(_stats(batcher)))
    started = time.monotonic()
    tasks = []
    # Start times (so renewal phases) at random over stagger_s, as opposed to all at once.
    offsets_s = sorted(random.uniform(0, args.stagger_s) for _ in elections)
    for offset_s, election in zip(offsets_s, elections, strict=True):
        if offset_s:
            await asyncio.sleep(started + offset_s - time.monotonic())
        tasks.append(asyncio.create_task(election.run()))
    await asyncio.wait([asyncio.create_task(all_leading.wait()), asyncio.create_task(stopping.wait())],
                       return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
    print(json.dumps({"event": "all_leading", "locks": len(leading), "seconds": time.monotonic() - started}),
          flush=True)  # fmt: skip
    await stopping.wait()
    report = {"renewals": renewals, "other": other, "batcher_at_window": snapshots[0] if snapshots else {},
              "batcher_at_end": _stats(batcher)}  # fmt: skip
    await asyncio.to_thread(Path(args.report).write_text, json.dumps(report))
    for election in elections:
        election.stop()
    await asyncio.gather(*tasks, return_exceptions=True)
    for closing in (batcher, hub):
        if closing is not None:
            with contextlib.suppress(Exception):
                await closing.aclose()
    await client.aclose()


def _stats(batcher: Any) -> dict[str, int]:
    return dataclasses.asdict(batcher.stats) if batcher is not None else {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.many_locks", description="Hold many locks.")
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--locks-file", required=True)
    parser.add_argument("--identity", required=True)
    parser.add_argument("--ttl", type=float, default=TTL_S)
    parser.add_argument("--report", required=True)
    parser.add_argument("--hub", action="store_true")
    parser.add_argument("--batcher", action="store_true")
    parser.add_argument("--linger-ms", type=float, default=0.0)
    parser.add_argument("--max-batch", type=int, default=256)
    parser.add_argument("--stagger-s", type=float, default=0.0)
    args = parser.parse_args(argv)
    locks = [line.strip() for line in Path(args.locks_file).read_text().splitlines() if line.strip()]
    asyncio.run(hold(args, locks=locks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
