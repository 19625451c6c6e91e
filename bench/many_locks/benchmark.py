"""many_locks: one `elector run --locks-file` daemon holding 100, 1,000 and 10,000 locks at ttl 10 s.

The daemon leads every lock (no rivals) on a private redis-server, each lock seeded as already
used. It runs the daemon's own code (`python -m bench.many_locks.daemon`: `build_settings` and
`run_daemon`, the CLI's modules loaded too) plus a recorder of every renewal: its send time on
CLOCK_BOOTTIME and its round trip as the election measured it (`CycleOutcome.duration_s`: from
the request's send to its reply, the batcher's wait included). Renew p50/p99 are nearest-rank
over EVERY renewal, no histogram: "from start" counts every renewal of the run (start-up and its
first renewals included), "steady" those of the window. The window is the last part of the run:
CPU = utime+stime from /proc/PID/stat as % of one core; Redis CPU = delta of INFO
used_cpu_sys+used_cpu_user; EVALSHA/s from INFO commandstats (one batch script call carries the
renewals that fall due together, so it counts calls, not renewals); Redis connections = INFO
connected_clients (the bench's own left out). RSS = VmRSS at the window's end. Start-up = the
spawn of the process to the recorder's `all_acquired`. After the window, /metrics is scraped
several times (median wall time of a full GET); the other `--metrics-per-lock` settings are
scraped on a daemon of their own, started for that only. Errors: outcomes other than acquired,
renewed and released over the run (renew errors, step-downs).
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.harness import common
from bench.harness.common import BenchError, BenchResult, RedisLab, Table, Target, percentile, read_json_log
from bench.harness.context import Context
from bench.lease.idle_resources import cpu_seconds, status_kib
from elector.election.clock import boottime
from elector.testing.redis_server import free_tcp_port

NAME = "many_locks"
TTL_S = 10.0
HTTP_HOST = "127.0.0.1"
#: Scrapes per measured /metrics figure (the median is reported).
SCRAPES = 5
#: (locks, how long the daemon runs from its spawn, s, window at the end of the run, s).
FULL = ((100, 45.0, 20.0), (1000, 60.0, 25.0), (10_000, 75.0, 25.0))
QUICK = ((100, 25.0, 10.0), (1000, 35.0, 15.0))
#: --metrics-per-lock settings scraped besides the default (auto).
OTHER_METRICS_MODES = ("always", "never")


@dataclasses.dataclass(frozen=True)
class Goal:
    locks: int
    p99_ms: float | None = None
    rss_mib: float | None = None
    cpu_pct: float | None = None
    scrape_s: float | None = None
    startup_ttls: float | None = None


GOALS = (
    Goal(1000, p99_ms=20.0, rss_mib=60.0),
    Goal(10_000, p99_ms=50.0, rss_mib=250.0, cpu_pct=25.0, scrape_s=1.0, startup_ttls=2.0),
)


def daemon_command(
    python: str, *, redis_url: str, locks_file: Path, record: Path, http_port: int, metrics: str
) -> list[str]:
    return [
        python, "-m", "bench.many_locks.daemon",
        "--record", str(record),
        f"--redis-url={redis_url}",
        f"--locks-file={locks_file}",
        "--identity=bench-holder",
        f"--ttl={TTL_S:g}",
        f"--http-address={HTTP_HOST}:{http_port}",
        "--log-format=json",
        f"--metrics-per-lock={metrics}",
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
        "cpu_s": float(info["used_cpu_sys"]) + float(info["used_cpu_user"]),
        "connections": float(info["connected_clients"]) - 1,  # less the bench's own
    }


def scrape_s(port: int) -> float:
    """Wall time of one full GET /metrics."""
    started = time.monotonic()
    with urllib.request.urlopen(f"http://{HTTP_HOST}:{port}/metrics", timeout=60) as response:
        response.read()
    return time.monotonic() - started


def _all_acquired(log: Path, proc: Any) -> dict[str, Any] | None:
    for entry in read_json_log(log):
        if entry.get("event") == "all_acquired":
            return entry
    if proc.poll() is not None:
        raise BenchError(f"the daemon exited with {proc.returncode}:\n{log.read_text()[-2000:]}")
    return None


class Run:
    """One daemon on a fresh redis-server: started, measured, stopped."""

    def __init__(self, ctx: Context, count: int, *, metrics: str) -> None:
        self.ctx, self.count, self.metrics = ctx, count, metrics
        self.work = ctx.dir(f"many-locks-{count}-{metrics}")
        self.locks = [f"bench-many-{i}" for i in range(count)]
        (self.work / "locks").write_text("".join(f"{lock}\n" for lock in self.locks))
        self.log, self.record, self.port = (
            self.work / "daemon.log",
            self.work / "record.json",
            free_tcp_port(),
        )

    def __enter__(self) -> Run:
        self.lab = RedisLab(self.ctx.redis_binary).__enter__()
        seed_locks(self.lab, self.locks)
        argv = daemon_command(self.ctx.dev_python, redis_url=self.lab.url, locks_file=self.work / "locks",
                              record=self.record, http_port=self.port, metrics=self.metrics)  # fmt: skip
        self.log.unlink(missing_ok=True)
        self.spawned_at = boottime()
        self.proc = common.spawn(argv, log_path=self.log, env={"PYTHONPATH": str(common.REPO)})
        try:
            entry = common.wait_until(lambda: _all_acquired(self.log, self.proc), timeout_s=120,
                                      what=f"{self.count} locks acquired")  # fmt: skip
        except BaseException:
            self.__exit__()
            raise
        self.startup_s = float(entry["boottime"]) - self.spawned_at
        return self

    def scrapes(self) -> float:
        return statistics.median(scrape_s(self.port) for _ in range(SCRAPES))

    def __exit__(self, *exc: object) -> None:
        try:
            common.stop(self.proc, timeout_s=60)
        finally:
            self.lab.__exit__()


def measure(ctx: Context, count: int, *, run_s: float, window_s: float) -> dict[str, float]:
    with Run(ctx, count, metrics="auto") as run:
        common.sleep_until_wall(time.time() + max(0.0, run.spawned_at + run_s - window_s - boottime()))
        t0, cpu0, redis0 = boottime(), cpu_seconds(run.proc.pid), redis_counters(run.lab)
        time.sleep(window_s)
        t1, cpu1, redis1 = boottime(), cpu_seconds(run.proc.pid), redis_counters(run.lab)
        rss_kib = status_kib(run.proc.pid)["VmRSS"]
        scrape = run.scrapes()
        startup_s = run.startup_s
    data = json.loads(run.record.read_text())
    everything = [d for at, d in data["renewals"] if at < t1]
    steady = [d for at, d in data["renewals"] if t0 <= at < t1]
    if not steady:
        raise BenchError(f"{count} locks: no renewal in the window")
    return {
        "cpu_pct": (cpu1 - cpu0) / (t1 - t0) * 100,
        "rss_mib": rss_kib / 1024,
        "p50_start_ms": percentile(everything, 50) * 1000,
        "p99_start_ms": percentile(everything, 99) * 1000,
        "max_start_ms": max(everything) * 1000,
        "p50_ms": percentile(steady, 50) * 1000,
        "p99_ms": percentile(steady, 99) * 1000,
        "renewals": float(len(everything)),
        "startup_s": startup_s,
        "scrape_auto_s": scrape,
        "connections": redis1["connections"],
        "evalsha_per_s": (redis1["evalsha"] - redis0["evalsha"]) / (t1 - t0),
        "redis_cpu_pct": (redis1["cpu_s"] - redis0["cpu_s"]) / (t1 - t0) * 100,
        "errors": float(sum(1 for at, _ in data["other"] if at < t1)),
    }


def scrape_other_modes(ctx: Context, count: int) -> dict[str, float]:
    """Median /metrics time of each other --metrics-per-lock setting (auto's is measured in `measure`)."""
    out: dict[str, float] = {}
    for mode in OTHER_METRICS_MODES:
        # auto picks per lock up to 100 locks, aggregate above: the same as one of the others.
        same_as_auto = (mode == "always") == (count <= 100)
        if same_as_auto:
            continue
        with Run(ctx, count, metrics=mode) as run:
            out[f"scrape_{mode}_s"] = run.scrapes()
    return out


def _fmt_s(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value * 1000:.0f} ms"


def run(ctx: Context) -> BenchResult:
    plan = QUICK if ctx.quick else FULL
    rows: dict[int, dict[str, float]] = {}
    failed: dict[int, str] = {}
    for count, run_s, window_s in plan:
        ctx.say(f"many_locks: {count} locks, {run_s:g} s run, {window_s:g} s window")
        try:
            rows[count] = measure(ctx, count, run_s=run_s, window_s=window_s)
        except Exception as exc:  # one scale failing must not lose the others' figures
            failed[count] = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            ctx.say(f"many_locks: {count} locks FAILED: {failed[count]}")
            continue
        ctx.say(f"many_locks: {count} locks, scrapes with the other --metrics-per-lock settings")
        rows[count].update(scrape_other_modes(ctx, count))
    table = Table(
        f"One daemon per row, ttl {TTL_S:g} s (renewals every {TTL_S * 0.3:g} s), no rivals",
        ["locks", "CPU % of one core", "RSS MiB", "renew p50 / p99 ms (from start)", "max ms (from start)",
         "renew p50 / p99 ms (window)", "start-up to all acquired", "/metrics auto / always / never",
         "Redis connections", "EVALSHA/s", "Redis CPU %", "errors"],
    )  # fmt: skip
    for count, r in rows.items():
        per_lock = count <= 100
        scrapes = [r["scrape_auto_s"] if per_lock else r.get("scrape_always_s"),
                   r["scrape_auto_s"] if not per_lock else r.get("scrape_never_s")]  # fmt: skip
        table.add(
            f"{count:,}", f"{r['cpu_pct']:.1f}", f"{r['rss_mib']:.1f}",
            f"{r['p50_start_ms']:.2f} / {r['p99_start_ms']:.2f}", f"{r['max_start_ms']:.1f}",
            f"{r['p50_ms']:.2f} / {r['p99_ms']:.2f}", f"{r['startup_s']:.1f} s",
            f"{_fmt_s(r['scrape_auto_s'])} / {_fmt_s(scrapes[0])} / {_fmt_s(scrapes[1])}",
            f"{r['connections']:.0f}", f"{r['evalsha_per_s']:.0f}", f"{r['redis_cpu_pct']:.1f}",
            f"{r['errors']:.0f}",
        )  # fmt: skip
    for count, why in failed.items():
        table.add(f"{count:,}", f"failed: {why}", *["-"] * 10)
    targets = [
        target
        for goal in GOALS
        for target in (
            _failed_targets(goal, failed[goal.locks])
            if goal.locks in failed
            else _targets(goal, rows.get(goal.locks))
        )
    ]
    result = BenchResult(
        name=NAME,
        title="Many locks in one daemon",
        method=(__doc__ or "").split("\n\n", 1)[1].replace("\n", " ").strip()
        + " Runs: "
        + "; ".join(f"{n:,} locks for {r:g} s, window the last {w:g} s" for n, r, w in plan)
        + (" (quick: 10,000 locks not run)." if ctx.quick else "."),
        tables=[table],
        targets=targets,
        notes=[
            "The daemon spreads the first tries of its locks evenly over one renew interval (at most one "
            "start per ms, over at most one ttl), so that neither acquisitions nor renewals fall due "
            "together; the batcher sends at most one pipeline per 2 ms. Each renewal is due on a 20 ms grid "
            "inside its jitter range, so the renewals of many locks fall due at the same instants and go "
            "out as one batch script call (at most 100 locks each).",
            "--metrics-per-lock auto exports per-lock series up to 100 locks and aggregate ones above "
            "(no `lock` label; elector_locks, elector_locks_leading, elector_locks_redis_down).",
            "The recorder adds 16 bytes per renewal to the daemon's RSS (~1 MiB at 10,000 locks over "
            "75 s); the bench's /metrics scrapes come after the CPU window.",
        ],
    )
    _plot(result, rows)
    return result


def _failed_targets(goal: Goal, why: str) -> list[Target]:
    """Every target of a scale whose run failed: MISSED, with the failure as the figure."""
    return [
        Target(f"{target.what} (run failed)", target.goal, f"not measured: {why}", False)
        for target in _targets(goal, None)
    ]


def _targets(goal: Goal, row: dict[str, float] | None) -> list[Target]:
    where = f"{goal.locks:,} locks"
    checks: list[tuple[str, float | None, float | None, str, float]] = [
        ("renew p99 from start", goal.p99_ms, None if row is None else row["p99_start_ms"], "ms", 1),
        ("RSS", goal.rss_mib, None if row is None else row["rss_mib"], "MiB", 1),
        ("CPU", goal.cpu_pct, None if row is None else row["cpu_pct"], "% of one core", 1),
        ("/metrics scrape (auto)", goal.scrape_s, None if row is None else row["scrape_auto_s"], "s", 1),
        ("start-up to all acquired", None if goal.startup_ttls is None else goal.startup_ttls * TTL_S,
         None if row is None else row["startup_s"], "s", 1),
    ]  # fmt: skip
    out = []
    for what, goal_value, measured, unit, _ in checks:
        if goal_value is None:
            continue
        figure = "not run (quick mode)" if measured is None else f"{measured:.2f} {unit}"
        met = None if measured is None else measured <= goal_value
        out.append(
            Target(f"{what} <= {goal_value:g} {unit} ({where})", f"<= {goal_value:g} {unit}", figure, met)
        )
    return out


def _plot(result: BenchResult, rows: dict[int, dict[str, float]]) -> None:
    try:
        from bench.harness import plots
    except ImportError:
        result.notes.append("No plots: bench/harness/plots.py is missing.")
        return
    locks = sorted(rows)
    figures = [
        ("many_locks_cpu", {"daemon CPU": [rows[n]["cpu_pct"] for n in locks],
                            "Redis CPU": [rows[n]["redis_cpu_pct"] for n in locks]}, "% of one core", "CPU"),
        ("many_locks_rss", {"RSS": [rows[n]["rss_mib"] for n in locks]}, "MiB", "Daemon RSS"),
        ("many_locks_p99", {"from start": [rows[n]["p99_start_ms"] for n in locks],
                            "window": [rows[n]["p99_ms"] for n in locks]}, "ms", "Renew p99"),
    ]  # fmt: skip
    for name, series, ylabel, title in figures:
        path = plots.image_path(name)
        try:
            plots.plot_vs_locks(path, locks=locks, series=series, ylabel=ylabel, title=f"{title} vs locks")
        except plots.PlotsUnavailable as exc:
            result.notes.append(f"No plots: {exc}")
            return
        result.images.append((path, f"{title} against the number of locks (ttl {TTL_S:g} s)"))
