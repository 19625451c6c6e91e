from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from elector.daemon.logs import LogSettings, configure_logging, make_logger
from elector.election.outcome import CycleOutcome, OutcomeKind, State, StepDownReason
from elector.lease import Holder
from elector.telemetry.outcome_log import OutcomeLogger

ME = Holder(identity="pod-a", fencing_token=7)
OTHER = Holder(identity="pod-b", fencing_token=8)


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """configure_logging changes process-wide logging; put it back after each test."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    access_level = logging.getLogger("aiohttp.access").level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.getLogger("aiohttp.access").setLevel(access_level)


class Output:
    def __init__(self, stream: io.StringIO) -> None:
        self.stream = stream

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.stream.getvalue().splitlines()]

    def events(self, level: str | None = None) -> list[str]:
        return [line["event"] for line in self.lines() if level is None or line["level"] == level]


@pytest.fixture
def output() -> Output:
    stream = io.StringIO()
    configure_logging(LogSettings(format="auto", level="debug"), stream=stream)
    return Output(stream)


def context() -> Mapping[str, object]:
    return {"lock": "jobs", "identity": "pod-a", "state": "follower", "fencing_token": None}


def outcome(kind: OutcomeKind, **fields: Any) -> CycleOutcome:
    fields.setdefault("at", 1.0)
    return CycleOutcome(kind=kind, state=State.FOLLOWER, **fields)


# --- settings and pipeline -------------------------------------------------------------------


def test_settings_reject_unknown_values() -> None:
    assert LogSettings(level="DEBUG").level_number == logging.DEBUG
    with pytest.raises(ValueError, match="'verbose'"):
        LogSettings(level="verbose")
    with pytest.raises(ValueError, match="'xml'"):
        LogSettings(format="xml")  # type: ignore[arg-type]


def test_json_lines_carry_the_context_read_at_log_time(output: Output) -> None:
    state = {"value": "follower"}
    log = make_logger("elector.test.context", context=lambda: {"lock": "jobs", "state": state["value"]})
    log.info("first", answer=42)
    state["value"] = "leader"
    log.info("second", state="explicit wins")
    log.warning("third")

    first, second, third = output.lines()
    assert first["event"] == "first"
    assert first["answer"] == 42
    assert first["lock"] == "jobs"
    assert first["state"] == "follower"
    assert first["level"] == "info"
    assert first["logger"] == "elector.test.context"
    assert first["timestamp"].endswith("Z")
    assert second["state"] == "explicit wins"
    assert third["state"] == "leader"
    assert third["level"] == "warning"


def test_stdlib_loggers_go_through_the_same_renderer(output: Output) -> None:
    logging.getLogger("redis").warning("connection %s lost", "#3", extra={"attempt": 2})
    (line,) = output.lines()
    assert line["event"] == "connection #3 lost"
    assert line["level"] == "warning"
    assert line["logger"] == "redis"
    assert line["attempt"] == 2
    assert "timestamp" in line


def _log_bad_request() -> None:
    from aiohttp.http_exceptions import LineTooLong

    try:
        raise LineTooLong("header", "8190")
    except LineTooLong:
        logging.getLogger("aiohttp.server").exception("Error handling request from 127.0.0.1")


@pytest.mark.parametrize("log_format", ["json", "console"])
def test_tracebacks_never_show_local_variables(log_format: str) -> None:
    stream = io.StringIO()
    configure_logging(LogSettings(format=log_format, level="info"), stream=stream)  # type: ignore[arg-type]
    secret = "S3cretPassw0rd"  # a local of the failing frame, like RedisSettings.url
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("elector").exception("election_crashed")
    text = stream.getvalue()
    assert "boom" in text and "election_crashed" in text
    assert secret not in text


def test_malformed_requests_never_log_errors(output: Output) -> None:
    _log_bad_request()
    (line,) = output.lines()
    assert line["level"] == "debug" and "exception" not in line
    assert "Error handling request" in line["event"]


def test_malformed_requests_are_dropped_above_debug() -> None:
    stream = io.StringIO()
    configure_logging(LogSettings(format="json", level="info"), stream=stream)
    _log_bad_request()
    logging.getLogger("aiohttp.server").error("a real server error")
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [line["event"] for line in lines] == ["a real server error"]


def test_exceptions_are_rendered_as_structured_tracebacks(output: Output) -> None:
    log = make_logger("elector.test.exc", context=context)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("failed")
        logging.getLogger("aiohttp.server").exception("handler failed")
    ours, foreign = output.lines()
    for line in (ours, foreign):
        assert line["level"] == "error"
        assert line["exception"][0]["exc_type"] == "RuntimeError"
        assert line["exception"][0]["exc_value"] == "boom"


def test_levels_filter_before_the_context_is_read() -> None:
    stream = io.StringIO()
    configure_logging(LogSettings(format="json", level="info"), stream=stream)
    calls = []

    def counting_context() -> Mapping[str, object]:
        calls.append(1)
        return {}

    log = make_logger("elector.test.level", context=counting_context)
    log.debug("hidden")
    log.info("shown")
    assert [json.loads(line)["event"] for line in stream.getvalue().splitlines()] == ["shown"]
    assert len(calls) == 1
    assert logging.getLogger("aiohttp.access").getEffectiveLevel() == logging.WARNING


def test_configuring_twice_replaces_the_handler() -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging(LogSettings(format="json"), stream=first)
    configure_logging(LogSettings(format="json"), stream=second)
    logging.getLogger("redis").warning("once")
    assert first.getvalue() == ""
    assert len(second.getvalue().splitlines()) == 1


def test_console_format_on_a_terminal() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    configure_logging(LogSettings(format="auto"), stream=stream)
    make_logger("elector.test.console", context=context).info("hello", answer=42)
    text = stream.getvalue()
    assert "hello" in text
    assert "answer" in text
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)


# --- OutcomeLogger ---------------------------------------------------------------------------


@pytest.fixture
def outcome_logger(output: Output) -> OutcomeLogger:
    return OutcomeLogger(make_logger("elector.test.outcomes", context=context))


def test_one_info_line_per_transition(output: Output, outcome_logger: OutcomeLogger) -> None:
    for o in [
        outcome(OutcomeKind.ACQUIRED, holder=ME, duration_s=0.001, remaining_ms=10_000),
        *[outcome(OutcomeKind.RENEWED, holder=ME, duration_s=0.0005) for _ in range(5)],
        outcome(OutcomeKind.RENEW_LOST, holder=OTHER, step_down_reason=StepDownReason.LOST),
        outcome(OutcomeKind.HELD, holder=OTHER, remaining_ms=9000),
        outcome(OutcomeKind.ACQUIRED, holder=Holder("pod-a", 9)),
        outcome(OutcomeKind.RELEASED, step_down_reason=StepDownReason.SHUTDOWN),
    ]:
        outcome_logger(o)

    assert output.events("info") == ["acquired", "stepped_down", "acquired", "released"]
    acquired, stepped_down, _, released = [line for line in output.lines() if line["level"] == "info"]
    assert acquired["fencing_token"] == 7
    assert acquired["lock"] == "jobs"
    assert stepped_down["reason"] == "lost"
    assert stepped_down["holder"] == "pod-b"
    assert stepped_down["holder_fencing_token"] == 8
    assert released["reason"] == "shutdown"
    assert output.events("debug") == ["renewed"] * 5 + ["held"]


def test_renewals_stay_below_info(output: Output, outcome_logger: OutcomeLogger) -> None:
    for _ in range(20):
        outcome_logger(outcome(OutcomeKind.RENEWED, holder=ME, duration_s=0.0004))
    assert output.events("info") == []
    assert len(output.events("debug")) == 20


def test_step_down_at_the_deadline_and_failed_release(output: Output, outcome_logger: OutcomeLogger) -> None:
    outcome_logger(outcome(OutcomeKind.ACQUIRED, holder=ME))
    outcome_logger(
        outcome(OutcomeKind.RENEW_ERROR, error="timeout", step_down_reason=StepDownReason.RENEW_DEADLINE)
    )
    outcome_logger(outcome(OutcomeKind.RELEASE_FAILED, error="connection refused"))
    lines = {line["event"]: line for line in output.lines()}
    assert lines["stepped_down"]["reason"] == "renew_deadline"
    assert lines["stepped_down"]["error"] == "timeout"
    assert lines["release_failed"]["level"] == "warning"
    assert lines["release_failed"]["error"] == "connection refused"
    assert output.events("info") == ["acquired", "stepped_down"]


def test_redis_outage_is_logged_on_its_edges(output: Output, outcome_logger: OutcomeLogger) -> None:
    outcome_logger(outcome(OutcomeKind.HELD, holder=OTHER, at=1.0))
    for at in (2.0, 3.0, 4.0):
        outcome_logger(outcome(OutcomeKind.ACQUIRE_ERROR, error="connection refused", at=at))
    outcome_logger(outcome(OutcomeKind.HELD, holder=OTHER, at=6.5))
    outcome_logger(outcome(OutcomeKind.ACQUIRE_ERROR, error="timeout", at=7.0))

    edges = [line for line in output.lines() if line["level"] in ("warning", "info")]
    assert [(line["level"], line["event"]) for line in edges] == [
        ("info", "new_leader_observed"),
        ("warning", "redis_unreachable"),
        ("info", "redis_reachable"),
        ("warning", "redis_unreachable"),
    ]
    assert edges[1]["error"] == "connection refused"
    assert edges[2]["unreachable_for_s"] == 4.5
    assert edges[3]["error"] == "timeout"
    assert output.events("debug").count("redis_error") == 2


def test_a_new_kind_of_error_within_an_outage_is_warned_once(
    output: Output, outcome_logger: OutcomeLogger
) -> None:
    # A timeout first, then the data that blocks the lock: the operator must see the data error,
    # not only the first cause; repeats of either stay DEBUG.
    kinds = ["timeout", "data", "data", "connection", "timeout", "data"]
    for at, kind in enumerate(kinds, start=1):
        outcome_logger(outcome(OutcomeKind.ACQUIRE_ERROR, error=f"{kind} error", error_kind=kind, at=at))
    warned = [line for line in output.lines() if line["level"] == "warning"]
    assert [(line["event"], line["error_kind"]) for line in warned] == [
        ("redis_unreachable", "timeout"),
        ("redis_error", "data"),
    ]
    assert output.events("debug").count("redis_error") == 4  # a connection error is no new cause
    # A new outage starts the count again.
    outcome_logger(outcome(OutcomeKind.HELD, holder=OTHER, at=7.0))
    outcome_logger(outcome(OutcomeKind.ACQUIRE_ERROR, error="data error", error_kind="data", at=8.0))
    assert [line["error_kind"] for line in output.lines() if line["level"] == "warning"][-1] == "data"


def test_quiet_period_once_per_period(output: Output, outcome_logger: OutcomeLogger) -> None:
    for remaining in (3000, 2000, 1000):
        outcome_logger(outcome(OutcomeKind.QUIET_PERIOD, remaining_ms=remaining))
    outcome_logger(outcome(OutcomeKind.HELD, holder=OTHER))
    outcome_logger(outcome(OutcomeKind.QUIET_PERIOD, remaining_ms=500))
    quiet = [line for line in output.lines() if line["event"] == "quiet_period" and line["level"] == "info"]
    assert [line["remaining_ms"] for line in quiet] == [3000, 500]


def test_new_leader_observed_on_holder_changes(output: Output, outcome_logger: OutcomeLogger) -> None:
    for o in [
        outcome(OutcomeKind.HELD, holder=OTHER),
        outcome(OutcomeKind.HELD, holder=OTHER),
        outcome(OutcomeKind.ACQUIRE_ERROR, error="timeout"),  # no holder information
        outcome(OutcomeKind.HELD, holder=OTHER),
        outcome(OutcomeKind.HELD, holder=Holder("pod-b", 10)),  # same pod, new term
        outcome(OutcomeKind.HELD, holder=Holder("pod-c", 11)),
        outcome(OutcomeKind.HELD, holder=None),  # a value elector did not write
    ]:
        outcome_logger(o)
    observed = [line for line in output.lines() if line["event"] == "new_leader_observed"]
    assert [(line["holder"], line["holder_fencing_token"]) for line in observed] == [
        ("pod-b", 8),
        ("pod-b", 10),
        ("pod-c", 11),
        (None, None),
    ]
    assert all(line["level"] == "info" for line in observed)


def test_an_identity_clash_is_one_warning_per_episode(output: Output) -> None:
    """Another live process under our identity: one WARNING when it starts (the registry's flag,
    or a lease under our identity renewed beyond its ttl), none while it goes on, another after
    3 ttl without one."""
    log = OutcomeLogger(make_logger("elector.test.outcomes", context=context), identity="pod-a", ttl_s=1.0)
    log(outcome(OutcomeKind.HELD, holder=OTHER, at=1.0))
    log(outcome(OutcomeKind.HELD, holder=OTHER, at=2.0, identity_clash=True))
    log(outcome(OutcomeKind.HELD, holder=OTHER, at=3.0))
    log(outcome(OutcomeKind.HELD, holder=OTHER, at=4.5, identity_clash=True))  # the same episode
    assert output.events("warning") == ["identity_clash"]
    log(outcome(OutcomeKind.HELD, holder=OTHER, at=8.0))  # over 3 ttl without one: it ended
    # A lease under our identity may be a dead predecessor's (a restart under its identity): a
    # sign only once it outlived 1.5 ttl under one token, since only a live process renews it.
    log(outcome(OutcomeKind.HELD, holder=ME, at=9.0))
    log(outcome(OutcomeKind.HELD, holder=Holder("pod-a", 9), at=10.0))  # another term: starts over
    log(outcome(OutcomeKind.HELD, holder=Holder("pod-a", 9), at=11.0))
    assert output.events("warning") == ["identity_clash"]
    log(outcome(OutcomeKind.HELD, holder=Holder("pod-a", 9), at=11.6))
    warnings = [line for line in output.lines() if line["level"] == "warning"]
    assert [line["event"] for line in warnings] == ["identity_clash"] * 2
    assert warnings[0]["lock"] == "jobs" and warnings[0]["identity"] == "pod-a"
    assert "--identity" in warnings[0]["hint"]
    assert warnings[1]["holder"] == "pod-a" and warnings[1]["holder_fencing_token"] == 9


def test_a_leaders_renewal_that_reports_a_clash_is_warned(output: Output) -> None:
    """A follower registering under the leader's identity shows in the leader's renewals: the
    plain-renewal shortcut must not swallow it."""
    log = OutcomeLogger(make_logger("elector.test.outcomes", context=context), identity="pod-a", ttl_s=1.0)
    log(outcome(OutcomeKind.RENEWED, holder=ME, at=1.0))
    log(outcome(OutcomeKind.RENEWED, holder=ME, at=1.3, identity_clash=True))
    log(outcome(OutcomeKind.RENEWED, holder=ME, at=1.6, identity_clash=True))
    assert output.events("warning") == ["identity_clash"]


def test_without_an_identity_clashes_are_not_tracked(output: Output, outcome_logger: OutcomeLogger) -> None:
    outcome_logger(outcome(OutcomeKind.HELD, holder=ME, identity_clash=True))
    assert output.events("warning") == []


def test_a_renewal_ends_an_outage_and_a_foreign_value_as_any_answer_does(
    output: Output, outcome_logger: OutcomeLogger
) -> None:
    outcome_logger(outcome(OutcomeKind.HELD, holder=None, at=1.0))  # a value elector did not write
    outcome_logger(outcome(OutcomeKind.RENEWED, holder=ME, at=2.0))
    outcome_logger(outcome(OutcomeKind.HELD, holder=None, at=3.0))  # news again after an answer
    outcome_logger(outcome(OutcomeKind.RENEW_ERROR, error="timeout", at=4.0))
    outcome_logger(outcome(OutcomeKind.RENEWED, holder=ME, at=5.0))
    outcome_logger(outcome(OutcomeKind.RENEWED, holder=ME, at=6.0))
    edges = [
        line for line in output.lines() if line["level"] != "debug" and line["event"] != "new_leader_observed"
    ]
    assert [line["event"] for line in edges] == [
        "lock_held_by_foreign_value",
        "lock_held_by_foreign_value",
        "redis_unreachable",
        "redis_reachable",
    ]
    assert edges[-1]["unreachable_for_s"] == 1.0
    assert output.events("debug").count("renewed") == 3


def test_renewals_follow_a_log_level_changed_at_run_time(
    output: Output, outcome_logger: OutcomeLogger
) -> None:
    logger = logging.getLogger("elector.test.outcomes")
    logger.setLevel(logging.INFO)
    try:
        outcome_logger(outcome(OutcomeKind.RENEWED, holder=ME))
        logger.setLevel(logging.DEBUG)
        outcome_logger(outcome(OutcomeKind.RENEWED, holder=ME))
    finally:
        logger.setLevel(logging.NOTSET)
    assert output.events("debug").count("renewed") == 1
