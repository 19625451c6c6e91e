"""Singleton kopf operators under a Redis lease: elector.kube.run_singleton.

The failover tests run two operators as child processes (tests/kube/singleton_app.py) against
one kmock emulator in this process and a real redis-server; the leader reaches Redis through a
TcpProxy, so that it alone can be cut off. Times are time.monotonic(), which Linux shares
between processes. kmock replays every object on each watch: handlers run at least once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import kmock as kmock_lib
import kopf
import pytest
import redis.asyncio as aioredis

import elector
from elector.election import ElectionTiming
from elector.kube import run_singleton
from elector.kube.singleton import EXIT_KOPF_STUCK, MIN_STOP_WORK_S, KopfOperatorExited
from tests.kube.kmock_support import create_object, seed_object
from tests.support.tcp_proxy import TcpProxy

REPO = Path(__file__).resolve().parents[2]
APP = Path(__file__).with_name("singleton_app.py")
LOCK = "singleton-test"
LEASE_KEY = f"elector:{{{LOCK}}}:lease"


def stop_work_for(ttl_s: float) -> float:
    """The longest stop-work time the default timing allows at `ttl_s` (the renew deadline plus
    the safety margin, of which stop-work is a part, must fit in the ttl), less 0.1 s: the
    singleton's stop budget is 0.9 of it. At 0.5 s (budget 0.45 s) kopf's stop took longer at a
    load average of 10 (`make test-loaded`), and on_stuck="exit" ended a child that a test needed
    to stop cleanly."""
    timing = ElectionTiming.from_ttl(ttl_s)  # stop-work 0: validity_s is the room for it
    return round(timing.validity_s - timing.renew_deadline_s - 0.1, 3)


# -- helpers ---------------------------------------------------------------------------------------


class SingletonProcess:
    """One child running singleton_app.py; its events are JSON lines in a file of its own."""

    def __init__(
        self, identity: str, *, redis_url: str, kube_url: str, tmp: Path, ttl_s: float,
        extra: Sequence[str] = (),
    ) -> None:  # fmt: skip
        self.identity = identity
        self.events_path = tmp / f"{identity}.events"
        self.log_path = tmp / f"{identity}.log"
        command = [
            sys.executable, str(APP),
            "--identity", identity,
            "--redis-url", redis_url,
            "--kube-url", kube_url,
            "--events", str(self.events_path),
            "--lock", LOCK,
            "--ttl-s", str(ttl_s),
            "--stop-work-s", str(stop_work_for(ttl_s)),
            *extra,
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=log, env=env, cwd=REPO)

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        if not self.events_path.exists():
            return []
        lines = self.events_path.read_text().splitlines()
        events = [json.loads(line) for line in lines if line.strip()]
        return [e for e in events if kind is None or e["event"] == kind]

    def handled(self) -> list[dict[str, Any]]:
        return self.events("handled")

    async def wait_for(self, kind: str, *, timeout_s: float, name: str | None = None) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for event in self.events(kind):
                if name is None or event.get("name") == name:
                    return event
            if self.process.poll() is not None:
                break
            await asyncio.sleep(0.02)
        lines = 40
        if self.process.poll() is None:  # where every thread waits (singleton_app's faulthandler)
            self.process.send_signal(signal.SIGUSR1)
            await asyncio.sleep(1.0)
            lines = 160
        raise AssertionError(
            f"{self.identity}: no {kind!r} event{f' for {name}' if name else ''} in {timeout_s}s "
            f"(exit code {self.process.poll()}); events: {self.events()}\nlog:\n{self.log_tail(lines)}"
        )

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class LeaseWatcher:
    """Polls the lease key straight on Redis (not through any proxy): who holds it, until when."""

    def __init__(self, redis_url: str) -> None:
        self._client = aioredis.Redis.from_url(redis_url, socket_timeout=2.0)
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        #: (send time, holder identity or None, remaining ms)
        self.samples: list[tuple[float, str | None, int]] = []

    async def __aenter__(self) -> LeaseWatcher:
        self._task = asyncio.create_task(self._poll())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._task is not None
        # Not a cancellation: a request cancelled halfway made redis-py's close hang for minutes.
        self._stopping = True
        await asyncio.wait_for(self._task, timeout=10)
        await self._client.aclose()

    async def _poll(self) -> None:
        while not self._stopping:
            sent = time.monotonic()
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.get(LEASE_KEY)
                pipe.pttl(LEASE_KEY)
                value, pttl = await pipe.execute()
            holder = json.loads(value)["identity"] if value is not None else None
            self.samples.append((sent, holder, pttl))
            await asyncio.sleep(0.02)

    def expiry_of(self, identity: str) -> float:
        """The earliest moment the last observed lease of `identity` could expire on Redis."""
        held = [sent + pttl / 1000 for sent, holder, pttl in self.samples if holder == identity]
        assert held, f"the watcher never saw {identity} hold the lease"
        return held[-1]


@pytest.fixture
async def children(kmock: kmock_lib.KubernetesEmulator) -> AsyncIterator[list[SingletonProcess]]:
    """The test's children, stopped before kmock: its server waits for open watches otherwise."""
    started: list[SingletonProcess] = []
    yield started
    await asyncio.gather(*(asyncio.to_thread(child.stop) for child in started))
    await asyncio.sleep(0.5)  # the server sees the watches' connections close and ends their handlers


async def start(
    children: list[SingletonProcess], identity: str, *, redis_url: str, kube: Any, tmp: Path, ttl_s: float,
    extra: Sequence[str] = (),
) -> SingletonProcess:  # fmt: skip
    child = SingletonProcess(
        identity, redis_url=redis_url, kube_url=str(kube.url), tmp=tmp, ttl_s=ttl_s, extra=extra
    )
    children.append(child)
    await child.wait_for("started", timeout_s=30)
    return child


def assert_handled_only_while_leading(child: SingletonProcess) -> None:
    """Every handler run of `child` lies inside one of its terms: [leading, stopped]."""
    terms: list[tuple[float, float]] = []
    for lead in child.events("leading"):
        stops = [s["t"] for s in child.events("stopped") if s["fencing_token"] == lead["fencing_token"]]
        terms.append((lead["t"], stops[0] if stops else float("inf")))
    for event in child.handled():
        assert any(begin <= event["t"] <= end for begin, end in terms), (child.identity, event, terms)


# -- the library's contract, in process --------------------------------------------------------------


def test_import_elector_and_elector_kube_loads_no_kopf() -> None:
    code = (
        "import sys, elector, elector.kube; elector.Elector; "
        "print(sorted(m for m in sys.modules if m.startswith('kopf')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]"


async def test_refuses_settings_that_cannot_work() -> None:
    unreachable = "redis://127.0.0.1:1/0"  # never contacted: the checks come first
    short = elector.Elector(LOCK, redis=unreachable, ttl_s=1.0)  # default stop_work_s: 0.1 s
    with pytest.raises(elector.ElectorConfigError, match=r"stop_work_s: .*at least 0\.25s") as info:
        await run_singleton(short, namespaces=["default"])
    assert info.value.parameter == "stop_work_s"
    assert MIN_STOP_WORK_S == 0.25
    fine = elector.Elector(LOCK, redis=unreachable, ttl_s=3.0, stop_work_s=0.5)
    with pytest.raises(elector.ElectorConfigError, match="not both"):
        await run_singleton(fine, namespaces=["default"], clusterwide=True)
    with pytest.raises(elector.ElectorConfigError, match="clusterwide=True"):
        await run_singleton(fine)
    with pytest.raises(elector.ElectorConfigError, match="the string 'default'"):
        await run_singleton(fine, namespaces="default")
    with pytest.raises(elector.ElectorConfigError, match='on_stuck: must be "exit" or "wait"'):
        await run_singleton(fine, namespaces=["default"], on_stuck="kill")  # type: ignore[typeddict-item]


async def test_stop_flag_stops_kopf_within_the_budget_and_releases(
    redis_url: str, kmock: kmock_lib.KubernetesEmulator, kopf_registry: kopf.OperatorRegistry,
    kopf_settings: kopf.OperatorSettings,
) -> None:  # fmt: skip
    handled: list[str] = []
    handling = threading.Event()  # set in kopf's thread

    @kopf.on.create("v1", "configmaps", registry=kopf_registry)
    async def slow(name: str, **_: Any) -> None:
        handled.append(name)
        handling.set()
        await asyncio.sleep(60)  # ignores kopf's graceful exit: only the cancellation ends it

    seed_object(kmock, "v1/configmaps", "default", "slow-1")
    # kopf's own graceful exit waits this long for the handler: the singleton must cap it to its
    # stop budget. A stop budget of 0.3 s was missed at load 11 (`make test-loaded`), and a kopf
    # that does not stop within it ends the process (on_stuck="exit"): here, the test's worker.
    # So a budget a loaded machine can keep, and a kopf exit_timeout far beyond it.
    kopf_settings.queueing.exit_timeout = 30.0
    exit_timeout_before = kopf_settings.queueing.exit_timeout
    terms: list[int] = []
    stop = asyncio.Event()
    candidate = elector.Elector(LOCK, redis=redis_url, identity="solo", ttl_s=10.0, stop_work_s=3.0)
    runner = asyncio.create_task(
        run_singleton(
            candidate, registry=kopf_registry, settings=kopf_settings, namespaces=["default"],
            stop_flag=stop, on_leading=lambda term: terms.append(term.fencing_token),
        )
    )  # fmt: skip
    try:
        assert await asyncio.to_thread(handling.wait, 20), "kopf never handled the seeded object"
        asserted_by = aioredis.Redis.from_url(redis_url)
        assert await asserted_by.exists(LEASE_KEY) == 1
        asked = time.monotonic()
        stop.set()
        await asyncio.wait_for(runner, timeout=10)
        took = time.monotonic() - asked
        # kopf's own graceful exit would wait its exit_timeout for the handler (which sleeps a
        # minute): the singleton caps it to its stop budget and cancels, so it ends sooner.
        assert took < exit_timeout_before, took
        assert await asserted_by.exists(LEASE_KEY) == 0  # released, not left to expire
        await asserted_by.aclose()
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
    assert handled and handled[0] == "slow-1" and terms and terms[0] >= 1
    assert kopf_settings.queueing.exit_timeout == exit_timeout_before  # the caller's object is untouched


async def test_kopf_exiting_by_itself_releases_and_raises(
    redis_url: str, kopf_registry: kopf.OperatorRegistry, kopf_settings: kopf.OperatorSettings
) -> None:
    @kopf.on.startup(registry=kopf_registry)
    def refuse(**_: Any) -> None:
        raise kopf.PermanentError("cannot start")

    candidate = elector.Elector(LOCK, redis=redis_url, identity="solo", ttl_s=3.0, stop_work_s=0.5)
    with pytest.raises(KopfOperatorExited) as info:
        await asyncio.wait_for(
            run_singleton(candidate, registry=kopf_registry, settings=kopf_settings, namespaces=["default"]),
            timeout=20,
        )
    assert info.value.__cause__ is not None  # kopf's own error
    client = aioredis.Redis.from_url(redis_url)
    assert await client.exists(LEASE_KEY) == 0
    await client.aclose()


# -- two operators, two processes ----------------------------------------------------------------------


async def test_only_the_leader_handles_and_the_other_takes_over_after_a_cut(
    redis_url: str, tcp_proxy: TcpProxy, kmock: kmock_lib.KubernetesEmulator, tmp_path: Path,
    children: list[SingletonProcess],
) -> None:  # fmt: skip
    # 6 s: the stop budget (stop_work_for) is then 1.65 s; kopf's stop missed 0.45 s at load 10.
    ttl_s = 6.0
    async with LeaseWatcher(redis_url) as watcher:
        a = await start(children, "a", redis_url=tcp_proxy.url, kube=kmock, tmp=tmp_path, ttl_s=ttl_s)
        await a.wait_for("leading", timeout_s=20)
        b = await start(children, "b", redis_url=redis_url, kube=kmock, tmp=tmp_path, ttl_s=ttl_s)
        await asyncio.sleep(0.5)  # b contends meanwhile
        await create_object(kmock, "v1/configmaps", "default", "before-cut")
        await a.wait_for("handled", name="before-cut", timeout_s=20)
        await asyncio.sleep(0.5)  # b would have handled it by now, had its kopf been running
        assert not b.events("leading") and not b.handled()

        cut_at = time.monotonic()
        tcp_proxy.blackhole()
        a_stopped = await a.wait_for("stopped", timeout_s=ttl_s + 5)
        a_expiry = watcher.expiry_of("a")
        await create_object(kmock, "v1/configmaps", "default", "after-cut")
        b_leading = await b.wait_for("leading", timeout_s=ttl_s + 10)
        b_handled = await b.wait_for("handled", name="after-cut", timeout_s=ttl_s + 10)

    print(
        f"\nsingleton after a cut (ttl {ttl_s:g} s): a's kopf stopped {a_expiry - a_stopped['t']:.2f} s "
        f"before its lease expired; b led {b_leading['t'] - cut_at:.2f} s and handled a new object "
        f"{b_handled['t'] - cut_at:.2f} s after the cut"
    )
    # The ex-leader stopped kopf before its lease could expire on Redis.
    assert a_stopped["t"] < a_expiry, (a_stopped, a_expiry)
    # The follower took over only after the ex-leader's lease was gone: the two kopf operators
    # never overlapped. (How soon after is printed above; that it did is b.wait_for's business.)
    assert b_leading["t"] >= a_expiry - 0.05  # 50 ms: the watcher's own round trips
    assert b_leading["t"] <= b_handled["t"]
    for child in (a, b):
        assert_handled_only_while_leading(child)
    assert {e["name"] for e in a.handled()} <= {"before-cut", "after-cut"}


async def test_clean_stop_releases_at_once(
    redis_url: str, kmock: kmock_lib.KubernetesEmulator, tmp_path: Path, children: list[SingletonProcess]
) -> None:
    ttl_s = 6.0  # long, so that a takeover at expiry could not pass for a release
    async with LeaseWatcher(redis_url) as watcher:
        a = await start(children, "a", redis_url=redis_url, kube=kmock, tmp=tmp_path, ttl_s=ttl_s)
        await a.wait_for("leading", timeout_s=20)
        b = await start(children, "b", redis_url=redis_url, kube=kmock, tmp=tmp_path, ttl_s=ttl_s)
        await asyncio.sleep(0.5)
        await create_object(kmock, "v1/configmaps", "default", "first")
        await a.wait_for("handled", name="first", timeout_s=20)

        term_at = time.monotonic()
        a.process.send_signal(signal.SIGTERM)
        b_leading = await b.wait_for("leading", timeout_s=ttl_s + 5)
        a_expiry = watcher.expiry_of("a")
        await a.wait_for("exited", timeout_s=10)
        await create_object(kmock, "v1/configmaps", "default", "second")
        await b.wait_for("handled", name="second", timeout_s=20)

    assert a.process.wait(timeout=10) == 0
    a_stopped = a.events("stopped")[-1]
    assert term_at < a_stopped["t"] < b_leading["t"]
    # Released: b led long before a's last lease would have expired.
    assert b_leading["t"] < a_expiry - 1.0, (b_leading["t"], a_expiry)
    for child in (a, b):
        assert_handled_only_while_leading(child)


async def test_a_kopf_that_cannot_stop_ends_the_process_without_releasing(
    redis_url: str, kmock: kmock_lib.KubernetesEmulator, tmp_path: Path, children: list[SingletonProcess]
) -> None:
    """on_stuck="exit" (the default): a synchronous handler keeps kopf from stopping, so the
    process ends before the Elector could release; the follower waits for the lease to expire."""
    ttl_s = 4.0
    never = tmp_path / "never-created"  # the handler stays stuck until the process dies
    async with LeaseWatcher(redis_url) as watcher:
        a = await start(children, "a", redis_url=redis_url, kube=kmock, tmp=tmp_path, ttl_s=ttl_s,
                        extra=["--stuck-on", "stuck-1", "--unblock", str(never)])  # fmt: skip
        await a.wait_for("leading", timeout_s=20)
        b = await start(children, "b", redis_url=redis_url, kube=kmock, tmp=tmp_path, ttl_s=ttl_s)
        await create_object(kmock, "v1/configmaps", "default", "stuck-1")
        await a.wait_for("stuck", timeout_s=20)

        term_at = time.monotonic()
        a.process.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(a.process.wait, 10)
        exited_at = time.monotonic()
        client = aioredis.Redis.from_url(redis_url)
        try:
            value = await client.get(LEASE_KEY)  # straight after the exit: not released
        finally:
            await client.aclose()
        b_leading = await b.wait_for("leading", timeout_s=ttl_s + 10)
        a_expiry = watcher.expiry_of("a")

    assert code == EXIT_KOPF_STUCK, a.log_tail()
    assert value is not None and json.loads(value)["identity"] == "a"
    # Stuck, it exits (within its stop budget, 1.07 s, when the machine is not loaded) before its
    # lease could expire: the follower waits that lease out, never overlapping a live kopf.
    assert exited_at < a_expiry, (exited_at - term_at, a_expiry - term_at)
    assert not a.events("stopped") and not a.events("exited") and not a.events("unblocked")
    log = a.log_path.read_text(errors="replace")
    assert "CRITICAL" in log and "without releasing the lease" in log, a.log_tail()
    # The lease was left to expire: b led only once it had.
    assert b_leading["t"] >= a_expiry - 0.05, (b_leading["t"], a_expiry)


async def test_on_stuck_wait_holds_the_lease_until_kopf_stops(
    redis_url: str, kmock: kmock_lib.KubernetesEmulator, tmp_path: Path, children: list[SingletonProcess]
) -> None:
    ttl_s = 3.0
    unblock = tmp_path / "unblock"
    extra = ["--on-stuck", "wait", "--stuck-on", "stuck-1", "--unblock", str(unblock)]
    async with LeaseWatcher(redis_url) as watcher:
        a = await start(
            children, "a", redis_url=redis_url, kube=kmock, tmp=tmp_path, ttl_s=ttl_s, extra=extra
        )
        await a.wait_for("leading", timeout_s=20)
        b = await start(children, "b", redis_url=redis_url, kube=kmock, tmp=tmp_path, ttl_s=ttl_s)
        await create_object(kmock, "v1/configmaps", "default", "stuck-1")
        await a.wait_for("stuck", timeout_s=20)

        term_at = time.monotonic()
        a.process.send_signal(signal.SIGTERM)
        await asyncio.sleep(1.5 * ttl_s)  # longer than one ttl: only renewals keep a's lease
        assert a.process.poll() is None, a.log_tail()
        assert not b.events("leading")
        held = [(sent, holder) for sent, holder, _ in watcher.samples if sent > term_at + ttl_s]
        assert held and all(holder == "a" for _, holder in held), held[-5:]
        assert not a.events("stopped")

        unblocked_at = time.monotonic()
        unblock.touch()
        # 30 s: under `make test-loaded` kopf's thread once had not finished 15 s after the handler
        # returned (the cause unknown then: a failure now shows every thread's stack). What is
        # under test is the order (lease held until kopf stops, then released), not kopf's speed.
        await a.wait_for("exited", timeout_s=30)
        b_leading = await b.wait_for("leading", timeout_s=ttl_s + 5)
        a_expiry = watcher.expiry_of("a")

    assert a.process.wait(timeout=10) == 0
    a_stopped = a.events("stopped")[-1]
    assert a.events("unblocked")[0]["t"] <= a_stopped["t"] < b_leading["t"]
    # Released once kopf had stopped, not left to expire.
    assert b_leading["t"] < a_expiry - 0.5, (b_leading["t"], a_expiry)
    assert b_leading["t"] > unblocked_at
    log = a.log_path.read_text(errors="replace")
    assert "holding the lease, not releasing, until it stops" in log, a.log_tail()


def test_settings_copy_keeps_caller_settings() -> None:
    from elector.kube.kopf_thread import term_settings

    settings = kopf.OperatorSettings()
    settings.queueing.exit_timeout = 30.0
    copy = term_settings(settings, stop_budget_s=0.5)
    assert copy.queueing.exit_timeout < 0.5 and settings.queueing.exit_timeout == 30.0
    assert copy.process.ultimate_exiting_timeout is None
    assert copy.peering is not settings.peering
    assert dataclasses.is_dataclass(copy)
