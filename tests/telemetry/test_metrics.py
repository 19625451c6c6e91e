from __future__ import annotations

import os

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from elector.election.outcome import CycleOutcome, OutcomeKind, State, StepDownReason
from elector.lease import Holder
from elector.telemetry.metrics import ElectionMetrics, MetricFamilies, register_process_metrics
from tests.support.fake_status import FakeStatus

ME = Holder(identity="pod-a", fencing_token=7)
OTHER = Holder(identity="pod-b", fencing_token=8)


def outcome(kind: OutcomeKind, **fields: object) -> CycleOutcome:
    state = State.LEADER if kind in (OutcomeKind.ACQUIRED, OutcomeKind.RENEWED) else State.FOLLOWER
    return CycleOutcome(kind=kind, state=state, at=1.0, **fields)  # type: ignore[arg-type]


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, {"lock": "jobs", **labels})


def test_every_known_series_exists_at_zero_from_the_start(registry: CollectorRegistry) -> None:
    ElectionMetrics(registry, lock="jobs", status=FakeStatus())
    assert value(registry, "elector_leader_transitions_total") == 0
    for reason in ("lost", "renew_deadline", "lease_expired", "shutdown"):
        assert value(registry, "elector_step_downs_total", reason=reason) == 0
    for result in ("acquired", "held", "quiet_period", "error"):
        assert value(registry, "elector_acquire_attempts_total", result=result) == 0
    for result in ("ok", "lost", "error"):
        assert value(registry, "elector_renewals_total", result=result) == 0
    assert value(registry, "elector_renew_duration_seconds_count") == 0


def test_a_sequence_of_outcomes_is_counted(registry: CollectorRegistry) -> None:
    metrics = ElectionMetrics(registry, lock="jobs", status=FakeStatus())
    for o in [
        outcome(OutcomeKind.ACQUIRE_ERROR, error="connection refused"),
        outcome(OutcomeKind.HELD, holder=OTHER, duration_s=0.001),
        outcome(OutcomeKind.QUIET_PERIOD, remaining_ms=500),
        outcome(OutcomeKind.ACQUIRED, holder=ME, duration_s=0.001),
        outcome(OutcomeKind.RENEWED, duration_s=0.0004),
        outcome(OutcomeKind.RENEWED, duration_s=0.002),
        outcome(OutcomeKind.RENEW_ERROR, duration_s=None, error="timeout"),
        outcome(OutcomeKind.RENEW_ERROR, duration_s=0.3, step_down_reason=StepDownReason.RENEW_DEADLINE),
        outcome(OutcomeKind.ACQUIRED, holder=ME),
        outcome(OutcomeKind.RENEW_LOST, duration_s=0.001, step_down_reason=StepDownReason.LOST),
        outcome(OutcomeKind.STEPPED_DOWN, step_down_reason=StepDownReason.LEASE_EXPIRED),
        outcome(OutcomeKind.RELEASED, step_down_reason=StepDownReason.SHUTDOWN),
    ]:
        metrics.observe(o)

    assert value(registry, "elector_leader_transitions_total") == 2
    assert value(registry, "elector_step_downs_total", reason="renew_deadline") == 1
    assert value(registry, "elector_step_downs_total", reason="lost") == 1
    assert value(registry, "elector_step_downs_total", reason="lease_expired") == 1
    assert value(registry, "elector_step_downs_total", reason="shutdown") == 1
    assert value(registry, "elector_acquire_attempts_total", result="acquired") == 2
    assert value(registry, "elector_acquire_attempts_total", result="held") == 1
    assert value(registry, "elector_acquire_attempts_total", result="quiet_period") == 1
    assert value(registry, "elector_acquire_attempts_total", result="error") == 1
    assert value(registry, "elector_renewals_total", result="ok") == 2
    assert value(registry, "elector_renewals_total", result="error") == 2
    assert value(registry, "elector_renewals_total", result="lost") == 1
    # Four renewals completed (one error had no duration); acquires are not in the histogram.
    assert value(registry, "elector_renew_duration_seconds_count") == 4
    assert value(registry, "elector_renew_duration_seconds_bucket", le="0.0005") == 1
    assert value(registry, "elector_renew_duration_seconds_bucket", le="0.0025") == 3
    assert value(registry, "elector_renew_duration_seconds_bucket", le="2.5") == 4
    assert value(registry, "elector_renew_duration_seconds_sum") == pytest.approx(0.3034)


def test_gauges_follow_the_status_at_scrape_time(registry: CollectorRegistry) -> None:
    status = FakeStatus(holder=OTHER, lease_remaining_s=4.5, backend_up=True)
    ElectionMetrics(registry, lock="jobs", status=status)
    assert value(registry, "elector_is_leader") == 0
    assert value(registry, "elector_lease_remaining_seconds") == 4.5
    assert value(registry, "elector_fencing_token") == 8  # the holder's
    assert value(registry, "elector_leader_info", holder="pod-b") == 1
    assert value(registry, "elector_redis_up") == 1
    assert value(registry, "elector_identity_clash") == 0
    status.set(identity_clash=True)
    assert value(registry, "elector_identity_clash") == 1
    status.set(identity_clash=False)

    status.set(state=State.LEADER, is_leader=True, holder=ME, fencing_token=7, lease_remaining_s=9.0)
    assert value(registry, "elector_is_leader") == 1
    assert value(registry, "elector_fencing_token") == 7
    assert value(registry, "elector_leader_info", holder="pod-a") == 1
    assert value(registry, "elector_leader_info", holder="pod-b") is None

    status.set(state=State.FOLLOWER, is_leader=False, holder=None, fencing_token=None, lease_remaining_s=None)
    status.set(backend_up=False)
    assert value(registry, "elector_lease_remaining_seconds") == 0
    assert value(registry, "elector_fencing_token") == 0
    assert value(registry, "elector_redis_up") == 0
    text = generate_latest(registry).decode()
    assert "elector_leader_info{" not in text
    assert "# HELP elector_leader_info" in text


def test_several_locks_share_one_set_of_families(registry: CollectorRegistry) -> None:
    families = MetricFamilies(registry)
    jobs = ElectionMetrics(families, lock="jobs", status=FakeStatus(is_leader=True))
    ElectionMetrics(families, lock="mail", status=FakeStatus(lock="mail"))
    jobs.observe(outcome(OutcomeKind.ACQUIRED, holder=ME))

    assert registry.get_sample_value("elector_leader_transitions_total", {"lock": "jobs"}) == 1
    assert registry.get_sample_value("elector_leader_transitions_total", {"lock": "mail"}) == 0
    assert registry.get_sample_value("elector_is_leader", {"lock": "jobs"}) == 1
    assert registry.get_sample_value("elector_is_leader", {"lock": "mail"}) == 0
    text = generate_latest(registry).decode()
    assert text.count("# HELP elector_is_leader ") == 1  # one family, several series

    jobs.close()
    assert registry.get_sample_value("elector_is_leader", {"lock": "jobs"}) is None
    assert registry.get_sample_value("elector_leader_transitions_total", {"lock": "jobs"}) is None
    assert registry.get_sample_value("elector_is_leader", {"lock": "mail"}) == 0


def test_clashes_are_reported_clearly(registry: CollectorRegistry) -> None:
    families = MetricFamilies(registry)
    ElectionMetrics(families, lock="jobs", status=FakeStatus())
    with pytest.raises(ValueError, match="'jobs' are already registered"):
        ElectionMetrics(families, lock="jobs", status=FakeStatus())
    with pytest.raises(ValueError, match="build one MetricFamilies per registry"):
        ElectionMetrics(registry, lock="mail", status=FakeStatus())
    # The failed attempt left nothing half-registered behind.
    assert text_count(registry, "# TYPE elector_renewals_total") == 1


def text_count(registry: CollectorRegistry, needle: str) -> int:
    return generate_latest(registry).decode().count(needle)


def test_process_metrics_go_to_the_given_registry_only(registry: CollectorRegistry) -> None:
    register_process_metrics(registry)
    text = generate_latest(registry).decode()
    assert "python_info" in text
    assert "python_gc_objects_collected_total" in text
    if os.path.exists("/proc/self/stat"):  # the process collector reads /proc (Linux only)
        assert "process_cpu_seconds_total" in text
    assert "python_info" not in generate_latest(CollectorRegistry()).decode()
