"""The HTTP endpoints: liveness, readiness, leadership and metrics.

Probes read a fresh `ElectionStatus` snapshot on every request; nothing here keeps state of its
own. Liveness only asks whether the election loop is still turning (a Redis outage must not get
the pod restarted); readiness asks whether Redis answered recently; `/leader` tells the role,
for Services that route to the leader only.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import logging
import re
from collections.abc import Callable, Sequence

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from elector.election.outcome import ElectionStatus

StatusProvider = Callable[[], ElectionStatus]

_ADDRESS_EXAMPLE = "expected HOST:PORT, e.g. 0.0.0.0:8080, :8080 or [::]:8080"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
#: A DNS name or dotted IPv4 address; anything else cannot be listened on anyway.
_HOSTNAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\.?")
_MAX_PORT = 65535
#: Probes and scrapes need a handful of connections; beyond this many open at once, new ones
#: are closed at once, so that a flood of (slow) clients cannot take every file descriptor
#: the daemon needs for Redis.
DEFAULT_MAX_CONNECTIONS = 128
#: A connection that has not completed a request within this long is closed (aiohttp's own
#: default is an hour): it bounds how long a slowloris client holds a descriptor.
DEFAULT_IDLE_TIMEOUT_S = 5.0


@dataclasses.dataclass(frozen=True, slots=True)
class HttpSettings:
    host: str = "0.0.0.0"
    #: 0 asks the system for a free port (see `HttpServer.bound_port`).
    port: int = 8080
    #: Most connections open at once; further ones are closed as soon as they are accepted.
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    #: Close a connection idle (or still sending its request) for this long, seconds.
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S

    def __post_init__(self) -> None:
        if not 0 <= self.port <= _MAX_PORT:
            raise ValueError(f"HTTP port {self.port} is out of range 0..{_MAX_PORT}")
        if self.max_connections < 1:
            raise ValueError(f"HTTP max connections must be at least 1, got {self.max_connections}")
        if not self.idle_timeout_s > 0:
            raise ValueError(f"HTTP idle timeout must be positive, got {self.idle_timeout_s}")

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_http_address(text: str) -> HttpSettings:
    """Parse `HOST:PORT` (`:PORT` listens on all IPv4 interfaces, `[::]:PORT` on IPv6)."""
    value = text.strip()
    if not value:
        raise ValueError(f"empty HTTP address; {_ADDRESS_EXAMPLE}")
    host, sep, port_text = value.rpartition(":")
    if not sep:
        raise ValueError(f"HTTP address {text!r} has no port; {_ADDRESS_EXAMPLE}")
    if not port_text.isascii() or not port_text.isdigit():
        raise ValueError(f"HTTP address {text!r} has a non-numeric port {port_text!r}; {_ADDRESS_EXAMPLE}")
    port = int(port_text)
    if port > _MAX_PORT:
        raise ValueError(f"HTTP address {text!r} has port {port} out of range 0..{_MAX_PORT}")
    return HttpSettings(host=_parse_host(host, text=text), port=port)


def _parse_host(host: str, *, text: str) -> str:
    if not host:
        return "0.0.0.0"
    if host.startswith("[") and host.endswith("]"):
        try:
            return str(ipaddress.IPv6Address(host[1:-1]))
        except ValueError:
            raise ValueError(f"HTTP address {text!r} has an invalid IPv6 host; {_ADDRESS_EXAMPLE}") from None
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            pass  # not an address at all (a URL?): reported as an invalid host below
        else:
            raise ValueError(f"HTTP address {text!r}: put an IPv6 host in brackets; {_ADDRESS_EXAMPLE}")
    if len(host) > 253 or not _HOSTNAME.fullmatch(host):
        raise ValueError(f"HTTP address {text!r} has an invalid host {host!r}; {_ADDRESS_EXAMPLE}")
    return host


def _json(body: dict[str, object], *, status: int = 200) -> web.Response:
    # Probe answers describe this instant; a cache in between must never replay them.
    return web.json_response(body, status=status, headers={"Cache-Control": "no-store"})


def _fail(reason: str) -> web.Response:
    return _json({"status": "fail", "reason": reason}, status=503)


def _error_middleware(logger: logging.Logger) -> Middleware:
    @web.middleware
    async def never_500(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException:
            raise  # 404, 405 and friends, answered by aiohttp itself
        except Exception:
            # A probe that sees 500 may be treated as a crash; 503 says "not now" instead.
            logger.exception("http_handler_failed", extra={"path": request.path, "method": request.method})
            return _json({"status": "error", "reason": "internal error; see the daemon's logs"}, status=503)

    return never_500


def make_http_app(
    *,
    status: StatusProvider | Sequence[StatusProvider],
    registry: CollectorRegistry,
    liveness_grace_s: float,
    readiness_window_s: float,
    logger: logging.Logger | None = None,
) -> web.Application:
    """The application serving /healthz, /readyz, /leader and /metrics.

    `liveness_grace_s`: how far past `cycle_due_by` the loop may be before liveness fails.
    `readiness_window_s`: how old the last successful Redis exchange may be while ready.
    With several locks (one status provider each), liveness and readiness need every election
    to pass, and `/leader` needs `?lock=NAME`.
    """
    log = logging.getLogger("elector.http") if logger is None else logger
    providers = [status] if callable(status) else list(status)
    if not providers:
        raise ValueError("make_http_app needs at least one status provider")

    def named(snapshot: ElectionStatus, reason: str) -> str:
        return reason if len(providers) == 1 else f"lock {snapshot.lock!r}: {reason}"

    async def healthz(request: web.Request) -> web.Response:
        for provider in providers:
            snapshot = provider()
            if not snapshot.started:
                return _fail(named(snapshot, "the election loop has not started"))
            due_by = snapshot.cycle_due_by
            if due_by is not None and snapshot.now > due_by + liveness_grace_s:
                overdue = snapshot.now - due_by
                return _fail(
                    named(snapshot, f"the election loop is stuck: its cycle is {overdue:.1f}s overdue")
                )
        return _json({"status": "ok"})

    async def readyz(request: web.Request) -> web.Response:
        for provider in providers:
            snapshot = provider()
            if not snapshot.started:
                return _fail(named(snapshot, "the election loop has not started"))
            last_ok = snapshot.last_backend_ok_at
            if last_ok is None:
                return _fail(named(snapshot, "no successful Redis exchange yet"))
            age_s = snapshot.now - last_ok
            if age_s > readiness_window_s:
                return _fail(named(snapshot, f"no successful Redis exchange for {age_s:.1f}s"))
        return _json({"status": "ok"})

    by_lock: dict[str, StatusProvider] = {}

    async def leader(request: web.Request) -> web.Response:
        if not by_lock:
            by_lock.update((provider().lock, provider) for provider in providers)
        asked = request.query.getall("lock", [])
        if not asked:
            if len(providers) > 1:
                reason = f"this daemon holds {len(providers)} locks: ask /leader?lock=NAME"
                return _json({"status": "error", "reason": reason}, status=400)
            asked = [next(iter(by_lock))]
        unknown = [name for name in asked if name not in by_lock]
        if unknown:
            return _json({"status": "error", "reason": f"unknown lock {unknown[0]!r}"}, status=404)
        snapshots = [by_lock[name]() for name in dict.fromkeys(asked)]
        leading = all(snapshot.is_leader for snapshot in snapshots)
        if len(snapshots) == 1:
            return _json(_leader_body(snapshots[0]), status=200 if leading else 503)
        body = {"is_leader": leading, "locks": [_leader_body(snapshot) for snapshot in snapshots]}
        return _json(body, status=200 if leading else 503)

    app = web.Application(middlewares=[_error_middleware(log)])
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/leader", leader)
    app.router.add_get("/metrics", _metrics_handler(registry))
    return app


def _metrics_handler(registry: CollectorRegistry) -> Handler:
    """/metrics, rendered in a worker thread, one scrape at a time.

    With 1,000 locks the exposition has 64,000 series (4.5 MB) and takes ~1 s of CPU to render;
    prometheus_client's own aiohttp handler renders it on the event loop, which would stall every
    renewal for that second at each scrape. In a thread the loop keeps its turns (the GIL is
    handed over every few ms), and the lock keeps a scanner from starting many such renders.
    """
    one_at_a_time = asyncio.Lock()

    async def metrics(request: web.Request) -> web.Response:
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        async with one_at_a_time:
            body = await asyncio.to_thread(encoder, registry)
        response = web.Response(body=body, headers={"Content-Type": content_type})
        response.enable_compression()
        return response

    return metrics


def _leader_body(snapshot: ElectionStatus) -> dict[str, object]:
    holder = snapshot.holder
    remaining = snapshot.lease_remaining_s
    return {
        "lock": snapshot.lock,
        "identity": snapshot.identity,
        "is_leader": snapshot.is_leader,
        "holder": None if holder is None else holder.identity,
        "holder_fencing_token": None if holder is None else holder.fencing_token,
        "fencing_token": snapshot.fencing_token if snapshot.is_leader else None,
        "lease_remaining_ms": None if remaining is None else max(0, round(remaining * 1000)),
        "state": snapshot.state.value,
    }


class HttpBindError(OSError):
    """The HTTP server could not listen on its address (in use, not permitted, unknown host)."""


#: Longer than aiohttp takes to register an accepted connection, unless the loop is starved.
_REGISTRATION_S = 0.1


class _Refused(asyncio.Protocol):
    """Stands in for a connection over the limit: closes it as soon as it is accepted."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class _LimitedTCPSite(web.TCPSite):
    """A TCPSite whose connections beyond `max_connections` are closed on arrival."""

    def __init__(self, runner: web.AppRunner, host: str, port: int, *, max_connections: int) -> None:
        super().__init__(runner, host, port)
        self._max_connections = max_connections

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with the runner
        server = self._runner.server
        assert server is not None  # set by runner.setup()
        limit = self._max_connections
        loop = asyncio.get_running_loop()
        # Accepted but not yet registered by aiohttp (it registers in connection_made, scheduled
        # after a whole burst of accepts): counted for a moment, so a burst cannot slip through.
        pending = [0]

        def settled() -> None:
            pending[0] -= 1

        def protocol() -> asyncio.Protocol:
            if len(server.connections) + pending[0] >= limit:
                return _Refused()
            pending[0] += 1
            loop.call_later(_REGISTRATION_S, settled)
            return server()

        self._server = await loop.create_server(protocol, self._host, self._port, backlog=self._backlog)


class HttpServer:
    """Serves an application on one address until stopped."""

    def __init__(self, app: web.Application, *, settings: HttpSettings) -> None:
        self._app = app
        self._settings = settings
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        if self._runner is not None:
            raise RuntimeError("the HTTP server is already started")
        # No access log: probes every few seconds would drown the useful lines.
        runner = web.AppRunner(
            self._app,
            access_log=None,
            handle_signals=False,
            keepalive_timeout=self._settings.idle_timeout_s,
        )
        await runner.setup()
        site = _LimitedTCPSite(
            runner, self._settings.host, self._settings.port, max_connections=self._settings.max_connections
        )
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise HttpBindError(
                exc.errno, f"cannot listen on {self._settings.address}: {exc.strerror or exc}"
            ) from exc
        self._runner = runner

    @property
    def bound_port(self) -> int:
        """The port actually listened on (the system's choice when port 0 was asked)."""
        if self._runner is None or not self._runner.addresses:
            raise RuntimeError("the HTTP server is not started")
        # A host resolving to several addresses gets one socket each; with port 0 their ports
        # may differ, and the first one is reported.
        port: int = self._runner.addresses[0][1]
        return port

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
