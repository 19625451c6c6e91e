"""One many-locks daemon measured (see benchmark.py for what the figures mean): its run, its
process tree's memory, Redis's counters and the renewals it recorded."""

from __future__ import annotations

import json
import statistics
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.harness import common
from bench.harness.common import BenchError, RedisLab, percentile
from bench.harness.context import Context
from bench.lease.idle_resources import cpu_seconds
from bench.many_locks.daemon import read_renewals
from elector.election.clock import boottime
from elector.testing.redis_server import free_tcp_port

TTL_S = 10.0
HTTP_HOST = "127.0.0.1"
#: Scrapes per measured /metrics figure (the median is reported).
SCRAPES = 5


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


def process_tree(pid: int) -> list[int]:
    """`pid` and every descendant of it alive now."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, ()))
    return tree


def tree_memory_mib(pid: int) -> tuple[float, float]:
    """(PSS, RSS) of `pid`'s process tree, MiB: the sums of each process's Pss and Rss from
    /proc/PID/smaps_rollup. PSS charges a page shared by n processes 1/n to each, so the tree's
    PSS is what it costs the machine (a container's memory accounting charges each page once);
    the summed RSS counts shared pages once per process."""
    pss = rss = 0
    for member in process_tree(pid):
        try:
            text = Path(f"/proc/{member}/smaps_rollup").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key == "Pss":
                pss += int(value.split()[0])
            elif key == "Rss":
                rss += int(value.split()[0])
    return pss / 1024, rss / 1024


def redis_counters(lab: RedisLab) -> dict[str, float]:
    info = lab.redis.info()
    evalsha = lab.redis.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    return {
        "evalsha": float(evalsha),
        "cpu_s": float(info["used_cpu_sys"]) + float(info["used_cpu_user"]),
        "connections": float(info["connected_clients"]) - 1,  # less the bench's own
    }


def seed_locks(lab: RedisLab, locks: list[str]) -> None:
    """Every lock already used (see RedisLab.seed), 10,000 at a time."""
    run_id = lab.redis.info("server")["run_id"]
    for start in range(0, len(locks), 10_000):
        pipe = lab.redis.pipeline(transaction=False)
        for lock in locks[start : start + 10_000]:
            pipe.set(f"elector:{{{lock}}}:fencing", 1)
            pipe.set(f"elector:{{{lock}}}:server", run_id)
        pipe.execute()


def scrape_s(port: int) -> float:
    """Wall time of one full GET /metrics."""
    started = time.monotonic()
    with urllib.request.urlopen(f"http://{HTTP_HOST}:{port}/metrics", timeout=60) as response:
        response.read()
    return time.monotonic() - started


class _LogTail:
    """The JSON lines a growing log gained since the last look (the log of 100,000 locks' start-up
    is tens of MB: read again at every poll it took the bench a core)."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, 0

    def new_entries(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as log:
                log.seek(self.offset)
                data = log.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1  # a half-written last line waits for the next look
        self.offset += end
        entries = []
        for line in data[:end].splitlines():
            if line.startswith(b"{"):
                try:
                    entries.append(json.loads(line))
                except ValueError:
                    continue
        return entries


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
        tail = _LogTail(self.log)
        self.spawned_at = boottime()
        self.proc = common.spawn(argv, log_path=self.log, env={"PYTHONPATH": str(common.REPO)})

        def all_acquired() -> dict[str, Any] | None:
            for entry in tail.new_entries():
                if entry.get("event") == "all_acquired":
                    return entry
            if self.proc.poll() is not None:
                log = self.log.read_text(errors="replace")
                # The log's last line first: the table shows a failure's first line only, and a
                # refusal (e.g. the daemon's lock limit) says what it was there.
                last = next((line.strip() for line in reversed(log.splitlines()) if line.strip()), "")
                raise BenchError(f"the daemon exited with {self.proc.returncode}: {last}\n{log[-2000:]}")
            return None

        try:
            # Seeded locks are granted at once (2 ttl is the target at 10,000 locks): past 12 ttl,
            # or 30 s per 10,000 locks, start-up has failed.
            timeout_s = max(12 * TTL_S, 30.0 * self.count / 10_000)
            entry = common.wait_until(all_acquired, timeout_s=timeout_s, what=f"{self.count} locks acquired")
        except BaseException:
            self.__exit__()
            raise
        self.startup_s = float(entry["boottime"]) - self.spawned_at
        return self

    def scrapes(self) -> float:
        return statistics.median(scrape_s(self.port) for _ in range(SCRAPES))

    def __exit__(self, *exc: object) -> None:
        try:
            common.stop(self.proc, timeout_s=60 + self.count / 1000)
        finally:
            self.lab.__exit__()


def measure(ctx: Context, count: int, *, run_s: float, window_s: float) -> dict[str, float]:
    """One run of `count` locks for `run_s` from the daemon's spawn, the window its last `window_s`."""
    with Run(ctx, count, metrics="auto") as run:
        common.sleep_until_wall(time.time() + max(0.0, run.spawned_at + run_s - window_s - boottime()))
        t0, cpu0, redis0 = boottime(), cpu_seconds(run.proc.pid), redis_counters(run.lab)
        time.sleep(window_s)
        t1, cpu1, redis1 = boottime(), cpu_seconds(run.proc.pid), redis_counters(run.lab)
        pss_mib, rss_mib = tree_memory_mib(run.proc.pid)
        scrape = run.scrapes()
        startup_s = run.startup_s
    data = json.loads(run.record.read_text())
    pairs = read_renewals(run.record.with_suffix(".renewals"))
    ats, durations = pairs[0::2], pairs[1::2]
    everything = [d for at, d in zip(ats, durations, strict=True) if at < t1]
    steady = [d for at, d in zip(ats, durations, strict=True) if t0 <= at < t1]
    if not steady:
        raise BenchError(f"{count} locks: no renewal in the window")
    return {
        "cpu_pct": (cpu1 - cpu0) / (t1 - t0) * 100,
        "pss_mib": pss_mib,
        "rss_mib": rss_mib,
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
        # Leases lost and terms ended (renew_lost, any step-down) over the run.
        "lost": float(
            sum(1 for at, kind in data["other"] if at < t1 and (":" in kind or kind == "renew_lost"))
        ),
    }
