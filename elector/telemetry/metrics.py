"""Prometheus metrics of the election, on an injected `CollectorRegistry`.

Counters and the renewal histogram are fed by `ElectionMetrics.observe` (an `on_outcome` hook).
The gauges are not stored anywhere: a collector reads the election's status snapshot at scrape
time, so they can never drift from what the election itself believes.

Every series carries a `lock` label. One registry holds one set of metric families
(`MetricFamilies`) that any number of locks plug into; an exposition must not repeat a family,
so a second lock reuses the families instead of registering new ones.

Per-lock series cost dozens of series per lock: at thousands of locks, a cardinality problem for
Prometheus and seconds of CPU per scrape here (docs/benchmarks.md, many_locks). `MetricFamilies(...,
per_lock=False)` exports the same counters and renew histogram WITHOUT the `lock` label (totals
over the locks, so `sum(rate(...))` and `histogram_quantile(0.99, sum by (le) (...))` read the
same either way) and, instead of the per-lock gauges, counts of locks: managed, led, and with
Redis failing. The daemon picks it with `--metrics-per-lock` (see `per_lock_metrics`).
"""

from __future__ import annotations

import dataclasses
import platform
from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram, Info
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from elector._version import __version__
from elector.backend.protocol import PROTOCOL
from elector.election.outcome import CycleOutcome, ElectionStatus, OutcomeKind, StepDownReason
from elector.lease import BackendErrorKind

StatusProvider = Callable[[], ElectionStatus]

#: Renewals take well under a millisecond on a local Redis and up to the request timeout
#: (capped at 1 s) when it struggles; 2.5 s catches anything slower than a timeout allows.
RENEW_DURATION_BUCKETS_S: tuple[float, ...] = (
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)

_ACQUIRE_RESULTS: dict[OutcomeKind, str] = {
    OutcomeKind.ACQUIRED: "acquired",
    OutcomeKind.HELD: "held",
    OutcomeKind.QUIET_PERIOD: "quiet_period",
    OutcomeKind.STAND_BACK: "stand_back",
    OutcomeKind.ACQUIRE_ERROR: "error",
}
_RENEW_RESULTS: dict[OutcomeKind, str] = {
    OutcomeKind.RENEWED: "ok",
    OutcomeKind.RENEW_LOST: "lost",
    OutcomeKind.RENEW_ERROR: "error",
}
#: Outcomes of a request that failed. A failed release counts only with an error kind: one
#: that found the lease no longer ours got an answer.
_FAILED_REQUESTS = frozenset({OutcomeKind.ACQUIRE_ERROR, OutcomeKind.RENEW_ERROR})
_ERROR_KINDS: tuple[str, ...] = tuple(kind.value for kind in BackendErrorKind)
#: The kind of an error outcome that does not say which kind it was.
UNKNOWN_ERROR_KIND = "unknown"


#: `--metrics-per-lock auto` exports per-lock series up to this many locks, aggregate ones above.
AUTO_PER_LOCK_MAX_LOCKS = 100
METRICS_PER_LOCK_CHOICES = ("auto", "always", "never")


def per_lock_metrics(choice: str, *, locks: int) -> bool:
    """Whether a daemon holding `locks` locks exports per-lock series under `choice`."""
    if choice not in METRICS_PER_LOCK_CHOICES:
        raise ValueError(f"{choice!r} is not one of {', '.join(METRICS_PER_LOCK_CHOICES)}")
    return choice == "always" or (choice == "auto" and locks <= AUTO_PER_LOCK_MAX_LOCKS)


class _StatusProviders:
    """The plugged-in locks' status snapshots, read by a collector at scrape time."""

    def __init__(self) -> None:
        self._providers: dict[str, StatusProvider] = {}

    def add(self, lock: str, status: StatusProvider) -> None:
        self._providers[lock] = status

    def discard(self, lock: str) -> None:
        self._providers.pop(lock, None)

    def describe(self) -> Iterator[Metric]:
        # Declaring the names lets the registry reject a second, clashing set of families.
        yield from self._families()

    def _families(self) -> Sequence[Metric]:
        raise NotImplementedError


class _StatusCollector(_StatusProviders):
    """Computes the gauges of every plugged-in lock from its status snapshot, at scrape time."""

    def collect(self) -> Iterator[Metric]:
        is_leader, remaining, fencing, info, redis_up, clash = families = self._families()
        # A copy: a lock may be added or removed by another thread while a scrape runs.
        for lock, provider in list(self._providers.items()):
            status = provider()
            is_leader.add_metric([lock], 1.0 if status.is_leader else 0.0)
            remaining.add_metric([lock], status.lease_remaining_s or 0.0)
            fencing.add_metric([lock], float(_fencing_token(status)))
            if status.holder is not None:
                info.add_metric([lock, status.holder.identity], 1.0)
            redis_up.add_metric([lock], 1.0 if status.backend_up else 0.0)
            clash.add_metric([lock], 1.0 if status.identity_clash else 0.0)
        yield from families

    @staticmethod
    def _families() -> tuple[
        GaugeMetricFamily,
        GaugeMetricFamily,
        GaugeMetricFamily,
        GaugeMetricFamily,
        GaugeMetricFamily,
        GaugeMetricFamily,
    ]:
        return (
            GaugeMetricFamily(
                "elector_is_leader",
                "1 while this process holds the lock with validity left, else 0.",
                labels=["lock"],
            ),
            GaugeMetricFamily(
                "elector_lease_remaining_seconds",
                "Leader: our own remaining lease validity. Follower: the holder's remaining time "
                "to live as last observed. 0 when unknown or the lock is free.",
                labels=["lock"],
            ),
            GaugeMetricFamily(
                "elector_fencing_token",
                "Our fencing token while leading; otherwise the fencing token of the holder as "
                "last observed; 0 when no holder is known.",
                labels=["lock"],
            ),
            GaugeMetricFamily(
                "elector_leader_info",
                "Always 1, labelled with the identity of the lock holder as last observed; "
                "absent while no holder is known.",
                labels=["lock", "holder"],
            ),
            GaugeMetricFamily(
                "elector_redis_up",
                "1 when the last exchange with Redis succeeded, else 0.",
                labels=["lock"],
            ),
            GaugeMetricFamily(
                "elector_identity_clash",
                "1 while another live process reports this process's identity for the lock (seen "
                "within the last 3 ttl), else 0: give each process its own identity.",
                labels=["lock"],
            ),
        )


class _LockCountCollector(_StatusProviders):
    """Aggregate mode's gauges: how many locks are managed, led, and without Redis, at scrape time."""

    def collect(self) -> Iterator[Metric]:
        managed, leading, redis_down, clashing = families = self._families()
        led = down = clashes = 0
        providers = list(self._providers.values())  # a copy, as in _StatusCollector
        for provider in providers:
            status = provider()
            led += status.is_leader
            down += not status.backend_up
            clashes += status.identity_clash
        managed.add_metric([], float(len(providers)))
        leading.add_metric([], float(led))
        redis_down.add_metric([], float(down))
        clashing.add_metric([], float(clashes))
        yield from families

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily("elector_locks", "Locks this process contends for (aggregate metrics mode)."),
            GaugeMetricFamily(
                "elector_locks_leading",
                "Locks this process holds with validity left right now (aggregate metrics mode; per "
                "lock: elector_is_leader).",
            ),
            GaugeMetricFamily(
                "elector_locks_redis_down",
                "Locks whose last exchange with Redis failed (aggregate metrics mode; per lock: "
                "elector_redis_up == 0).",
            ),
            GaugeMetricFamily(
                "elector_locks_identity_clash",
                "Locks for which another live process reports this process's identity (aggregate "
                "metrics mode; per lock: elector_identity_clash).",
            ),
        )


def _fencing_token(status: ElectionStatus) -> int:
    if status.is_leader and status.fencing_token is not None:
        return status.fencing_token
    if status.holder is not None:
        return status.holder.fencing_token
    return 0


@dataclasses.dataclass(frozen=True, slots=True)
class _Children:
    transitions: Counter
    step_downs: dict[StepDownReason, Counter]
    acquires: dict[OutcomeKind, Counter]
    renewals: dict[OutcomeKind, Counter]
    renew_duration: Histogram
    withheld: Counter
    token_regressions: Counter


class MetricFamilies:
    """The metric families of one registry, shared by every lock exported through it.

    Registering it twice on one registry fails (the names clash), which is what keeps a single
    family per name in the exposition; build it once and hand it to each `ElectionMetrics`.
    """

    def __init__(self, registry: CollectorRegistry, *, per_lock: bool = True) -> None:
        self.registry = registry
        #: False: the families carry no `lock` label and count every lock together (see the module doc).
        self.per_lock = per_lock
        lock = ["lock"] if per_lock else []
        # Built unregistered, then registered together, so that a clash leaves nothing behind.
        self.leader_transitions = Counter(
            "elector_leader_transitions_total",
            "Times this process became the leader (follower -> leader).",
            lock,
            registry=None,
        )
        self.step_downs = Counter(
            "elector_step_downs_total",
            "Times this process stopped leading, by reason (lost, renew_deadline, lease_expired, "
            "shutdown, resigned, handoff, preempted).",
            [*lock, "reason"],
            registry=None,
        )
        self.acquire_attempts = Counter(
            "elector_acquire_attempts_total",
            "Acquire requests sent while following, by result (acquired, held, quiet_period, "
            "stand_back, error).",
            [*lock, "result"],
            registry=None,
        )
        self.renewals = Counter(
            "elector_renewals_total",
            "Renew requests sent while leading, by result (ok, lost, error).",
            [*lock, "result"],
            registry=None,
        )
        self.redis_errors = Counter(
            "elector_redis_errors_total",
            "Failed Redis requests, by kind: connection, timeout, auth, data (a key of the lock "
            "holds something elector did not write: see the logs for which), server.",
            [*lock, "kind"],
            registry=None,
        )
        self.releases_withheld = Counter(
            "elector_release_withheld_total",
            "Step-downs whose leader work could not be stopped (the command survived SIGKILL, a "
            "library body outlived stop_work_s, the stop path raised): the lease was not released "
            "but left to lapse by its ttl.",
            lock,
            registry=None,
        )
        self.token_regressions = Counter(
            "elector_fencing_token_regressions_total",
            "Times this process saw a holder's fencing token lower than one it had seen before "
            "(a Redis server's clock behind after the counter was lost; see docs/fencing.md).",
            lock,
            registry=None,
        )
        self.renew_duration = Histogram(
            "elector_renew_duration_seconds",
            "Round trip of renew requests, seconds (failed ones included when they completed).",
            lock,
            buckets=RENEW_DURATION_BUCKETS_S,
            registry=None,
        )
        self.status_collector: _StatusCollector | _LockCountCollector = (
            _StatusCollector() if per_lock else _LockCountCollector()
        )
        collectors: list[Collector] = [
            self.leader_transitions,
            self.step_downs,
            self.acquire_attempts,
            self.renewals,
            self.redis_errors,
            self.releases_withheld,
            self.token_regressions,
            self.renew_duration,
            self.status_collector,
        ]
        registered: list[Collector] = []
        try:
            for collector in collectors:
                registry.register(collector)
                registered.append(collector)
        except ValueError as exc:
            for collector in registered:
                registry.unregister(collector)
            raise ValueError(
                f"elector metrics are already registered on this registry ({exc}); "
                "build one MetricFamilies per registry and pass it to every ElectionMetrics"
            ) from exc
        self._locks: set[str] = set()
        #: Error kinds counted per lock beyond the known ones, so that remove_lock drops them too.
        self._error_kinds_seen: dict[str, set[str]] = {}
        self._shared_children: _Children | None = None

    def children_of(self, lock: str) -> _Children:
        """The series `ElectionMetrics.observe` feeds for `lock` (shared by all in aggregate mode)."""
        if not self.per_lock and self._shared_children is not None:
            return self._shared_children
        key = self.labels_of(lock)
        children = _Children(
            # Unlabelled families are their own (only) series.
            transitions=self.leader_transitions.labels(*key) if key else self.leader_transitions,
            step_downs={r: self.step_downs.labels(*key, r.value) for r in StepDownReason},
            acquires={k: self.acquire_attempts.labels(*key, v) for k, v in _ACQUIRE_RESULTS.items()},
            renewals={k: self.renewals.labels(*key, v) for k, v in _RENEW_RESULTS.items()},
            renew_duration=self.renew_duration.labels(*key) if key else self.renew_duration,
            withheld=self.releases_withheld.labels(*key) if key else self.releases_withheld,
            token_regressions=self.token_regressions.labels(*key) if key else self.token_regressions,
        )
        if not self.per_lock:
            self._shared_children = children
        return children

    def labels_of(self, lock: str) -> tuple[str, ...]:
        """The `lock` label's value of `lock`'s series: none when the series are aggregate."""
        return (lock,) if self.per_lock else ()

    def count_error(self, lock: str, kind: str) -> None:
        if kind not in _ERROR_KINDS:
            self._error_kinds_seen.setdefault(lock, set()).add(kind)
        self.redis_errors.labels(*self.labels_of(lock), kind).inc()

    def add_lock(self, lock: str, status: StatusProvider) -> None:
        """Create every series of `lock` at 0 and start exporting its status gauges."""
        if lock in self._locks:
            raise ValueError(f"metrics for lock {lock!r} are already registered")
        self.status_collector.add(lock, status)
        first = not self._locks
        self._locks.add(lock)
        if not self.per_lock and not first:
            return  # the aggregate series exist already
        # Series that exist from the start let rate() and absent-series alerts work at once.
        key = self.labels_of(lock)
        if key:
            # Unlabelled families are their own (only) series.
            self.leader_transitions.labels(*key)
            self.releases_withheld.labels(*key)
            self.token_regressions.labels(*key)
            self.renew_duration.labels(*key)
        for reason in StepDownReason:
            self.step_downs.labels(*key, reason.value)
        for result in _ACQUIRE_RESULTS.values():
            self.acquire_attempts.labels(*key, result)
        for result in _RENEW_RESULTS.values():
            self.renewals.labels(*key, result)
        for error_kind in _ERROR_KINDS:
            self.redis_errors.labels(*key, error_kind)

    def remove_lock(self, lock: str) -> None:
        """Drop every series of `lock` (when a lock stops being managed).

        Aggregate series stay: they count every lock this process has managed."""
        if lock not in self._locks:
            return
        self._locks.discard(lock)
        self.status_collector.discard(lock)
        if not self.per_lock:
            return
        self.leader_transitions.remove(lock)
        for reason in StepDownReason:
            self.step_downs.remove(lock, reason.value)
        for result in _ACQUIRE_RESULTS.values():
            self.acquire_attempts.remove(lock, result)
        for result in _RENEW_RESULTS.values():
            self.renewals.remove(lock, result)
        for error_kind in self._error_kinds_seen.pop(lock, set()) | set(_ERROR_KINDS):
            self.redis_errors.remove(lock, error_kind)
        self.releases_withheld.remove(lock)
        self.token_regressions.remove(lock)
        self.renew_duration.remove(lock)


class ElectionMetrics:
    """The metrics of one lock.

    Pass a `CollectorRegistry` for a single lock (its families are created on it), or one
    shared `MetricFamilies` when several locks are exported through the same registry.
    """

    def __init__(
        self,
        registry: CollectorRegistry | MetricFamilies,
        *,
        lock: str,
        status: StatusProvider,
    ) -> None:
        self.families = registry if isinstance(registry, MetricFamilies) else MetricFamilies(registry)
        self.lock = lock
        self.families.add_lock(lock, status)
        # Children resolved once: observe() runs every cycle and needs no label lookups. In
        # aggregate mode every lock shares one set.
        children = self.families.children_of(lock)
        self._transitions = children.transitions
        self._step_downs = children.step_downs
        self._acquires = children.acquires
        self._renewals = children.renewals
        self._renew_duration = children.renew_duration
        self._withheld = children.withheld
        self._token_regressions = children.token_regressions

    def observe(self, outcome: CycleOutcome) -> None:
        """Count one cycle's outcome (an `ElectionHooks.on_outcome` hook)."""
        kind = outcome.kind
        if kind is OutcomeKind.ACQUIRED:
            self._transitions.inc()
        if outcome.step_down_reason is not None:
            self._step_downs[outcome.step_down_reason].inc()
        acquire = self._acquires.get(kind)
        # A stand-back after resigning sends no request (no duration): not an attempt.
        if acquire is not None and (kind is not OutcomeKind.STAND_BACK or outcome.duration_s is not None):
            acquire.inc()
        renewal = self._renewals.get(kind)
        if renewal is not None:
            renewal.inc()
            if outcome.duration_s is not None:
                self._renew_duration.observe(outcome.duration_s)
        if kind is OutcomeKind.RELEASE_WITHHELD:
            self._withheld.inc()
        if outcome.token_regressed_from is not None:
            self._token_regressions.inc()
        error_kind = outcome.error_kind
        if kind in _FAILED_REQUESTS or (kind is OutcomeKind.RELEASE_FAILED and error_kind):
            self.families.count_error(self.lock, _error_kind(outcome))

    def close(self) -> None:
        """Stop exporting this lock; its series disappear from the registry."""
        self.families.remove_lock(self.lock)


def _error_kind(outcome: CycleOutcome) -> str:
    # `error_kind` (a BackendErrorKind value) is carried by outcomes of elections that report it.
    kind = outcome.error_kind
    return str(kind) if kind else UNKNOWN_ERROR_KIND


def register_process_metrics(registry: CollectorRegistry) -> None:
    """Add the standard process_*, python_info and python_gc_* metrics, and elector_build_info,
    to `registry`."""
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    register_build_info(registry)


def register_build_info(registry: CollectorRegistry) -> None:
    """`elector_build_info{version, python, protocol} 1`: which release each replica runs, so that
    a mixed fleet (a rolling upgrade, a pod left behind) shows in one query."""
    Info(
        "elector_build",
        "Always 1, labelled with this process's elector version, its Python version and the lease "
        "protocol version it writes to Redis.",
        registry=registry,
    ).info({"version": __version__, "python": platform.python_version(), "protocol": str(PROTOCOL)})
