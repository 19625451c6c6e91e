"""idle_requests: how many Redis requests does an idle follower send?

A leader and a follower daemon run on a private redis-server; after a warm-up, MONITOR records
every command for the window. Each MONITOR line names the client address (`[db addr]`); CLIENT
LIST maps addresses to connection names (`elector:<lock>:<identity>`) and tells the pub/sub
connection (sub=1) from the command connection. CLIENT LIST is re-read every few seconds and
whenever an unknown address shows up, so a reconnect is still attributed. Lines from inside Lua
scripts (`[0 lua]`) are not requests and are left out.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import re
import socket
import statistics
import time
from collections.abc import Iterator

from bench.harness.common import BenchResult, Daemon, RedisLab, Table, Target
from bench.harness.context import Context

NAME = "idle_requests"
LOCK = "bench-idle"
WARMUP_S = 5.0
_LINE = re.compile(rb'^\+(\d+\.\d+) \[\d+ ([^\]]+)\] "([^"]*)"')
_REFRESH_S = 5.0


@dataclasses.dataclass
class Connection:
    name: str
    role: str  # "command" or "pub/sub"


@dataclasses.dataclass
class IdleCounts:
    ttl_s: float
    window_s: float
    #: (role, address) of each follower connection -> command -> count
    follower: dict[tuple[str, str], collections.Counter[str]]
    leader_total: int
    #: Seconds between consecutive follower requests (any connection).
    gaps: list[float]

    @property
    def total(self) -> int:
        return sum(sum(counter.values()) for counter in self.follower.values())

    @property
    def by_command(self) -> collections.Counter[str]:
        merged: collections.Counter[str] = collections.Counter()
        for counter in self.follower.values():
            merged.update(counter)
        return merged

    @property
    def per_window(self) -> float:
        return self.total / (self.window_s / (self.ttl_s * 2 / 3))


class Monitor:
    """A raw MONITOR connection plus the address -> connection map from CLIENT LIST."""

    def __init__(self, lab: RedisLab) -> None:
        self.lab = lab
        self.clients: dict[str, Connection] = {}
        self._refreshed_at = 0.0
        self.sock = socket.create_connection(("127.0.0.1", lab.server.port), timeout=5)
        self.sock.sendall(b"MONITOR\r\n")
        self.sock.settimeout(0.25)
        self._buffer = b""

    def refresh(self) -> None:
        for client in self.lab.redis.client_list():
            subscribed = int(client.get("sub", 0)) + int(client.get("psub", 0)) > 0
            self.clients[client["addr"]] = Connection(client["name"], "pub/sub" if subscribed else "command")
        self._refreshed_at = time.monotonic()

    def who(self, addr: str) -> Connection | None:
        if addr not in self.clients:
            self.refresh()  # a new connection (a reconnect): look it up while it still exists
        return self.clients.get(addr)

    def lines(self, until: float) -> Iterator[tuple[float, str, str]]:
        """(server time, client address, COMMAND) of each line, as read, until the wall time `until`.

        CLIENT LIST is re-read every few seconds meanwhile, so that a connection that comes and
        goes between two lookups is still named."""
        while time.time() < until:
            if time.monotonic() - self._refreshed_at > _REFRESH_S:
                self.refresh()
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                continue
            if not chunk:
                break
            self._buffer += chunk
            *complete, self._buffer = self._buffer.split(b"\r\n")
            for raw in complete:
                match = _LINE.match(raw)
                if match and match.group(2) != b"lua":
                    yield float(match.group(1)), match.group(2).decode(), match.group(3).decode().upper()

    def close(self) -> None:
        self.sock.close()


def measure(ctx: Context, ttl_s: float, window_s: float) -> IdleCounts:
    logs = ctx.dir(f"idle-requests-{ttl_s:g}")
    follower_name = f"elector:{LOCK}:follower"
    counts: dict[tuple[str, str], collections.Counter[str]] = collections.defaultdict(collections.Counter)
    times: list[float] = []
    leader_total = 0
    with RedisLab(ctx.redis_binary) as lab:
        lab.seed(LOCK)
        daemons = [
            Daemon(
                python=ctx.dev_python,
                redis_url=lab.url,
                lock=LOCK,
                identity=identity,
                ttl=f"{ttl_s:g}s",
                log_path=logs / f"{identity}.log",
            )
            for identity in ("leader", "follower")
        ]
        try:
            daemons[0].start().wait_event("acquired", timeout_s=15)
            daemons[1].start().wait_following()
            time.sleep(WARMUP_S)
            monitor = Monitor(lab)
            try:
                monitor.refresh()
                start = time.time()
                for at, addr, command in monitor.lines(until=start + window_s + 0.5):
                    conn = monitor.who(addr)
                    if not start <= at < start + window_s or conn is None:
                        continue
                    if conn.name == follower_name:
                        counts[(conn.role, addr)][command] += 1
                        times.append(at)
                    elif conn.name == f"elector:{LOCK}:leader":
                        leader_total += 1
                # Connections without a single request count as connections too.
                for addr, conn in monitor.clients.items():
                    if conn.name == follower_name:
                        counts[(conn.role, addr)].update()
            finally:
                monitor.close()
        finally:
            for daemon in daemons:
                daemon.stop()
    gaps = [later - earlier for earlier, later in itertools.pairwise(sorted(times))]
    return IdleCounts(ttl_s, window_s, dict(counts), leader_total, gaps)


def run(ctx: Context) -> BenchResult:
    window_s = 30.0 if ctx.quick else 60.0
    configs = [(3.0, window_s)] if ctx.quick else [(3.0, window_s), (10.0, 90.0)]
    results = [measure(ctx, ttl_s, window) for ttl_s, window in configs]
    summary = Table(
        "Idle follower: Redis requests (MONITOR), leader + follower running",
        ["ttl", "window", "2/3 ttl", "follower requests", "per 2/3-ttl window", "by command",
         "gap between requests: median (min-max)", "follower connections", "leader requests"],
    )  # fmt: skip
    detail = Table("Idle follower: requests per connection", ["ttl", "connection", "command", "count"])
    targets = []
    for r in results:
        commands = ", ".join(f"{name} {count}" for name, count in r.by_command.most_common())
        roles = collections.Counter(role for role, _ in r.follower)
        gaps = f"{statistics.median(r.gaps):.3f} s ({min(r.gaps):.3f}-{max(r.gaps):.3f})" if r.gaps else "n/a"
        summary.add(
            f"{r.ttl_s:g} s", f"{r.window_s:g} s", f"{r.ttl_s * 2 / 3:.2f} s", r.total, f"{r.per_window:.2f}",
            commands or "none", gaps, ", ".join(f"{n} {role}" for role, n in sorted(roles.items())),
            r.leader_total,
        )  # fmt: skip
        for (role, addr), counter in sorted(r.follower.items()):
            for command, count in counter.most_common() or [("(none)", 0)]:
                detail.add(f"{r.ttl_s:g} s", f"{role} ({addr})", command, count)
        targets.append(
            Target(
                f"idle follower requests <= 1 per 2/3 ttl (ttl {r.ttl_s:g} s)",
                "<= 1.00",
                f"{r.per_window:.2f} per 2/3 ttl ({r.total} in {r.window_s:g} s)",
                r.per_window <= 1.0,
            )
        )
    return BenchResult(
        name=NAME,
        title="Idle follower's Redis requests",
        method=(
            "A leader and a follower `elector run` on a private redis-server, lock seeded as already used; "
            f"after a {WARMUP_S:g} s warm-up a MONITOR connection records every command for the window. "
            "Each line's client address is mapped to the follower via CLIENT LIST (name "
            "`elector:<lock>:<identity>`; sub=1 marks the pub/sub connection), re-read every 5 s and on "
            "any unknown address; commands run inside Lua scripts are not counted. Requests per (2/3 ttl) "
            "window = follower requests on both connections (pub/sub keep-alive PINGs included) / "
            "(window / (2/3 ttl)). Target: <= 1 per 2/3 ttl."
            + (" Quick run: 30 s window, ttl 3 s only." if ctx.quick else "")
        ),
        tables=[summary, detail],
        targets=targets,
        notes=[
            "The follower's pub/sub keep-alive PING is sent after max(60 s, 6 x ttl) of silence, so a "
            "60-90 s window holds 0-2 of them depending on phase.",
        ],
    )
