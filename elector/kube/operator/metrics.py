"""The operator's metrics, on a registry passed in (never the global one)."""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge

#: Reasons of `elector_operator_reconcile_errors_total`: a closed set, so the series stay few.
ERROR_REASONS = ("invalid_spec", "secret", "redis", "kubernetes", "handoff", "internal")


class OperatorMetrics:
    """`elector_lock_holder_info{namespace,lock,holder}`, reconcile errors by reason, and whether this
    replica leads (runs kopf)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.holder_info = Gauge(
            "elector_lock_holder_info",
            "1 for the current holder of each lock a LeaderElection watches",
            ["namespace", "lock", "holder"],
            registry=registry,
        )
        self.reconcile_errors = Counter(
            "elector_operator_reconcile_errors_total",
            "Failed reconciliations of LeaderElections, by reason",
            ["reason"],
            registry=registry,
        )
        self.leader = Gauge(
            "elector_operator_leader",
            "1 while this replica holds the operator's lease and runs kopf, 0 while it stands by",
            registry=registry,
        )
        for reason in ERROR_REASONS:
            self.reconcile_errors.labels(reason=reason)
        self._holders: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()  # kopf may run in its own thread beside the HTTP server

    def set_holder(self, *, namespace: str, lock: str, holder: str | None) -> None:
        """Export `holder` as the lock's one series (none while the lock is free)."""
        with self._lock:
            old = self._holders.pop((namespace, lock), None)
            if old is not None and old != holder:
                self.holder_info.remove(namespace, lock, old)
            if holder is not None:
                self._holders[(namespace, lock)] = holder
                self.holder_info.labels(namespace=namespace, lock=lock, holder=holder).set(1)

    def forget(self, *, namespace: str, lock: str) -> None:
        self.set_holder(namespace=namespace, lock=lock, holder=None)

    def leading(self, active: bool) -> None:
        self.leader.set(1 if active else 0)

    def error(self, reason: str) -> None:
        self.reconcile_errors.labels(reason=reason if reason in ERROR_REASONS else "internal").inc()
