"""Aggregate metrics (`MetricFamilies(per_lock=False)`): the series of many locks without a `lock` label."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from elector.election.outcome import CycleOutcome, OutcomeKind, State, StepDownReason
from elector.lease import Holder
from elector.telemetry.metrics import ElectionMetrics, MetricFamilies, per_lock_metrics
from tests.support.fake_status import FakeStatus

ME = Holder(identity="pod-a", fencing_token=7)


def outcome(kind: OutcomeKind, **fields: object) -> CycleOutcome:
    return CycleOutcome(kind=kind, state=State.LEADER, at=1.0, **fields)  # type: ignore[arg-type]


def test_auto_is_per_lock_for_a_few_locks_and_aggregate_for_many() -> None:
    assert per_lock_metrics("auto", locks=1) and per_lock_metrics("auto", locks=100)
    assert not per_lock_metrics("auto", locks=101)
    assert per_lock_metrics("always", locks=10_000)
    assert not per_lock_metrics("never", locks=1)
    with pytest.raises(ValueError, match="sometimes"):
        per_lock_metrics("sometimes", locks=1)


def test_aggregate_series_count_every_lock_together_without_a_lock_label() -> None:
    registry = CollectorRegistry()
    families = MetricFamilies(registry, per_lock=False)
    statuses = {name: FakeStatus() for name in ("a", "b", "c")}
    metrics = [ElectionMetrics(families, lock=name, status=status) for name, status in statuses.items()]
    # Every series exists at zero from the start, once.
    assert registry.get_sample_value("elector_renewals_total", {"result": "error"}) == 0
    assert registry.get_sample_value("elector_step_downs_total", {"reason": "lost"}) == 0
    for m in metrics:
        m.observe(outcome(OutcomeKind.ACQUIRED, holder=ME, duration_s=0.001))
        m.observe(outcome(OutcomeKind.RENEWED, duration_s=0.002))
    metrics[0].observe(outcome(OutcomeKind.RENEW_ERROR, error="timeout", error_kind="timeout"))
    metrics[1].observe(
        outcome(OutcomeKind.RENEW_LOST, duration_s=0.001, step_down_reason=StepDownReason.LOST)
    )
    assert registry.get_sample_value("elector_leader_transitions_total", {}) == 3
    assert registry.get_sample_value("elector_renewals_total", {"result": "ok"}) == 3
    assert registry.get_sample_value("elector_renewals_total", {"result": "error"}) == 1
    assert registry.get_sample_value("elector_redis_errors_total", {"kind": "timeout"}) == 1
    assert registry.get_sample_value("elector_step_downs_total", {"reason": "lost"}) == 1
    assert registry.get_sample_value("elector_renew_duration_seconds_count", {}) == 4
    text = generate_latest(registry).decode()
    assert 'lock="' not in text
    assert "\nelector_is_leader" not in text  # the per-lock gauges are replaced by counts of locks


def test_aggregate_gauges_count_locks_led_and_without_redis_at_scrape_time() -> None:
    registry = CollectorRegistry()
    families = MetricFamilies(registry, per_lock=False)
    leading, following, down = FakeStatus(backend_up=True), FakeStatus(backend_up=True), FakeStatus()
    leading.set(is_leader=True, state=State.LEADER)
    for name, status in (("a", leading), ("b", following), ("c", down)):
        ElectionMetrics(families, lock=name, status=status)
    assert registry.get_sample_value("elector_locks", {}) == 3
    assert registry.get_sample_value("elector_locks_leading", {}) == 1
    assert registry.get_sample_value("elector_locks_redis_down", {}) == 1
    assert registry.get_sample_value("elector_locks_identity_clash", {}) == 0
    down.set(identity_clash=True)
    assert registry.get_sample_value("elector_locks_identity_clash", {}) == 1
    following.set(is_leader=True, state=State.LEADER)
    assert registry.get_sample_value("elector_locks_leading", {}) == 2


def test_closing_a_lock_keeps_the_aggregate_totals() -> None:
    registry = CollectorRegistry()
    families = MetricFamilies(registry, per_lock=False)
    a = ElectionMetrics(families, lock="a", status=FakeStatus())
    ElectionMetrics(families, lock="b", status=FakeStatus())
    a.observe(outcome(OutcomeKind.RENEWED, duration_s=0.002))
    a.close()
    assert registry.get_sample_value("elector_locks", {}) == 1
    assert registry.get_sample_value("elector_renewals_total", {"result": "ok"}) == 1
