"""The compatibility listener (`--compat-http-address`): the API of the sidecar an app was
written for, so that moving to elector changes the sidecar only.

- `leader-elector` (the default): the retired Kubernetes contrib image, answer for answer. Every
  path and every method gets 200 and the compact body `{"name":"<holder>"}`, `Content-Type:
  text/plain; charset=utf-8` (Go's sniffing of that body). An app that compares the name with
  its own hostname needs the daemon's identity to be its hostname (the chart's switch).
- `nais`: nais/elector's. The body adds `last_update` (when this replica saw the leader change,
  RFC 3339, UTC, seconds) and leaves out an empty name, served as application/json; `/sse`
  streams the same object as a server-sent event at once and at every change.

Both read the lock's published status (http_thread.py), never the election. The streams live in
the HTTP thread under its budgets: at most MAX_STREAMS at once (503 beyond), each event taken by
its client within SEND_TIMEOUT_S (else the connection is cut), a comment every KEEPALIVE_S so a
vanished client is found, and a stream may be shed at the listener's connection cap like any
connection waiting on its client. The watch that notices a change looks every WATCH_PERIOD_S.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import time
from collections.abc import AsyncIterator, Callable

from elector.daemon.http_server import Request, Response, text_response
from elector.election.outcome import ElectionStatus

COMPAT_APIS = ("leader-elector", "nais")
#: Server-sent-event streams open at once on the listener, at most.
MAX_STREAMS = 16
#: A comment line on an idle stream this often, seconds: a write to a vanished client fails.
KEEPALIVE_S = 15.0
#: How often the nais API looks for a new leader, seconds (the status it reads is republished at
#: every change and every 0.25 s). Only while the listener runs, and only for that API.
WATCH_PERIOD_S = 0.25

StatusProvider = Callable[[], ElectionStatus]


def leader_name(snapshot: ElectionStatus) -> str:
    """The holder as this replica last observed it, itself when it leads; "" when none is known
    or the holder's lease has run out since."""
    holder = snapshot.holder
    expired = not snapshot.is_leader and snapshot.lease_remaining_s == 0
    return "" if holder is None or expired else holder.identity


def _compact(body: dict[str, str]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


class LeaderElectorApi:
    """The contrib leader-elector's answer to anything: answered at once (`AnswersAtOnce`)."""

    def __init__(self, status: StatusProvider) -> None:
        self._status = status

    def answer_now(self, request: Request) -> Response:
        body = _compact({"name": leader_name(self._status())})
        return Response(200, body, (("Content-Type", "text/plain; charset=utf-8"),))

    async def __call__(self, request: Request) -> Response:
        return self.answer_now(request)


class NaisApi:
    """nais/elector's answers: the object at every path, and its changes as events on `/sse`."""

    def __init__(self, status: StatusProvider, *, wall_clock: Callable[[], float] = time.time) -> None:
        self._status = status
        self._wall_clock = wall_clock
        self._name: str | None = None
        self._since = 0.0
        #: Set (and replaced) at each change; created in the serving loop.
        self._news: asyncio.Event | None = None
        self.streams = 0

    def current(self) -> dict[str, str]:
        """The object, after a look for a change (in the serving thread)."""
        name = leader_name(self._status())
        if name != self._name:
            self._name, self._since = name, self._wall_clock()
            if self._news is not None:
                self._news.set()
                self._news = asyncio.Event()
        stamp = datetime.datetime.fromtimestamp(self._since, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {"name": name, "last_update": stamp} if name else {"last_update": stamp}

    async def watch(self) -> None:
        """Look for a change every WATCH_PERIOD_S, waking the streams; until cancelled."""
        self._news = asyncio.Event()
        while True:
            self.current()
            await asyncio.sleep(WATCH_PERIOD_S)

    def answer_now(self, request: Request) -> Response | None:
        if request.path == "/sse":
            return None  # a stream needs a slot of its own
        headers = (("Content-Type", "application/json"), ("Cache-Control", "no-cache"))
        return Response(200, _compact(self.current()), headers)

    async def __call__(self, request: Request) -> Response:
        answer = self.answer_now(request)
        if answer is not None:
            return answer
        if self.streams >= MAX_STREAMS:
            reason = f"503: at most {MAX_STREAMS} event streams at once"
            return text_response(503, reason, headers=(("Retry-After", "5"),))
        headers = (("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache"))
        return Response(200, b"", headers, stream=self._events)

    async def _events(self) -> AsyncIterator[bytes]:
        self.streams += 1
        try:
            sent: dict[str, str] | None = None
            while True:
                news = self._news
                now = self.current()
                if now != sent:
                    sent = now
                    yield b"data: " + _compact(now) + b"\n\n"
                if news is None:  # no watch runs (a bare app in a test): look again shortly
                    await asyncio.sleep(WATCH_PERIOD_S)
                    continue
                try:
                    async with asyncio.timeout(KEEPALIVE_S):
                        await news.wait()
                except TimeoutError:
                    yield b": keepalive\n\n"
        finally:
            self.streams -= 1


def make_compat_app(*, status: StatusProvider, api: str = "leader-elector") -> LeaderElectorApi | NaisApi:
    """The compat listener's application for `api` (one of COMPAT_APIS)."""
    if api == "nais":
        return NaisApi(status)
    if api != "leader-elector":
        raise ValueError(f"unknown compat API {api!r}; one of {', '.join(COMPAT_APIS)}")
    return LeaderElectorApi(status)
