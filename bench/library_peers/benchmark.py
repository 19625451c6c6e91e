"""library_peers: the same scheduler on elector's library and on redis-py Lock, python-redis-lock
and pottery; the holder is frozen by SIGSTOP past its lease; how many of its writes does the
resource accept after its lock was lost?

Per library and run: a fresh redis-server; two worker processes (bench/library_peers/worker.py)
run the scheduler on lock ttl 1 s, each writing an entry to a shared Redis list every 10 ms while
it holds the lock. Once the first worker writes, the second starts; 0.5 s later the first is
SIGSTOPped for 2.5 s (the second takes the lock when the lease lapses), then SIGCONTed and both
run 1.5 s more. Counted in the list's own (server) order: the frozen worker's entries after the
successor's first entry, which are writes accepted after its lock was lost, interleaved with the
successor's. The feature columns are what each library offers as documented (elector's are
tested in tests/library/).
"""

from __future__ import annotations

import signal
import statistics
import subprocess
import sys
import time
from typing import NamedTuple

from bench.harness.common import BenchResult, RedisLab, Table, Target, spawn, stop, wait_until
from bench.harness.context import Context
from bench.library_peers.worker import LOCK, RESOURCE

NAME = "library_peers"
TTL_S = 1.0
FREEZE_S = 2.5


class Peer(NamedTuple):
    """One row: the worker's library argument, then the table's columns."""

    library: str
    row: str
    api: str
    renew: str
    fencing: str
    on_lost: str
    watch: str = "no"
    timeout: str = "yes"


ELECTOR_SYNC = {"api": "sync", "renew": "yes (own thread)", "on_lost": "check() raises", "watch": "yes"}
ELECTOR_ASYNC = {
    "api": "async",
    "renew": "yes (task)",
    "on_lost": "cancelled, check() raises",
    "watch": "yes",
}
PEERS = [
    Peer("elector-sync", "elector.sync.Elector + check()", fencing="token", **ELECTOR_SYNC),
    Peer(
        "elector-sync-fenced", "elector.sync.Elector + fenced writes", fencing="token, used", **ELECTOR_SYNC
    ),
    Peer(
        "elector-async-cancel-only",
        "elector.Elector, cancellation only",
        fencing="token",
        **{**ELECTOR_ASYNC, "on_lost": "body cancelled"},
    ),
    Peer("elector-async", "elector.Elector + check()", fencing="token", **ELECTOR_ASYNC),
    Peer("elector-async-fenced", "elector.Elector + fenced writes", fencing="token, used", **ELECTOR_ASYNC),
    Peer("redis-py", "redis-py Lock", "both", "no (extend by hand)", "no", "extend() fails"),
    Peer("python-redis-lock", "python-redis-lock", "sync", "yes (thread)", "no", "none"),
    Peer("pottery", "pottery Redlock", "sync", "no (extend by hand)", "no", "extend() raises"),
]


def one_run(ctx: Context, library: str, run: int) -> int:
    logs = ctx.dir(f"{NAME}/{library}-{run}")
    with RedisLab(ctx.redis_binary) as lab:
        lab.seed(LOCK)

        def worker(who: str) -> subprocess.Popen[bytes]:
            argv = [sys.executable, "-m", "bench.library_peers.worker", library, lab.url, who, str(TTL_S)]
            return spawn(argv, log_path=logs / f"{who}.log")

        first = worker("a")
        second = None
        try:
            wait_until(
                lambda: lab.redis.llen(RESOURCE) > 0 or None, timeout_s=15, what=f"{library}: a writes"
            )
            second = worker("b")
            time.sleep(0.5)
            first.send_signal(signal.SIGSTOP)
            time.sleep(FREEZE_S)
            first.send_signal(signal.SIGCONT)
            time.sleep(1.5)
        finally:
            first.send_signal(signal.SIGCONT)
            for proc in (first, second):
                if proc is not None:
                    stop(proc, signum=signal.SIGKILL)
        entries = [bytes(entry).split()[0].decode() for entry in lab.redis.lrange(RESOURCE, 0, -1)]
    if "b" not in entries:
        raise RuntimeError(f"{library}: the second worker never wrote (see {logs})")
    successor_first = entries.index("b")
    return sum(1 for who in entries[successor_first:] if who == "a")


def run(ctx: Context) -> BenchResult:
    runs = 3 if ctx.quick else 5
    title = (
        f"A scheduler's writes accepted after its lock was lost (SIGSTOP {FREEZE_S:g} s at ttl {TTL_S:g} s"
    )
    headers = ["library", "API", "auto-renew", "fencing", "told when lost", "watch", "acquire timeout"]
    table = Table(f"{title}, {runs} runs each)", [*headers, "late writes: median", "max"])
    late_by_library: dict[str, list[int]] = {}
    for peer in PEERS:
        late = [one_run(ctx, peer.library, i) for i in range(runs)]
        late_by_library[peer.library] = late
        ctx.say(f"{peer.row}: late writes per run {late}")
        table.add(*peer[1:], statistics.median(late), max(late))
    fenced = late_by_library["elector-sync-fenced"] + late_by_library["elector-async-fenced"]
    looked = late_by_library["elector-sync"] + late_by_library["elector-async"]
    return BenchResult(
        NAME,
        "Lock libraries side by side: writes accepted after the lock was lost",
        (__doc__ or "").strip(),
        tables=[table],
        targets=[
            Target("elector with fenced writes", "0 late writes", f"max {max(fenced)}", max(fenced) == 0),
            Target(
                "elector, the lease alone",
                "0 late writes",
                f"max {max(looked)}",
                max(looked) == 0,
                reason="a freeze between the body's check and its write (see the note): only a fenced "
                "write, checked by the resource, closes that window",
            ),
        ],
        notes=[
            "A late write of 'the lease alone' can only come from a freeze between the body's check "
            "and its write: no library can close that window without the resource checking a token.",
            "'cancellation only': a cancellation that lands inside a redis-py asyncio command can be "
            "swallowed by redis-py (redis/redis-py#2028); the body then writes on after its term. "
            "Call lease.check() before each write, and fence the writes.",
        ],
    )
