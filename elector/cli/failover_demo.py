"""The failover `elector demo` shows (the command is in demo.py).

Starts a private redis-server on a free port, several `elector run` replicas as real processes,
shows which one leads, then alternately kills the leader (SIGKILL: takeover when its lease runs
out) and stops it (SIGTERM: handoff at once), timing each takeover from the signal to the first
`/leader` 200 of another replica. Everything it started is stopped on exit, also on Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h11

from elector.testing.redis_server import RedisServerNotFound, RedisServerProcess, free_tcp_port

POLL_INTERVAL_S = 0.01
REQUEST_TIMEOUT_S = 0.5


async def get_json(port: int, path: str) -> tuple[int, object]:
    """GET http://127.0.0.1:PORT/PATH with h11 (the daemon's own HTTP layer): status and JSON body."""
    async with asyncio.timeout(REQUEST_TIMEOUT_S):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            client = h11.Connection(h11.CLIENT)
            request = h11.Request(
                method="GET", target=path, headers=[("Host", "127.0.0.1"), ("Connection", "close")]
            )
            writer.write((client.send(request) or b"") + (client.send(h11.EndOfMessage()) or b""))
            status, body = 0, b""
            while True:
                event = client.next_event()
                if event is h11.NEED_DATA:
                    client.receive_data(await reader.read(65536))
                elif isinstance(event, h11.Response):
                    status = event.status_code
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                    return status, json.loads(body)
        finally:
            writer.close()


@dataclasses.dataclass
class Replica:
    identity: str
    port: int
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self, *, redis_url: str, ttl_s: float) -> None:
        command = [
            sys.executable, "-m", "elector", "run",
            "--redis-url", redis_url,
            "--lock", "demo",
            "--identity", self.identity,
            "--ttl", f"{round(ttl_s * 1000)}ms",
            "--http-address", f"127.0.0.1:{self.port}",
            "--log-format", "json",
        ]  # fmt: skip
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True)

    def send(self, signum: signal.Signals) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signum)

    def stop(self) -> None:
        if self.process is None:
            return
        self.send(signal.SIGTERM)
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    async def role(self) -> tuple[str, int | None]:
        """('leader', token), ('follower', None) or ('down', None)."""
        if self.process is None or self.process.poll() is not None:
            return "down", None
        try:
            status, body = await get_json(self.port, "/leader")
        except (OSError, h11.ProtocolError, TimeoutError, ValueError):
            return "down", None
        if status == 200 and isinstance(body, dict):
            return "leader", body.get("fencing_token")
        return "follower", None


class Demo:
    def __init__(self, *, replicas: list[Replica], redis_url: str, ttl_s: float) -> None:
        self.replicas = replicas
        self.redis_url = redis_url
        self.ttl_s = ttl_s
        self.started_at = time.monotonic()
        self._last_view = ""
        self._tty = sys.stdout.isatty()

    def say(self, text: str) -> None:
        elapsed = time.monotonic() - self.started_at
        if self._tty:
            sys.stdout.write("\r\033[K")
        print(f"[{elapsed:6.2f}s] {text}", flush=True)

    async def view(self) -> list[tuple[str, int | None]]:
        roles = await asyncio.gather(*(replica.role() for replica in self.replicas))
        parts = []
        for replica, (role, token) in zip(self.replicas, roles, strict=True):
            parts.append(
                f"{replica.identity}: LEADER (token {token})"
                if role == "leader"
                else f"{replica.identity}: {role}"
            )
        line = " | ".join(parts)
        if line != self._last_view:
            self._last_view = line
            self.say(line)
        return roles

    async def wait_for_leader(self, *, timeout_s: float, not_index: int | None = None) -> int | None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            roles = await self.view()
            for index, (role, _) in enumerate(roles):
                if role == "leader" and index != not_index:
                    return index
            await asyncio.sleep(POLL_INTERVAL_S)
        return None

    async def watch(self, seconds: float) -> None:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            await self.view()
            await asyncio.sleep(0.05)

    async def run(self, *, rounds: int) -> int:
        results: list[tuple[str, float]] = []
        self.say(
            f"waiting for the first leader (a new lock waits one ttl, {self.ttl_s:g}s: the quiet "
            "period that protects against Redis data loss)"
        )
        leader = await self.wait_for_leader(timeout_s=self.ttl_s * 3 + 10)
        if leader is None:
            self.say("no replica became leader; see the replica logs")
            return 1
        for round_number in range(1, rounds + 1):
            await self.watch(1.5)
            how = signal.SIGKILL if round_number % 2 == 1 else signal.SIGTERM
            victim = self.replicas[leader]
            self.say(f"sending {how.name} to the leader {victim.identity}")
            sent_at = time.monotonic()
            victim.send(how)
            leader_or_none = await self.wait_for_leader(timeout_s=self.ttl_s * 3 + 5, not_index=leader)
            if leader_or_none is None:
                self.say("no takeover; see the replica logs")
                return 1
            took = time.monotonic() - sent_at
            results.append((how.name, took))
            new = self.replicas[leader_or_none]
            kind = (
                "crash takeover (waits for the lease to run out)"
                if how is signal.SIGKILL
                else "graceful handoff"
            )
            self.say(f"{new.identity} took over {took * 1000:.0f} ms after {how.name}: {kind}")
            with contextlib.suppress(subprocess.TimeoutExpired):
                if victim.process is not None:
                    victim.process.wait(timeout=5)
            victim.start(redis_url=self.redis_url, ttl_s=self.ttl_s)
            self.say(f"restarted {victim.identity}; it rejoins as a follower")
            leader = leader_or_none
        await self.watch(1.0)
        print()
        print(f"summary (ttl {self.ttl_s:g}s, {len(self.replicas)} replicas):")
        for name, took in results:
            print(f"  {name:8s} takeover {took * 1000:8.1f} ms")
        return 0


def run_demo(*, replicas: int, ttl_s: float, rounds: int, redis_server: str | None = None) -> int:
    try:
        server = RedisServerProcess(binary=redis_server)
        server.start()
    except RedisServerNotFound as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    workdir = Path(tempfile.mkdtemp(prefix="elector-demo-"))
    members = [
        Replica(identity=f"replica-{n}", port=free_tcp_port(), log_path=workdir / f"replica-{n}.log")
        for n in range(1, replicas + 1)
    ]
    print(f"redis-server pid {server.pid} on {server.url}; replica logs in {workdir}")
    demo = Demo(replicas=members, redis_url=server.url, ttl_s=ttl_s)
    try:
        for member in members:
            member.start(redis_url=server.url, ttl_s=ttl_s)
        return asyncio.run(demo.run(rounds=rounds))
    except KeyboardInterrupt:
        return 130
    finally:
        for member in members:
            member.stop()
        server.stop()
        if os.environ.get("ELECTOR_DEMO_KEEP_LOGS") is None:
            for path in workdir.glob("*.log"):
                path.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                workdir.rmdir()
