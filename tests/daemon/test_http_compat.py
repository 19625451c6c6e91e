"""The compat listener (`--compat-http-address`) answers as the sidecar it replaces did.

leader-elector's answers, byte for byte, from the issue's side-by-side table:

|               | leader-elector       |
|---------------|----------------------|
| body          | `{"name":"pod-b"}`   |
| Content-Type  | text/plain (sniffed) |
| other paths   | 200, same body       |
| other methods | 200                  |
| identity      | `$(hostname)`        |

and nais/elector's (`--compat-api nais`): `last_update` in the body, `/sse` streaming changes.
Real daemons, raw sockets: what goes over the wire is what is compared.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import itertools
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from elector.daemon.http_compat import MAX_STREAMS
from elector.daemon.service import Daemon
from elector.daemon.settings import build_settings
from elector.election import CycleOutcome, OutcomeKind, StepDownReason
from elector.testing.redis_server import RedisServerProcess
from tests.support.daemon import DaemonProcess, DaemonStarter, wait_until
from tests.support.waiting import until

#: Bounds on hangs, not claims.
START_S = 15.0
HANG_S = 10.0

LEADER_ELECTOR_BODY = b'{"name":"pod-b"}'
LEADER_ELECTOR_TYPE = "text/plain; charset=utf-8"  # what Go's DetectContentType says of that body


def exchange(port: int, request: bytes, *, timeout_s: float = 5.0) -> bytes:
    """Send `request` (it asks for Connection: close) and read the whole answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def compat_port(process: DaemonProcess) -> int:
    """The port the daemon's compat listener bound (it was asked for port 0: no race for one)."""
    (line,) = [line for line in process.log_lines() if line.get("event") == "started"]
    return int(line["compat_http"].rsplit(":", 1)[1])


def name_is(port: int, name: bytes) -> bool:
    try:
        return b'"name":"' + name + b'"' in split(exchange(port, request("GET", "/")))[2]
    except OSError:
        return False


def split(answer: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, body


def request(method: str, path: str, *, body: bytes = b"") -> bytes:
    length = f"Content-Length: {len(body)}\r\n" if body or method in ("POST", "PUT", "PATCH") else ""
    return f"{method} {path} HTTP/1.1\r\nHost: localhost\r\n{length}Connection: close\r\n\r\n".encode() + body


@pytest.fixture
def compat_leader(daemon: DaemonStarter) -> tuple[DaemonProcess, int]:
    leader = daemon("pod-b", "--compat-http-address", "127.0.0.1:0", ttl="2s")
    wait_until(leader.is_leader, timeout_s=START_S)
    return leader, compat_port(leader)


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/", b""),
        ("GET", "/anything/else?x=1", b""),
        ("GET", "/healthz", b""),
        ("POST", "/", b'{"some": "body"}'),
        ("PUT", "/leader", b"x"),
        ("DELETE", "/", b""),
        ("PATCH", "/", b""),
        ("OPTIONS", "*", b""),
        ("BREW", "/pot", b""),
    ],
)
def test_leader_elector_answers_every_path_and_method_as_that_image_did(
    compat_leader: tuple[DaemonProcess, int], method: str, path: str, body: bytes
) -> None:
    _, port = compat_leader
    status, headers, answer = split(exchange(port, request(method, path, body=body)))
    assert status == 200
    assert answer == LEADER_ELECTOR_BODY
    assert headers["content-type"] == LEADER_ELECTOR_TYPE
    assert headers["content-length"] == str(len(LEADER_ELECTOR_BODY))


def test_leader_elector_head_gets_the_head_only(compat_leader: tuple[DaemonProcess, int]) -> None:
    _, port = compat_leader
    status, headers, answer = split(exchange(port, request("HEAD", "/")))
    assert (status, answer, headers["content-type"]) == (200, b"", LEADER_ELECTOR_TYPE)


def test_the_identity_can_be_the_hostname_as_leader_elector_reported_it(
    redis_url: str, tmp_path: Path
) -> None:
    """The chart's switch leaves $POD_NAME unset and --identity off: the daemon's identity is then
    the host name, `$(hostname)`, which is what apps compared the name with."""
    env = {key: value for key, value in os.environ.items() if key not in ("POD_NAME", "ELECTOR_IDENTITY")}
    process = DaemonProcess(
        redis_url=redis_url,
        identity="unused",
        log_dir=tmp_path,
        extra_args=("--compat-http-address", "127.0.0.1:0"),
    )
    at = process.command.index("--identity")
    del process.command[at : at + 2]
    process.env = env
    process.start()
    try:
        process.wait_http()
        wait_until(process.is_leader, timeout_s=START_S)
        _, _, answer = split(exchange(compat_port(process), request("GET", "/")))
        assert answer == b'{"name":"' + socket.gethostname().encode() + b'"}'
    finally:
        process.stop()


# -- nais/elector -----------------------------------------------------------------------------


def test_nais_answers_name_and_last_update(daemon: DaemonStarter) -> None:
    before = time.time()
    leader = daemon("pod-b", "--compat-http-address", "127.0.0.1:0", "--compat-api", "nais", ttl="2s")
    wait_until(leader.is_leader, timeout_s=START_S)
    port = compat_port(leader)
    wait_until(lambda: name_is(port, b"pod-b"), timeout_s=HANG_S)
    for path in ("/", "/other"):
        status, headers, answer = split(exchange(port, request("GET", path)))
        assert status == 200 and headers["content-type"] == "application/json"
        body = json.loads(answer)
        assert list(body) == ["name", "last_update"] and body["name"] == "pod-b"
        assert answer == json.dumps(body, separators=(",", ":")).encode()  # compact, as Go's
        stamp = datetime.datetime.strptime(body["last_update"], "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=datetime.UTC
        )
        assert int(before) <= stamp.timestamp() <= time.time()


class EventStream:
    """A client of /sse on a raw socket: the events it has received so far."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=HANG_S)
        self.sock.sendall(b"GET /sse HTTP/1.1\r\nHost: localhost\r\nAccept: text/event-stream\r\n\r\n")
        self.received = b""

    def head(self) -> tuple[int, dict[str, str]]:
        while b"\r\n\r\n" not in self.received:
            self._read()
        status, headers, rest = split(self.received)
        self.received = rest
        return status, headers

    def next_event(self) -> dict[str, str]:
        """The next `data:` event (chunked framing and keep-alive comments skipped)."""
        while True:
            for line in self.received.split(b"\n"):
                if line.startswith(b"data: "):
                    self.received = self.received[self.received.index(line) + len(line) :]
                    return json.loads(line[len(b"data: ") :])  # type: ignore[no-any-return]
            self._read()

    def _read(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("the stream ended")
        self.received += chunk

    def close(self) -> None:
        self.sock.close()


def test_nais_sse_streams_the_leader_and_each_change(daemon: DaemonStarter) -> None:
    a = daemon("a", "--compat-http-address", "127.0.0.1:0", "--compat-api", "nais", ttl="2s")
    wait_until(a.is_leader, timeout_s=START_S)
    b = daemon("b", "--compat-http-address", "127.0.0.1:0", "--compat-api", "nais", ttl="2s")
    port = compat_port(b)
    wait_until(lambda: name_is(port, b"a"), timeout_s=HANG_S)
    stream = EventStream(port)
    try:
        status, headers = stream.head()
        assert status == 200 and headers["content-type"] == "text/event-stream"
        assert stream.next_event()["name"] == "a"
        a.signal(signal.SIGTERM)  # a hands over: b leads
        wait_until(b.is_leader, timeout_s=HANG_S)
        event = stream.next_event()
        assert event["name"] == "b" and "last_update" in event
    finally:
        stream.close()


def test_nais_sse_streams_are_capped_and_a_closed_one_frees_its_place(daemon: DaemonStarter) -> None:
    leader = daemon("a", "--compat-http-address", "127.0.0.1:0", "--compat-api", "nais", ttl="2s")
    wait_until(leader.is_leader, timeout_s=START_S)
    port = compat_port(leader)
    streams = [EventStream(port) for _ in range(MAX_STREAMS)]
    try:
        for stream in streams:
            assert stream.head()[0] == 200
            stream.next_event()
        status, headers, _ = split(exchange(port, request("GET", "/sse")))
        assert status == 503 and "retry-after" in headers
        # The other answers still come, and the daemon's own endpoint and lease are untouched.
        assert split(exchange(port, request("GET", "/")))[0] == 200
        assert leader.is_leader()
        streams.pop().close()

        def one_more() -> bool:
            late = EventStream(port)
            try:
                return late.head()[0] == 200
            finally:
                late.close()

        wait_until(one_more, timeout_s=HANG_S)
    finally:
        for stream in streams:
            stream.close()


async def test_event_streams_and_a_flood_of_them_never_delay_a_renewal(
    redis_server: RedisServerProcess,
) -> None:
    """A leader (in this process) whose nais listener holds 16 streams that never read and
    refuses a flood of more while they last: its renewals, by its own outcomes' send times, stay
    within the renew interval plus one request timeout, and it never steps down."""
    settings = build_settings(
        lock="jobs", identity="a", redis_url=redis_server.url, ttl=2.0, http_address="127.0.0.1:0",
        compat_http_address="127.0.0.1:0", compat_api="nais",
    )  # fmt: skip
    outcomes: list[CycleOutcome] = []
    daemon = Daemon(
        settings, registry=CollectorRegistry(), outcome_observer=lambda _, outcome: outcomes.append(outcome)
    )
    task = asyncio.create_task(daemon.run(install_signal_handlers=False))
    stop = threading.Event()
    refused: list[int] = []

    def flood(port: int) -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                refused.append(split(exchange(port, request("GET", "/sse"), timeout_s=2.0))[0])

    try:
        await until(lambda: daemon.locks[0].status().is_leader, timeout_s=START_S)
        port = daemon.http.bound_port("compat")
        silent = []
        for _ in range(MAX_STREAMS):  # they never read what they are sent
            sock = socket.create_connection(("127.0.0.1", port), timeout=HANG_S)
            sock.sendall(b"GET /sse HTTP/1.1\r\nHost: localhost\r\n\r\n")
            silent.append(sock)
        clock = daemon.locks[0].status
        began = clock().now
        flooders = [threading.Thread(target=flood, args=(port,), daemon=True) for _ in range(4)]
        for thread in flooders:
            thread.start()
        await asyncio.sleep(4.0)
        ended = clock().now
        stop.set()
        for thread in flooders:
            await asyncio.to_thread(thread.join, HANG_S)
        for sock in silent:
            sock.close()
    finally:
        stop.set()
        daemon.request_stop()
        async with asyncio.timeout(HANG_S):
            await task
    assert refused and set(refused) == {503}, set(refused)
    timing = settings.timing
    renewals = [
        o.at
        for o in outcomes
        if o.kind is OutcomeKind.RENEWED and began - timing.renew_interval_s <= o.at <= ended
    ]
    gaps = [later - earlier for earlier, later in itertools.pairwise(renewals)]
    assert len(renewals) >= 4 and max(gaps) <= timing.renew_interval_s + timing.request_timeout_s, gaps
    assert [o.step_down_reason for o in outcomes if o.step_down_reason is not None] == [
        StepDownReason.SHUTDOWN
    ]
