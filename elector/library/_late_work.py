"""Leader work of an ended term that outlived `stop_work_s`: wait for it before leading again.

The release was withheld (the election did that). Until every late body (and a late
`on_stopped_leading`) has exited, the Elector holds the election back from contending, so that it
never leads beside its own late work. Once the withheld lease may have lapsed, late async bodies
are cancelled again every LATE_BODY_RECANCEL_S until they leave, since a library the body awaits
may swallow a cancellation (redis-py's asyncio client can, when it lands inside a command:
redis/redis-py#2028). Not before: until then a body unwinding slowly (a flush in a `finally`) is
left alone, and after it nothing fences a body's writes off but the token.
"""

from __future__ import annotations

import asyncio
import logging
import weakref

from prometheus_client import CollectorRegistry, Gauge

from elector.election import Election
from elector.library.term import TermBody

logger = logging.getLogger("elector.api")

#: How often a body still running after its term's stop_work_s is cancelled again.
LATE_BODY_RECANCEL_S = 0.01

_WAITING_GAUGES: weakref.WeakKeyDictionary[CollectorRegistry, Gauge] = weakref.WeakKeyDictionary()


def waiting_for_own_work_gauge(registry: CollectorRegistry) -> Gauge:
    """`elector_waiting_for_own_work{lock}` on `registry` (one family per registry)."""
    gauge = _WAITING_GAUGES.get(registry)
    if gauge is None:
        gauge = _WAITING_GAUGES[registry] = Gauge(
            "elector_waiting_for_own_work",
            "1 while this Elector does not contend because its own leader work of an ended term "
            "still runs (it outlived stop_work_s), else 0",
            ["lock"],
            registry=registry,
        )
    return gauge


class LateWork:
    """The futures of late work of one Elector, and the hold they put on its election."""

    def __init__(self, *, lock: str, identity: str) -> None:
        self._lock = lock
        self._identity = identity
        self._futures: set[asyncio.Future[None]] = set()
        self._election: Election | None = None
        self._bodies: list[TermBody] = []

    @property
    def running(self) -> bool:
        return bool(self._futures)

    def hold(self, election: Election, late: set[asyncio.Future[None]], bodies: list[TermBody]) -> None:
        """Hold `election` back until every future in `late` is done; keep cancelling `bodies`."""
        self._election = election
        self._futures |= late
        election.hold_contending(True)
        logger.warning(
            "lock %r: not contending until the leader work of the ended term has exited",
            self._lock,
            extra={"lock": self._lock, "identity": self._identity},
        )
        for future in late:
            future.add_done_callback(self._exited)
        self._bodies += [body for body in bodies if body.exited in late]

    def lease_lapses_in(self, seconds: float) -> None:
        """The withheld lease lapses in `seconds`: from then on, cancel the late bodies again."""
        bodies, self._bodies = self._bodies, []
        if bodies:
            asyncio.get_running_loop().call_later(max(0.0, seconds), self._cancel_again, bodies)

    def _cancel_again(self, bodies: list[TermBody]) -> None:
        running = [body for body in bodies if not body.exited.done()]
        for body in running:
            body.cancel_again()
        if running:
            asyncio.get_running_loop().call_later(LATE_BODY_RECANCEL_S, self._cancel_again, running)

    def _exited(self, future: asyncio.Future[None]) -> None:
        self._futures.discard(future)
        if not self._futures and self._election is not None:
            logger.info("lock %r: the late leader work exited; contending again", self._lock)
            self._election.hold_contending(False)
