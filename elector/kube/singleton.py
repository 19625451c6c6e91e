"""Run any kopf operator as a hot-standby singleton under elector's Redis lease.

    registry = kopf.OperatorRegistry()

    @kopf.on.create("example.com", "v1", "widgets", registry=registry)
    async def create_fn(spec, **_): ...

    elector_ = elector.Elector("widgets-operator", redis="redis://redis:6379/0", ttl_s=10)
    run_singleton_blocking(elector_, registry=registry, clusterwide=True)

Every replica runs this. Only the leader runs kopf (`kopf.operator(standalone=True)`: kopf's own
peering is off); the followers wait, and take over at once after a clean stop, or within the ttl
after the leader crashed. When leadership ends (lost, renew deadline, handoff), kopf is stopped
within the Elector's `stop_work_s`, before the lease can expire, and only then is the lease
released; then the replica contends again. kopf is not started again while an earlier term's kopf
is still running. Handlers should be idempotent (a new leader re-lists every object) and async,
or short: a synchronous handler cannot be interrupted.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import logging
import signal
import threading
from collections.abc import Callable, Collection
from typing import Any

import kopf

from elector.api import Elector, ElectorConfigError, Leadership, LeadershipLost
from elector.kube.kopf_thread import KopfThread, term_settings

logger = logging.getLogger(__name__)

#: Least `stop_work_s` a singleton accepts: what stopping kopf (stop flag, then a cancellation
#: of everything) needs with margin; measured at about 10 ms for idle kopf against a local API.
MIN_STOP_WORK_S = 0.25

#: Share of `stop_work_s` given to kopf's stop; the rest is for the on_stopped hook and hand-overs.
STOP_BUDGET_SHARE = 0.9

OnTerm = Callable[[Leadership], object]


class KopfOperatorExited(RuntimeError):
    """kopf's operator ended by itself while leading (kopf's own error, if any, is the cause)."""


class _Phase(enum.Enum):
    IDLE = "idle"  # between terms: waiting for an earlier kopf thread, or about to contend
    WAITING = "waiting"  # contending: safe to cancel
    LEADING = "leading"  # in a term: the term sees the stop flag itself


async def run_singleton(
    elector: Elector,
    *,
    registry: kopf.OperatorRegistry | None = None,
    settings: kopf.OperatorSettings | None = None,
    namespaces: Collection[str] = (),
    clusterwide: bool = False,
    stop_flag: asyncio.Event | None = None,
    on_leading: OnTerm | None = None,
    on_stopped: OnTerm | None = None,
    memo: object | None = None,
) -> None:
    """Contend for `elector`'s lock and run kopf while leading, until `stop_flag` is set.

    `elector` may be started or not (then it is started here, and closed on return). `registry`,
    `settings`, `namespaces`, `clusterwide` and `memo` go to `kopf.operator()` (`settings` is
    copied per term: kopf writes into it). `on_leading(term)` runs before kopf starts in each
    term, `on_stopped(term)` once it has stopped (keep both short; plain or async; errors are
    logged). Raises `KopfOperatorExited` when kopf ends by itself (after releasing the lease),
    `ElectorConfigError` for settings that cannot work.
    """
    _validate(elector, namespaces=namespaces, clusterwide=clusterwide)
    singleton = _Singleton(
        elector,
        registry=registry,
        settings=settings,
        namespaces=tuple(namespaces),
        clusterwide=clusterwide,
        stop_flag=stop_flag if stop_flag is not None else asyncio.Event(),
        on_leading=on_leading,
        on_stopped=on_stopped,
        memo=memo,
    )
    try:
        elector.status()
    except RuntimeError:  # not started: this call owns its lifetime
        async with elector:
            await singleton.run()
    else:
        await singleton.run()


def run_singleton_blocking(
    elector: Elector,
    *,
    registry: kopf.OperatorRegistry | None = None,
    settings: kopf.OperatorSettings | None = None,
    namespaces: Collection[str] = (),
    clusterwide: bool = False,
    stop_flag: asyncio.Event | None = None,
    on_leading: OnTerm | None = None,
    on_stopped: OnTerm | None = None,
    memo: object | None = None,
) -> None:
    """Like `kopf.run()`: `run_singleton()` in a new event loop, stopped by SIGTERM or SIGINT.

    The first signal stops gracefully (a leader stops kopf, then releases the lease); a second one
    cancels at once, without waiting for the release.
    """
    _validate(elector, namespaces=namespaces, clusterwide=clusterwide)

    async def main() -> None:
        stop = stop_flag if stop_flag is not None else asyncio.Event()
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None

        def on_signal(signum: signal.Signals) -> None:
            if stop.is_set():
                logger.warning("second %s: stopping at once, without releasing", signum.name)
                task.cancel()
            else:
                logger.info("%s: stopping", signum.name)
                stop.set()

        handled = threading.current_thread() is threading.main_thread()
        if handled:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, on_signal, signum)
        try:
            await run_singleton(
                elector,
                registry=registry,
                settings=settings,
                namespaces=namespaces,
                clusterwide=clusterwide,
                stop_flag=stop,
                on_leading=on_leading,
                on_stopped=on_stopped,
                memo=memo,
            )
        finally:
            if handled:
                for signum in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(signum)

    asyncio.run(main())


def _validate(elector: Elector, *, namespaces: Collection[str], clusterwide: bool) -> None:
    """Refuse, before contending, what could not work; errors name the parameter."""
    if not isinstance(elector, Elector):
        raise ElectorConfigError("elector", f"expected an elector.Elector, got {type(elector).__name__}")
    if isinstance(namespaces, str):
        raise ElectorConfigError(
            "namespaces", f"expected a collection of names, got the string {namespaces!r}"
        )
    if clusterwide and namespaces:
        raise ElectorConfigError(
            "namespaces, clusterwide", "give either namespaces or clusterwide=True, not both"
        )
    if not clusterwide and not namespaces:
        raise ElectorConfigError("namespaces, clusterwide", "give namespaces to watch, or clusterwide=True")
    stop_work_s = elector.timing.stop_work_s
    if stop_work_s < MIN_STOP_WORK_S:
        raise ElectorConfigError(
            "stop_work_s",
            f"a singleton kopf operator needs at least {MIN_STOP_WORK_S}s to stop kopf before the "
            f"lease can expire, got {stop_work_s:.3f}s (ttl {elector.timing.ttl_s}s): pass "
            f"Elector(stop_work_s=...) or a longer ttl (the default is a tenth of the ttl)",
        )


class _Singleton:
    """The contend / lead / stop loop of one `run_singleton()` call."""

    def __init__(
        self,
        elector: Elector,
        *,
        registry: kopf.OperatorRegistry | None,
        settings: kopf.OperatorSettings | None,
        namespaces: tuple[str, ...],
        clusterwide: bool,
        stop_flag: asyncio.Event,
        on_leading: OnTerm | None,
        on_stopped: OnTerm | None,
        memo: object | None,
    ) -> None:
        self._elector = elector
        self._registry = registry
        self._settings = settings
        self._namespaces = namespaces
        self._clusterwide = clusterwide
        self._stop_flag = stop_flag
        self._on_leading = on_leading
        self._on_stopped = on_stopped
        self._memo = memo
        self._stop_budget_s = STOP_BUDGET_SHARE * elector.timing.stop_work_s
        self._phase = _Phase.IDLE
        self._last_kopf: KopfThread | None = None
        self._log_extra = {"lock": elector.lock, "identity": elector.identity}

    async def run(self) -> None:
        serving = asyncio.create_task(self._serve(), name=f"singleton:{self._elector.lock}")
        stopping = asyncio.create_task(self._stop_flag.wait())
        try:
            await asyncio.wait([serving, stopping], return_when=asyncio.FIRST_COMPLETED)
            if not serving.done() and self._phase is not _Phase.LEADING:
                serving.cancel()  # not leading: nothing to stop gracefully
            # A term sees the flag itself: it stops kopf, then the lease is released.
            await asyncio.wait([serving])
        finally:
            stopping.cancel()
            if not serving.done():  # we were cancelled: so is the term (kopf's stop is bounded)
                serving.cancel()
                await asyncio.wait([serving])
        if serving.cancelled():
            # Our own cancel while contending: a grant may have come in meanwhile, with no kopf
            # started for it. Hand such a term back at once instead of sitting on the lease.
            if self._elector.is_leader:
                async with self._elector.leadership():
                    pass
            return
        serving.result()  # re-raise kopf's own exit

    async def _serve(self) -> None:
        while not self._stop_flag.is_set():
            await self._wait_for_last_kopf()
            self._phase = _Phase.WAITING
            try:
                async with self._elector.leadership() as term:
                    self._phase = _Phase.LEADING  # no await since the grant: the flag check below is current
                    await self._lead(term)
            except LeadershipLost as exc:
                logger.warning("leadership lost (%s): kopf stopped; contending again", exc.reason,
                               extra=self._log_extra)  # fmt: skip
            finally:
                self._phase = _Phase.IDLE

    async def _lead(self, term: Leadership) -> None:
        """One term: run kopf until the flag is set, the term ends (cancelled) or kopf exits."""
        if self._stop_flag.is_set():
            return
        logger.info("leading (fencing token %d): starting kopf", term.fencing_token, extra=self._log_extra)
        await _call_hook("on_leading", self._on_leading, term)
        kopf_thread = KopfThread(
            name=self._elector.lock,
            registry=self._registry,
            settings=term_settings(self._settings, stop_budget_s=self._stop_budget_s),
            namespaces=self._namespaces,
            clusterwide=self._clusterwide,
            memo=self._memo,
        )
        self._last_kopf = kopf_thread
        kopf_thread.start()
        stopping = asyncio.create_task(self._stop_flag.wait())
        waits: list[asyncio.Future[Any]] = [kopf_thread.finished, stopping]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            # Reached on the stop flag, on kopf's own exit, and on the term's end (a cancellation):
            # the lease is still ours meanwhile, the Elector releases it only after we return.
            stopped = await kopf_thread.stop(budget_s=self._stop_budget_s)
            if stopped:
                logger.info("kopf stopped", extra=self._log_extra)
                await _call_hook("on_stopped", self._on_stopped, term)
        if not self._stop_flag.is_set():
            outcome = kopf_thread.finished.result()
            raise KopfOperatorExited(f"kopf's operator exited by itself: {outcome!r}") from outcome

    async def _wait_for_last_kopf(self) -> None:
        """Never run two kopf operators at once: wait until the last term's kopf has finished."""
        last = self._last_kopf
        if last is None or last.finished.done():
            return
        while not last.finished.done():
            logger.error("kopf of the last term is still running: not contending until it stops",
                         extra=self._log_extra)  # fmt: skip
            await asyncio.wait([last.finished], timeout=10.0)


async def _call_hook(name: str, hook: OnTerm | None, term: Leadership) -> None:
    if hook is None:
        return
    try:
        result = hook(term)
        if inspect.isawaitable(result):
            await result
    except Exception:
        logger.exception("%s hook failed", name, extra={"lock": term.lock})
