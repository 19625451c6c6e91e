"""A hostile HTTP client for the daemon's port: the attacks of issue 22, each bounded in count and time.

    python tests/faults/http_attacker.py --port 8080 --attack pipeline_read --seconds 10

prints one JSON object of counts when the attack ends (connections, requests, answers, closes).
Every attack targets 127.0.0.1 only, stops at its deadline, and holds at most a fixed number of
connections (the largest, slowloris, 500); the short-connection attack also stops after 10,000
connections. It is stdlib only (sockets through asyncio streams) and is meant to run as a
process of its own, so that its CPU use never delays the measurements of the test that runs it
(tests/faults/http_measure.py).

The attacks (`ATTACKS`):
- ``pipeline_read``: two connections pipeline thousands of `GET /healthz` and read the answers
  as they come, so that the server never meets back-pressure (on a shared event loop this starved
  the election: issue 22);
- ``pipeline_noread``: pipelined requests that are never read: the server's answers pile up;
- ``slowloris``: 500 connections each send a request head one header line a second, never ending it;
- ``short_connections``: up to 10,000 connections, one `GET /healthz` each, then closed;
- ``big_heads``: request heads of 30 KB, from many connections at once;
- ``get_bodies``: `GET /healthz` with bodies (Content-Length and chunked), pipelined;
- ``invalid_methods``: unknown, malformed and oversized methods;
- ``invalid_bytes``: binary garbage, NULs and bare line feeds, broken headers and lengths.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import random
import resource
import time
from collections.abc import Awaitable, Callable

HOST = "127.0.0.1"
HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: attacker\r\n\r\n"
#: Slowloris connections held open at once.
SLOWLORIS_CONNECTIONS = 500
#: Most connections the short-connection attack opens in all.
SHORT_CONNECTIONS = 10_000
#: The size of one oversized request head.
BIG_HEAD_BYTES = 30 * 1024
#: Descriptors needed beyond the attack's connections (stdio, the event loop, slack).
_SPARE_FDS = 64


@dataclasses.dataclass
class Stats:
    attack: str
    seconds: float
    connections: int = 0
    #: connect() refused or reset before anything was sent.
    refused: int = 0
    #: Connections the server closed (EOF or reset) while the attack still used them.
    closed_by_server: int = 0
    requests: int = 0
    #: Answers seen (status lines counted in what came back).
    answers: int = 0
    bytes_sent: int = 0
    bytes_read: int = 0
    #: The most connections open at once.
    peak_open: int = 0
    open_now: int = 0
    #: The attack's own bug, if it raised (its counts are then partial).
    failure: str = ""


class Attack:
    """One attack's deadline, its counts, and the connection helpers its workers share."""

    def __init__(self, *, name: str, port: int, seconds: float) -> None:
        self.port = port
        self.deadline = time.monotonic() + seconds
        self.stats = Stats(attack=name, seconds=seconds)
        self.rng = random.Random(port)

    def running(self) -> bool:
        return time.monotonic() < self.deadline

    def left_s(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, self.port), timeout=2.0)
        except (OSError, TimeoutError):
            self.stats.refused += 1
            await asyncio.sleep(0.01)  # a refusing server is not hammered in a tight loop
            return None
        self.stats.connections += 1
        self.stats.open_now += 1
        self.stats.peak_open = max(self.stats.peak_open, self.stats.open_now)
        return reader, writer

    async def close(self, writer: asyncio.StreamWriter) -> None:
        self.stats.open_now -= 1
        writer.close()
        with contextlib.suppress(OSError, TimeoutError):
            await asyncio.wait_for(writer.wait_closed(), timeout=1.0)

    async def send(self, writer: asyncio.StreamWriter, data: bytes, *, requests: int = 0) -> bool:
        """Write and wait for the kernel to take it (until the deadline); False once the server is gone."""
        try:
            writer.write(data)
            await asyncio.wait_for(writer.drain(), timeout=max(0.01, self.left_s()))
        except TimeoutError:
            return False  # the deadline passed while the server applied back-pressure
        except OSError:
            self.stats.closed_by_server += 1
            return False
        self.stats.bytes_sent += len(data)
        self.stats.requests += requests
        return True

    async def read_answers(self, reader: asyncio.StreamReader, *, timeout_s: float) -> bool:
        """Read what comes back for up to `timeout_s` (one chunk); False at EOF or reset."""
        try:
            data = await asyncio.wait_for(
                reader.read(65536), timeout=min(timeout_s, max(0.01, self.left_s()))
            )
        except TimeoutError:
            return True
        except OSError:
            self.stats.closed_by_server += 1
            return False
        if not data:
            self.stats.closed_by_server += 1
            return False
        self.stats.bytes_read += len(data)
        self.stats.answers += data.count(b"HTTP/1.")
        return True


# -- the attacks ------------------------------------------------------------------------------------


async def pipeline_read(attack: Attack, *, connections: int = 2, batch: int = 256) -> None:
    """Pipelined `GET /healthz`, answers read as they come; at most 16 batches unanswered."""

    async def one() -> None:
        while attack.running():
            pair = await attack.connect()
            if pair is None:
                continue
            reader, writer = pair
            alive = True

            async def drain_answers(reader: asyncio.StreamReader) -> None:
                nonlocal alive
                while alive and attack.running():
                    alive = await attack.read_answers(reader, timeout_s=0.5)

            reading = asyncio.create_task(drain_answers(reader))
            while alive and attack.running():
                if attack.stats.requests - attack.stats.answers > 16 * batch * connections:
                    await asyncio.sleep(0.001)
                    continue
                alive = await attack.send(writer, HEALTHZ * batch, requests=batch)
            alive = False
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading
            await attack.close(writer)

    await asyncio.gather(*(one() for _ in range(connections)))


async def pipeline_noread(attack: Attack, *, connections: int = 4, batch: int = 256) -> None:
    """Pipelined `GET /healthz` that are never read: the server's answers have nowhere to go."""

    async def one() -> None:
        while attack.running():
            pair = await attack.connect()
            if pair is None:
                continue
            _, writer = pair
            while attack.running() and await attack.send(writer, HEALTHZ * batch, requests=batch):
                pass
            await attack.close(writer)

    await asyncio.gather(*(one() for _ in range(connections)))


async def slowloris(
    attack: Attack, *, connections: int = SLOWLORIS_CONNECTIONS, every_s: float = 1.0
) -> None:
    """Connections that send a request head one header line every `every_s`, never ending it."""
    opening = asyncio.Semaphore(50)  # the 500 connections are opened 50 at a time

    async def one(index: int) -> None:
        await asyncio.sleep(attack.rng.uniform(0, every_s))
        while attack.running():
            async with opening:
                pair = await attack.connect()
            if pair is None:
                continue
            _, writer = pair
            line = 0
            ok = await attack.send(writer, b"GET /healthz HTTP/1.1\r\nHost: attacker\r\n", requests=1)
            while ok and attack.running():
                await asyncio.sleep(min(every_s, attack.left_s()))
                line += 1
                ok = await attack.send(writer, f"X-Slow-{index}-{line}: {'a' * 16}\r\n".encode())
            await attack.close(writer)

    await asyncio.gather(*(one(i) for i in range(connections)))


async def short_connections(attack: Attack, *, total: int = SHORT_CONNECTIONS, workers: int = 32) -> None:
    """One `GET /healthz` per connection, read to the end, closed: at most `total` connections."""
    request = b"GET /healthz HTTP/1.1\r\nHost: attacker\r\nConnection: close\r\n\r\n"

    async def one() -> None:
        while attack.running() and attack.stats.connections + attack.stats.refused < total:
            pair = await attack.connect()
            if pair is None:
                continue
            reader, writer = pair
            if await attack.send(writer, request, requests=1):
                # Connection: close: the server's close after its answer is the expected end.
                with contextlib.suppress(OSError, TimeoutError):
                    answer = await asyncio.wait_for(
                        reader.read(), timeout=min(2.0, max(0.01, attack.left_s()))
                    )
                    attack.stats.bytes_read += len(answer)
                    attack.stats.answers += answer.count(b"HTTP/1.")
            await attack.close(writer)

    await asyncio.gather(*(one() for _ in range(workers)))


def _big_head(rng: random.Random) -> bytes:
    lines = [b"GET /healthz HTTP/1.1", b"Host: attacker"]
    size = sum(len(line) + 2 for line in lines)
    while size < BIG_HEAD_BYTES:
        line = f"X-Big-{len(lines)}: {rng.randbytes(500).hex()}".encode()
        lines.append(line)
        size += len(line) + 2
    return b"\r\n".join(lines) + b"\r\n\r\n"


async def big_heads(attack: Attack, *, connections: int = 256) -> None:
    """30 KB request heads (many headers), each connection sending one after another."""
    heads = [_big_head(attack.rng) for _ in range(4)]

    async def one(index: int) -> None:
        while attack.running():
            pair = await attack.connect()
            if pair is None:
                continue
            reader, writer = pair
            while attack.running() and await attack.send(writer, heads[index % len(heads)], requests=1):
                if not await attack.read_answers(reader, timeout_s=1.0):
                    break
            await attack.close(writer)

    await asyncio.gather(*(one(i) for i in range(connections)))


async def get_bodies(attack: Attack, *, connections: int = 8) -> None:
    """`GET /healthz` with a body: small, large (1 MB), chunked, and a length that never comes."""
    small = b"GET /healthz HTTP/1.1\r\nHost: attacker\r\nContent-Length: 1000\r\n\r\n" + b"b" * 1000
    large = b"GET /healthz HTTP/1.1\r\nHost: attacker\r\nContent-Length: 1048576\r\n\r\n" + b"B" * 1048576
    chunk = b"4000\r\n" + b"c" * 0x4000 + b"\r\n"
    chunked = (
        b"GET /healthz HTTP/1.1\r\nHost: attacker\r\nTransfer-Encoding: chunked\r\n\r\n"
        + chunk * 8
        + b"0\r\n\r\n"
    )
    promised = b"GET /healthz HTTP/1.1\r\nHost: attacker\r\nContent-Length: 100000000\r\n\r\n" + b"p" * 65536
    shapes = [small * 64, large, chunked * 4, promised]

    async def one(index: int) -> None:
        turn = index
        while attack.running():
            pair = await attack.connect()
            if pair is None:
                continue
            reader, writer = pair
            while attack.running():
                shape = shapes[turn % len(shapes)]
                turn += 1
                sent = await attack.send(writer, shape, requests=shape.count(b"GET "))
                if not sent or not await attack.read_answers(reader, timeout_s=0.2):
                    break
            await attack.close(writer)

    await asyncio.gather(*(one(i) for i in range(connections)))


INVALID_METHODS = (
    b"FOO /healthz HTTP/1.1\r\nHost: a\r\n\r\n",
    b"G\x00ET /healthz HTTP/1.1\r\nHost: a\r\n\r\n",
    b"GE T /healthz HTTP/1.1\r\nHost: a\r\n\r\n",
    b"get /healthz HTTP/1.1\r\nHost: a\r\n\r\n",
    b"TRACE /healthz HTTP/1.1\r\nHost: a\r\n\r\n",
    b"CONNECT 127.0.0.1:6379 HTTP/1.1\r\nHost: a\r\n\r\n",
    b"\xc3\x89T\xc3\x89 /healthz HTTP/1.1\r\nHost: a\r\n\r\n",
    b"X" * 8000 + b" /healthz HTTP/1.1\r\nHost: a\r\n\r\n",
    b"DELETE /leader HTTP/1.1\r\nHost: a\r\n\r\n",
    b" /healthz HTTP/1.1\r\nHost: a\r\n\r\n",
)


def _invalid_bytes(rng: random.Random) -> list[bytes]:
    return [
        rng.randbytes(2048),
        b"GET /healthz HTTP/1.1\r\nHost: a\r\nX-Bad: \x00\xff\x01\r\n\r\n",
        b"GET /healthz HTTP/1.1\nHost: a\n\n",
        b"GET /healthz HTTP/1.1\r\nHost: a\r\nno colon here\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"GET /\xff\xfe%00%zz HTTP/1.1\r\nHost: a\r\n\r\n",
        b"GET /healthz HTTP/9.9\r\nHost: a\r\n\r\n",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + rng.randbytes(64),  # a TLS ClientHello's start
        b"\r\n" * 2000,
    ]


async def _send_each(attack: Attack, payloads: list[bytes], *, connections: int) -> None:
    """Each worker sends the payloads in turn, one per connection unless the server keeps it."""

    async def one(index: int) -> None:
        turn = index
        while attack.running():
            pair = await attack.connect()
            if pair is None:
                continue
            reader, writer = pair
            while attack.running():
                payload = payloads[turn % len(payloads)]
                turn += 1
                if not await attack.send(writer, payload, requests=1):
                    break
                if not await attack.read_answers(reader, timeout_s=0.3):
                    break
            await attack.close(writer)

    await asyncio.gather(*(one(i) for i in range(connections)))


async def invalid_methods(attack: Attack) -> None:
    await _send_each(attack, list(INVALID_METHODS), connections=8)


async def invalid_bytes(attack: Attack) -> None:
    await _send_each(attack, _invalid_bytes(attack.rng), connections=8)


ATTACKS: dict[str, Callable[[Attack], Awaitable[None]]] = {
    "pipeline_read": pipeline_read,
    "pipeline_noread": pipeline_noread,
    "slowloris": slowloris,
    "short_connections": short_connections,
    "big_heads": big_heads,
    "get_bodies": get_bodies,
    "invalid_methods": invalid_methods,
    "invalid_bytes": invalid_bytes,
}


def ensure_descriptors(needed: int) -> int:
    """Raise the soft RLIMIT_NOFILE to `needed` if the hard limit allows; the soft limit after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    if soft != resource.RLIM_INFINITY and soft < needed:
        raise SystemExit(f"http_attacker: needs {needed} file descriptors, the hard limit is {hard}")
    return soft


async def run_attack(name: str, *, port: int, seconds: float) -> Stats:
    attack = Attack(name=name, port=port, seconds=seconds)
    task = asyncio.ensure_future(ATTACKS[name](attack))
    # Every worker checks the deadline; the grace only covers a worker stuck in a close.
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(task), timeout=seconds + 3.0)
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    elif (exc := task.exception()) is not None:
        attack.stats.failure = repr(exc)
    return attack.stats


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--port", type=int, required=True, help="the daemon's HTTP port on 127.0.0.1")
    parser.add_argument("--attack", choices=sorted(ATTACKS), required=True)
    parser.add_argument("--seconds", type=float, required=True, help="how long the attack lasts (<= 3600)")
    args = parser.parse_args(argv)
    if not 0 < args.seconds <= 3600:
        parser.error(f"--seconds must be in (0, 3600], got {args.seconds}")
    ensure_descriptors(SLOWLORIS_CONNECTIONS + 256 + _SPARE_FDS)
    stats = asyncio.run(run_attack(args.attack, port=args.port, seconds=args.seconds))
    print(json.dumps(dataclasses.asdict(stats)), flush=True)


if __name__ == "__main__":
    main()
