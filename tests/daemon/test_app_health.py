"""Leadership follows the app (`--app-health-url`): real daemons, real app health endpoints.

Each daemon checks an `AppStub` the test switches. What must hold: a leader whose app turns
unhealthy hands over within interval x failures + 1 s (plus what this machine's measured
lateness costs the steps in between); a replica whose app is unhealthy, or never was healthy,
never leads, also when it is the only one left; one success makes it contend again. Timing is
read from the daemons' own log lines, not from when this process got the CPU to poll.
"""

from __future__ import annotations

import datetime
import signal
import time
from collections.abc import Iterator

import pytest

from tests.daemon.app_stub import AppStub, closed_port
from tests.support.daemon import DaemonProcess, DaemonStarter, wait_until
from tests.support.lateness import thread_lateness

INTERVAL_S = 0.2
FAILURES = 3
#: Bounds on hangs, not claims.
START_S = 15.0
HANG_S = 15.0


def gated(interval_s: float = INTERVAL_S, failures: int = FAILURES, min_term: str = "0s") -> tuple[str, ...]:
    return (
        "--app-health-interval", f"{interval_s * 1000:g}ms",
        "--app-health-failures", str(failures),
        "--app-health-min-term", min_term,
    )  # fmt: skip


@pytest.fixture
def apps() -> Iterator[dict[str, AppStub]]:
    stubs = {name: AppStub() for name in ("a", "b")}
    yield stubs
    for stub in stubs.values():
        stub.close()


def logged(process: DaemonProcess, event: str, **fields: object) -> list[float]:
    """Every moment (time.time()'s clock) the daemon logged `event` with these fields."""
    return [
        datetime.datetime.fromisoformat(line["timestamp"]).timestamp()
        for line in process.log_lines()
        if line.get("event") == event and all(line.get(k) == v for k, v in fields.items())
    ]


def metric_value(process: DaemonProcess, name: str) -> float | None:
    for line in process.metrics().splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_the_leader_hands_over_when_its_app_fails_and_an_unhealthy_replica_never_leads(
    daemon: DaemonStarter, apps: dict[str, AppStub]
) -> None:
    a = daemon("a", "--app-health-url", apps["a"].url, *gated(), ttl="2s")
    wait_until(a.is_leader, timeout_s=START_S)
    b = daemon("b", "--app-health-url", apps["b"].url, *gated(), ttl="2s")
    wait_until(lambda: logged(b, "app_healthy"), timeout_s=START_S)
    assert metric_value(a, "elector_app_healthy") == 1

    with thread_lateness() as lateness:
        turned_at = time.time()
        apps["a"].mode = "sick"
        wait_until(b.is_leader, timeout_s=HANG_S)
    (took_over_at,) = logged(b, "acquired", identity="b")
    # The three failed checks are timer wake-ups of a's checker; the hand-over is a's step-down,
    # its release and b's acquire on the announcement: each may run as late as measured here.
    bound_s = INTERVAL_S * FAILURES + 1.0 + 3 * lateness.worst_s
    assert took_over_at - turned_at <= bound_s, (took_over_at - turned_at, lateness)
    (stepped,) = [line for line in a.log_lines() if line.get("event") == "released"]
    assert stepped["reason"] == "app_unhealthy"
    assert logged(a, "app_unhealthy")
    wait_until(lambda: metric_value(a, "elector_app_healthy") == 0, timeout_s=HANG_S)
    assert 'elector_step_downs_total{lock="jobs",reason="app_unhealthy"} 1.0' in a.metrics()

    # The other replica dies: a's app is still failing, so a never leads, however long.
    b.signal(signal.SIGKILL)
    b.wait()
    watched_until = time.time() + 3 * 2.0  # past b's lease and more
    while time.time() < watched_until:
        assert not a.is_leader()
        time.sleep(0.05)
    assert len(logged(a, "acquired", identity="a")) == 1  # its first term only

    # One success and it contends again: b's lease is long gone, so it leads at once.
    recovered_at = time.time()
    apps["a"].mode = "ok"
    wait_until(a.is_leader, timeout_s=HANG_S)
    acquired = logged(a, "acquired", identity="a")
    assert len(acquired) == 2 and acquired[1] >= recovered_at


def test_a_replica_whose_app_never_answered_never_leads(daemon: DaemonStarter) -> None:
    url = f"http://127.0.0.1:{closed_port()}/healthz"
    a = daemon("a", "--app-health-url", url, *gated(), ttl="1s")
    wait_until(lambda: logged(a, "app_unhealthy"), timeout_s=START_S)
    time.sleep(2.0)  # two ttls of a free lock
    assert not a.is_leader()
    assert not logged(a, "acquired")
    (line,) = [line for line in a.log_lines() if line.get("event") == "app_unhealthy"]
    assert line["was"] == "never healthy" and line["result"] == "refused"
    assert metric_value(a, "elector_app_healthy") == 0
    # /readyz is about Redis, not the app: unchanged.
    assert a.get("/readyz")[0] == 200


@pytest.mark.parametrize("mode", ["hang", "huge", "garbage"])
def test_a_hung_or_hostile_app_is_a_failure_within_the_timeout(daemon: DaemonStarter, mode: str) -> None:
    stub = AppStub(mode)
    try:
        a = daemon(
            "a", "--app-health-url", stub.url, *gated(failures=1), "--app-health-timeout", "100ms", ttl="1s"
        )
        wait_until(lambda: logged(a, "app_unhealthy"), timeout_s=START_S)
        (line,) = [line for line in a.log_lines() if line.get("event") == "app_unhealthy"]
        assert line["result"] == {"hang": "timeout", "huge": "bad_answer", "garbage": "bad_answer"}[mode]
        assert not a.is_leader()
        assert a.get("/healthz")[0] == 200
    finally:
        stub.close()
