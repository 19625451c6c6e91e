"""Leadership follows the app (`--app-health-url`): real daemons, real app health endpoints.

Each daemon checks an `AppStub` the test switches. What must hold: a leader whose app turns
unhealthy hands over within interval x failures + 1 s (plus what this machine's measured
lateness costs the steps in between); a replica whose app is unhealthy, or never was healthy,
never leads, also when it is the only one left; one success makes it contend again. Timing is
read from the daemons' own log lines, not from when this process got the CPU to poll.
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import json
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from elector.daemon.app_health import AppHealthSettings, CheckResult
from elector.daemon.service import Daemon
from elector.daemon.settings import Settings, SettingsError, build_settings
from elector.election import CycleOutcome, OutcomeKind, StepDownReason
from elector.testing.redis_server import RedisServerProcess
from tests.daemon.app_stub import AppStub, closed_port
from tests.faults.checker import check
from tests.support.daemon import DaemonProcess, DaemonStarter, wait_until
from tests.support.lateness import thread_lateness
from tests.support.waiting import until

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


def logged_once(process: DaemonProcess, event: str, **fields: object) -> float:
    """When the daemon logged `event` (once): waits for the line, which is written just after
    the moment /leader already shows (the status is published first)."""
    wait_until(lambda: logged(process, event, **fields), timeout_s=HANG_S)
    (at,) = logged(process, event, **fields)
    return at


def metric_value(process: DaemonProcess, name: str) -> float | None:
    for line in process.metrics().splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def leader_and_follower(
    daemon: DaemonStarter, apps: dict[str, AppStub], *, ttl: str
) -> tuple[DaemonProcess, DaemonProcess]:
    """a leads; b, whose app is healthy, follows."""
    a = daemon("a", "--app-health-url", apps["a"].url, *gated(), ttl=ttl)
    wait_until(a.is_leader, timeout_s=START_S)
    b = daemon("b", "--app-health-url", apps["b"].url, *gated(), ttl=ttl)
    wait_until(lambda: logged(b, "app_healthy"), timeout_s=START_S)
    return a, b


def test_the_leader_hands_over_when_its_app_fails_and_an_unhealthy_replica_never_leads(
    daemon: DaemonStarter, apps: dict[str, AppStub]
) -> None:
    a, b = leader_and_follower(daemon, apps, ttl="2s")
    assert metric_value(a, "elector_app_healthy") == 1

    with thread_lateness() as lateness:
        turned_at = time.time()
        apps["a"].mode = "sick"
        wait_until(b.is_leader, timeout_s=HANG_S)
    took_over_at = logged_once(b, "acquired", identity="b")
    # The three failed checks are timer wake-ups of a's checker; the hand-over is a's step-down,
    # its release and b's acquire on the announcement: each may run as late as measured here.
    bound_s = INTERVAL_S * FAILURES + 1.0 + 3 * lateness.worst_s
    assert took_over_at - turned_at <= bound_s, (took_over_at - turned_at, lateness)
    wait_until(lambda: logged(a, "released"), timeout_s=HANG_S)  # a's line may follow b's grant
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
    wait_until(lambda: len(logged(a, "acquired", identity="a")) == 2, timeout_s=HANG_S)
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


def test_every_app_unhealthy_means_no_leader_and_every_replica_says_so(
    daemon: DaemonStarter, apps: dict[str, AppStub]
) -> None:
    a, b = leader_and_follower(daemon, apps, ttl="1s")
    apps["b"].mode = apps["a"].mode = "sick"
    # b's checks may lag a's by a few: it may take the lease a's release frees, and hand it on.
    wait_until(lambda: logged(a, "app_unhealthy") and logged(b, "app_unhealthy"), timeout_s=HANG_S)
    wait_until(lambda: not a.is_leader() and not b.is_leader(), timeout_s=HANG_S)
    watched_until = time.time() + 3 * 1.0
    while time.time() < watched_until:
        assert not a.is_leader() and not b.is_leader()
        time.sleep(0.05)
    # What an operator sees: no leader, and every replica's app unhealthy (not a Redis problem).
    for replica in (a, b):
        assert metric_value(replica, "elector_app_healthy") == 0
        assert metric_value(replica, "elector_is_leader") == 0
        assert metric_value(replica, "elector_redis_up") == 1
    apps["b"].mode = "ok"
    wait_until(b.is_leader, timeout_s=HANG_S)


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


# -- exec mode: the command is the worker, its journal the judge -------------------------------

CHILD = Path(__file__).resolve().parents[1] / "faults" / "child.py"


def _gone_records(directory: Path, journal: list[dict[str, object]]) -> None:
    """A `gone` record (the checker's bound on a term without an end) for each child that has
    ended: the first moment this process saw its pid gone, which is after its death."""
    for path in directory.glob("child-*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record["kind"] == "start" and not Path(f"/proc/{record['pid']}").exists():
                journal.append({"kind": "gone", "t": time.monotonic(), "pid": record["pid"]})


def test_exec_mode_the_command_follows_the_app_and_the_journals_never_overlap(
    daemon: DaemonStarter, apps: dict[str, AppStub], redis_url: str, tmp_path: Path
) -> None:
    work = tmp_path / "journals"
    work.mkdir()
    harness: list[dict[str, object]] = [{"kind": "run", "t_begin": time.monotonic(), "prompt_s": 1.0}]

    def command(name: str) -> tuple[str, ...]:
        journal = str(work / f"child-{name}.jsonl")
        return (
            "--",
            sys.executable,
            str(CHILD),
            "--journal",
            journal,
            "--resource-url",
            redis_url,
            "--key",
            "fenced",
        )

    def started(name: str) -> int:
        path = work / f"child-{name}.jsonl"
        return path.read_text().count('"kind":"start"') if path.exists() else 0

    a = daemon("a", "--app-health-url", apps["a"].url, *gated(), *command("a"), ttl="2s")
    wait_until(lambda: started("a") == 1, timeout_s=START_S)
    b = daemon("b", "--app-health-url", apps["b"].url, *gated(), *command("b"), ttl="2s")
    wait_until(lambda: logged(b, "app_healthy"), timeout_s=START_S)

    with thread_lateness() as lateness:
        turned_at = time.time()
        apps["a"].mode = "sick"
        wait_until(lambda: started("b") == 1, timeout_s=HANG_S)
    took_over_at = logged_once(b, "acquired", identity="b")
    # As in sidecar mode, and a's command is stopped (SIGTERM; it ends within a write) first.
    bound_s = INTERVAL_S * FAILURES + 1.0 + 3 * lateness.worst_s
    assert took_over_at - turned_at <= bound_s, (took_over_at - turned_at, lateness)
    wait_until(lambda: logged(a, "released"), timeout_s=HANG_S)
    assert [line["reason"] for line in a.log_lines() if line.get("event") == "released"] == ["app_unhealthy"]

    # b's daemon dies (its keeper stops b's command); a's app still fails: a never leads.
    b.signal(signal.SIGKILL)
    b.wait()
    watched_until = time.time() + 3 * 2.0
    while time.time() < watched_until:
        assert not a.is_leader()
        time.sleep(0.05)
    assert started("a") == 1
    _gone_records(work, harness)

    apps["a"].mode = "ok"
    wait_until(lambda: started("a") == 2, timeout_s=HANG_S)
    time.sleep(0.3)  # a few fenced writes of a's second term
    a.stop()
    _gone_records(work, harness)
    harness.append(
        {"kind": "run", "t_begin": harness[0]["t_begin"], "prompt_s": 1.0, "t_end": time.monotonic()}
    )
    (work / "harness.jsonl").write_text("".join(json.dumps(record) + "\n" for record in harness))

    report = check(work)
    assert [term.identity for term in report.terms] == ["a", "b", "a"], report.explain()
    assert report.violations == 0, report.explain()
    assert report.writes_accepted > 0 and report.writes_rejected == 0, report.explain()


# -- hysteresis: a flapping app cannot move leadership faster than the floor ---------------------


def test_flapping_apps_move_leadership_no_faster_than_the_min_term(daemon: DaemonStarter) -> None:
    min_term_s, window_s, half_period_s = 2.0, 10.0, 0.6
    stubs = {name: AppStub() for name in ("a", "b")}
    stop = threading.Event()

    def flap() -> None:
        # In antiphase, each healthy for 0.6 s in every 1.2 s: one of them is always healthy, and
        # without a floor leadership would follow every flap (~1 s terms).
        healthy = "a"
        while not stop.wait(half_period_s):
            healthy = "b" if healthy == "a" else "a"
            stubs["a"].mode, stubs["b"].mode = ("ok", "sick") if healthy == "a" else ("sick", "ok")

    stubs["b"].mode = "sick"
    flapper = threading.Thread(target=flap, daemon=True)
    try:
        args = gated(interval_s=0.1, failures=2, min_term=f"{min_term_s:g}s")
        a = daemon("a", "--app-health-url", stubs["a"].url, *args, ttl="2s")
        b = daemon("b", "--app-health-url", stubs["b"].url, *args, ttl="2s")
        wait_until(lambda: a.is_leader() or b.is_leader(), timeout_s=START_S)
        with thread_lateness() as lateness:
            began = time.time()
            flapper.start()
            time.sleep(window_s)
            ended = time.time()
    finally:
        stop.set()
        for stub in stubs.values():
            stub.close()
    grants = sorted(
        [(at, "a") for at in logged(a, "acquired", identity="a")]
        + [(at, "b") for at in logged(b, "acquired", identity="b")]
    )
    in_window = [grant for grant in grants if began <= grant[0] <= ended]
    gaps = [later[0] - earlier[0] for earlier, later in itertools.pairwise(grants)]
    # The floor is real: leadership moved, though every term outlived several flaps ...
    assert len(in_window) >= 2, grants
    # ... and no faster than the floor allows: every handover came after the term had led
    # min_term by the daemon's own clock, and grants by the logs' clock are that far apart, less
    # the acquire's round trip and log write, which may run as late as measured here.
    handovers = [
        line["led_ms"]
        for proc in (a, b)
        for line in proc.log_lines()
        if line.get("event") == "app_unhealthy_handover"
    ]
    assert handovers and min(handovers) >= min_term_s * 1000, handovers
    assert min(gaps) >= min_term_s - 0.05 - 2 * lateness.worst_s, (gaps, lateness)
    assert len(in_window) <= window_s / min_term_s + 1, grants


# -- isolation: the app's endpoint never delays a renewal ---------------------------------------


async def test_a_hostile_app_endpoint_never_delays_a_renewal(redis_server: RedisServerProcess) -> None:
    """A leader whose app answers slowly, hugely, byte by byte or not at all, checked every 50 ms
    for 2 ttl (the hysteresis keeps it leading): its renewals, by its own outcomes' send times,
    stay within the renew interval plus one request timeout, and it never steps down."""
    stub = AppStub("ok")
    settings = build_settings(
        lock="jobs", identity="a", redis_url=redis_server.url, ttl=2.0, http_address="127.0.0.1:0",
        app_health_url=stub.url, app_health_interval=0.05, app_health_timeout=0.05,
        app_health_failures=1, app_health_min_term=3600.0,
    )  # fmt: skip
    outcomes: list[CycleOutcome] = []
    daemon = Daemon(
        settings, registry=CollectorRegistry(), outcome_observer=lambda _, outcome: outcomes.append(outcome)
    )
    task = asyncio.create_task(daemon.run(install_signal_handlers=False))
    try:
        await until(lambda: daemon.locks[0].status().is_leader, timeout_s=START_S)
        clock = daemon.locks[0].status
        began = clock().now
        for mode in ("hang", "huge", "drip", "garbage"):
            stub.mode = mode
            await asyncio.sleep(1.0)
        ended = clock().now
        assert daemon.app_health is not None and not daemon.app_health.healthy
        checks = daemon.app_health.checks
        assert checks[CheckResult.TIMEOUT] > 0 and checks[CheckResult.BAD_ANSWER] > 0, checks
    finally:
        stub.close()
        daemon.request_stop()
        async with asyncio.timeout(HANG_S):
            await task
    timing = settings.timing
    renewals = [
        o.at
        for o in outcomes
        if o.kind is OutcomeKind.RENEWED and began - timing.renew_interval_s <= o.at <= ended
    ]
    gaps = [later - earlier for earlier, later in itertools.pairwise(renewals)]
    assert len(renewals) >= 4 and max(gaps) <= timing.renew_interval_s + timing.request_timeout_s, gaps
    assert not [
        o
        for o in outcomes
        if o.step_down_reason is not None and o.step_down_reason is not StepDownReason.SHUTDOWN
    ]


# -- settings --------------------------------------------------------------------------------


def _settings(**changes: object) -> Settings:
    return build_settings(lock="jobs", identity="a", redis_url="redis://127.0.0.1:1/0", **changes)  # type: ignore[arg-type]


def test_app_health_is_off_by_default_and_its_defaults_follow_the_interval_and_ttl() -> None:
    assert _settings().app_health is None
    app = _settings(app_health_url="http://127.0.0.1:8080/healthz", ttl=6.0).app_health
    assert app == AppHealthSettings(
        url="http://127.0.0.1:8080/healthz", interval_s=1.0, failures=3, timeout_s=0.5, min_term_s=6.0
    )
    slow = _settings(app_health_url="https://app:8443/", app_health_interval=10.0).app_health
    assert slow is not None and slow.timeout_s == 1.0


@pytest.mark.parametrize(
    ("changes", "flag", "fragment"),
    [
        ({"app_health_url": "ftp://app/healthz"}, "--app-health-url", "scheme must be http or https"),
        ({"app_health_url": "http:///healthz"}, "--app-health-url", "has no host"),
        ({"app_health_url": "http://u:p@app/"}, "--app-health-url", "credentials"),
        ({"app_health_url": "http://app:99999/"}, "--app-health-url", "not a URL"),
        ({"app_health_url": "http://app/a b"}, "--app-health-url", "blanks or control"),
        (
            {"app_health_url": "http://app/", "app_health_interval": 0.01},
            "--app-health-interval",
            "at least 50ms",
        ),
        (
            {"app_health_url": "http://app/", "app_health_failures": 0},
            "--app-health-failures",
            "between 1 and 100",
        ),
        (
            {"app_health_url": "http://app/", "app_health_timeout": 2.0},
            "--app-health-timeout, --app-health-interval",
            "at most the interval",
        ),
        ({"app_health_url": "http://app/", "app_health_min_term": -1.0}, "--app-health-min-term", "negative"),
        ({"app_health_timeout": 0.5}, "--app-health-timeout", "only applies with --app-health-url"),
        ({"compat_api": "consul"}, "--compat-api", "not one of leader-elector, nais"),
    ],
)
def test_bad_app_health_settings_are_refused_naming_the_flag(
    changes: dict[str, object], flag: str, fragment: str
) -> None:
    with pytest.raises(SettingsError, match=fragment) as caught:
        _settings(**changes)
    assert caught.value.setting == flag


def test_a_bad_app_health_url_from_the_environment_names_the_variable(redis_url: str, tmp_path: Path) -> None:
    process = DaemonProcess(
        redis_url=redis_url, identity="a", log_dir=tmp_path, env={"ELECTOR_APP_HEALTH_URL": "tcp://app:80"}
    )
    process.start()
    assert process.wait() == 2
    assert "--app-health-url (set by ELECTOR_APP_HEALTH_URL)" in process.logs_text()
