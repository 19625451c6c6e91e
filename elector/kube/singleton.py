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
released; then the replica contends again. Handlers should be idempotent (a new leader re-lists
every object) and async, or short: a synchronous handler cannot be interrupted. If one keeps kopf
from stopping in time, the process ends at once without releasing (`on_stuck="exit"`, the
default: the lease then expires after the ttl, and the handler's thread has died with the
process), or it waits, holding the lease, until kopf has stopped (`on_stuck="wait"`). Either
way kopf is never started again while an earlier term's kopf still runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import inspect
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Collection
from typing import Any, Literal, NoReturn, TypedDict, Unpack, get_args

import kopf

from elector.kube.kopf_thread import KopfThread, term_settings
from elector.library.elector import Elector, ElectorConfigError, Leadership, LeadershipLost

logger = logging.getLogger(__name__)

#: Least `stop_work_s` a singleton accepts: what stopping kopf (stop flag, then a cancellation
#: of everything) needs with margin; measured at about 10 ms for idle kopf against a local API.
MIN_STOP_WORK_S = 0.25

#: Share of `stop_work_s` given to kopf's stop; the rest is for the on_stopped hook and hand-overs.
STOP_BUDGET_SHARE = 0.9

#: Exit code of a process ended because kopf could not be stopped (sysexits' EX_SOFTWARE).
EXIT_KOPF_STUCK = 70

#: How often a replica waiting for a stuck kopf (on_stuck="wait") says so.
STUCK_LOG_INTERVAL_S = 10.0

OnTerm = Callable[[Leadership], object]
#: What to do when kopf cannot be stopped in time: end the process, or wait holding the lease.
OnStuck = Literal["exit", "wait"]


class KopfOperatorExited(RuntimeError):
    """kopf's operator ended by itself while leading (kopf's own error, if any, is the cause)."""


class _Phase(enum.Enum):
    IDLE = "idle"  # between terms: about to contend
    WAITING = "waiting"  # contending: safe to cancel
    LEADING = "leading"  # in a term: the term sees the stop flag itself


class SingletonOptions(TypedDict, total=False):
    """The keyword arguments of `run_singleton()` and `run_singleton_blocking()` (all optional)."""

    registry: kopf.OperatorRegistry | None
    settings: kopf.OperatorSettings | None
    namespaces: Collection[str]
    clusterwide: bool
    on_leading: OnTerm | None
    on_stopped: OnTerm | None
    memo: object | None
    on_stuck: OnStuck


@dataclasses.dataclass(frozen=True, slots=True)
class _Options:
    """`SingletonOptions` with their defaults (one place for both entry points)."""

    registry: kopf.OperatorRegistry | None = None
    settings: kopf.OperatorSettings | None = None
    namespaces: Collection[str] = ()
    clusterwide: bool = False
    on_leading: OnTerm | None = None
    on_stopped: OnTerm | None = None
    memo: object | None = None
    on_stuck: OnStuck = "exit"


async def run_singleton(
    elector: Elector, *, stop_flag: asyncio.Event | None = None, **options: Unpack[SingletonOptions]
) -> None:
    """Contend for `elector`'s lock and run kopf while leading, until `stop_flag` is set.

    `elector` may be started or not (then it is started here, and closed on return). `registry`,
    `settings`, `namespaces` (default none), `clusterwide` (default False) and `memo` go to
    `kopf.operator()` (`settings` is copied per term: kopf writes into it). `on_leading(term)` runs
    before kopf starts in each term, `on_stopped(term)` once it has stopped (keep both short;
    plain or async; errors are logged).

    `on_stuck` says what happens when kopf cannot be stopped within the stop budget (a
    synchronous handler stuck in kopf's executor: threads cannot be interrupted). "exit" (the
    default) logs a CRITICAL line and ends the process at once with exit code
    `EXIT_KOPF_STUCK`, before the lease is released: the stuck handler dies with the process and
    the lease expires after the ttl, so no other replica runs kopf beside it. "wait" keeps the
    process and waits for kopf to stop, inside the term: the lease stays held (renewed) while the
    Redis link holds, and is released only after kopf stopped. Its risk: if the term ends
    meanwhile (Redis lost, renew deadline), the lease goes after `stop_work_s` and another
    replica may run kopf beside the stuck handler; and a handler stuck for good keeps this replica
    leading without a working kopf (a SIGKILL, e.g. Kubernetes' after the grace period, ends it).

    Raises `KopfOperatorExited` when kopf ends by itself (after releasing the lease),
    `ElectorConfigError` for settings that cannot work.
    """
    opts = _Options(**options)
    _validate(elector, opts)
    singleton = _Singleton(elector, opts, stop_flag=stop_flag if stop_flag is not None else asyncio.Event())
    try:
        elector.status()
    except RuntimeError:  # not started: this call owns its lifetime
        async with elector:
            await singleton.run()
    else:
        await singleton.run()


def run_singleton_blocking(
    elector: Elector, *, stop_flag: asyncio.Event | None = None, **options: Unpack[SingletonOptions]
) -> None:
    """Like `kopf.run()`: `run_singleton()` in a new event loop, stopped by SIGTERM or SIGINT.

    The first signal stops gracefully (a leader stops kopf, then releases the lease); a second one
    cancels at once, without waiting for the release.
    """
    _validate(elector, _Options(**options))

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
            await run_singleton(elector, stop_flag=stop, **options)
        finally:
            if handled:
                for signum in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(signum)

    asyncio.run(main())


def _validate(elector: Elector, opts: _Options) -> None:
    """Refuse, before contending, what could not work; errors name the parameter."""
    namespaces, clusterwide = opts.namespaces, opts.clusterwide
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
    if opts.on_stuck not in get_args(OnStuck):
        raise ElectorConfigError("on_stuck", f'must be "exit" or "wait", got {opts.on_stuck!r}')
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

    def __init__(self, elector: Elector, opts: _Options, *, stop_flag: asyncio.Event) -> None:
        self._elector = elector
        self._opts = opts
        self._namespaces = tuple(opts.namespaces)
        self._stop_flag = stop_flag
        self._stop_budget_s = STOP_BUDGET_SHARE * elector.timing.stop_work_s
        self._phase = _Phase.IDLE
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
        # No earlier term's kopf can still run here: `_lead` returns only once its kopf has
        # stopped ("wait"), or the process has ended ("exit").
        while not self._stop_flag.is_set():
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
        opts = self._opts
        await _call_hook("on_leading", opts.on_leading, term)
        kopf_thread = KopfThread(
            name=self._elector.lock,
            registry=opts.registry,
            settings=term_settings(opts.settings, stop_budget_s=self._stop_budget_s),
            namespaces=self._namespaces,
            clusterwide=opts.clusterwide,
            memo=opts.memo,
        )
        kopf_thread.start()
        stopping = asyncio.create_task(self._stop_flag.wait())
        waits: list[asyncio.Future[Any]] = [kopf_thread.finished, stopping]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            # Reached on the stop flag, on kopf's own exit, and on the term's end (a cancellation):
            # the lease is still ours meanwhile, the Elector releases it only after we return
            # (or after stop_work_s, of which the stop budget is a share).
            if not await kopf_thread.stop(budget_s=self._stop_budget_s):
                if opts.on_stuck == "exit":
                    _exit_stuck(self._elector, budget_s=self._stop_budget_s)
                await self._wait_for_stuck_kopf(kopf_thread, term)
            logger.info("kopf stopped", extra=self._log_extra)
            await _call_hook("on_stopped", opts.on_stopped, term)
        if not self._stop_flag.is_set():
            outcome = kopf_thread.finished.result()
            raise KopfOperatorExited(f"kopf's operator exited by itself: {outcome!r}") from outcome

    async def _wait_for_stuck_kopf(self, kopf_thread: KopfThread, term: Leadership) -> None:
        """on_stuck="wait": stay in the term (the lease held, renewed) until kopf has stopped.

        Never two kopf operators from this process: no new term starts kopf before this returns.
        If the term ends meanwhile, the Elector releases after stop_work_s and keeps contending;
        should it win again, it holds the lease without kopf until the stuck one has stopped.
        """
        while not kopf_thread.finished.done():
            if term.active:
                logger.error(
                    "kopf did not stop (a synchronous handler?): holding the lease, not releasing, "
                    "until it stops", extra=self._log_extra,
                )  # fmt: skip
            else:
                logger.error(
                    "kopf did not stop (a synchronous handler?) and the lease has gone: another "
                    "replica may run kopf beside it; no new kopf here until it stops",
                    extra=self._log_extra,
                )  # fmt: skip
            await asyncio.wait([kopf_thread.finished], timeout=STUCK_LOG_INTERVAL_S)


def _exit_stuck(elector: Elector, *, budget_s: float) -> NoReturn:
    """on_stuck="exit": end the process now, before the Elector can release the lease.

    Threads cannot be killed; the process can. Without this, the release would let another
    replica start kopf while this one's handler still runs (kopf's own last resort, its
    ultimate_exiting_timeout, is off under elector). The lease is left to expire after the ttl.
    """
    logger.critical(
        "kopf of lock %r did not stop within %.3fs (a synchronous handler or daemon that ignores "
        "cancellation): ending the process with exit code %d, without releasing the lease, so "
        "that no other replica runs kopf beside it; the lease expires after the ttl (%ss)",
        elector.lock, budget_s, EXIT_KOPF_STUCK, elector.timing.ttl_s,
        extra={"lock": elector.lock, "identity": elector.identity},
    )  # fmt: skip
    for handler in logging.getLogger().handlers:  # os._exit flushes nothing itself
        with contextlib.suppress(Exception):
            handler.flush()
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    os._exit(EXIT_KOPF_STUCK)


async def _call_hook(name: str, hook: OnTerm | None, term: Leadership) -> None:
    if hook is None:
        return
    try:
        result = hook(term)
        if inspect.isawaitable(result):
            await result
    except Exception:
        logger.exception("%s hook failed", name, extra={"lock": term.lock})
