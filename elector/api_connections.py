"""The library's own connections to the lease's Redis (from a URL), opened as the daemon opens them.

`elector.Elector` and `elector.watch` both open them here: one way to start them, to report a
Redis that does not answer yet (the caller retries), and to leave nothing open when cancelled.
"""

from __future__ import annotations

import logging

from elector.backend import RedisSettings
from elector.backend.topologies.factory import LeaseConnections
from elector.election import ElectionTiming
from elector.lease import LeaseBackendError

logger = logging.getLogger("elector.api")


async def open_connections(
    settings: RedisSettings, *, client_name: str, timing: ElectionTiming, who: str, then: str
) -> LeaseConnections:
    """Connections for `settings`, started: a cluster's slot map is read before the first request.

    Redis unreachable: a WARNING ("<who>: <error> (<then>)") and the connections, for the
    caller's retries. Cancelled (or any other exception): closed, then it propagates."""
    connections = LeaseConnections(
        settings,
        client_name=client_name,
        keepalive_s=max(60.0, 6 * timing.ttl_s),  # the election's own default
        request_timeout_s=timing.request_timeout_s,
    )
    try:
        await connections.start()
    except LeaseBackendError as exc:
        logger.warning("%s: %s (%s)", who, exc, then)
    except BaseException:
        await connections.aclose(within_s=timing.request_timeout_s)
        raise
    return connections
