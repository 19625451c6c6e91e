"""Two daemons started with one --identity, both followers while a third leads: each logs one
`identity_clash` WARNING and shows `elector_identity_clash{lock} 1`; the leader shows 0.
Real `python -m elector run` processes on a real redis-server."""

from __future__ import annotations

import time
from pathlib import Path

import redis

from elector.backend.lua.lease import LockKeys
from tests.daemon.test_service import metric
from tests.support.daemon import DaemonProcess, DaemonStarter, wait_until

LOCK = "jobs"
TTL = "2s"


def clash_gauge(process: DaemonProcess) -> float | None:
    return metric(process.metrics(), "elector_identity_clash", lock=LOCK)


def registrations_in_turn(plain: redis.Redis, identity: str, *, turns: int, timeout_s: float) -> None:
    """Wait until the instance that last registered `identity` changed `turns` times (each time
    one daemon registered after the other, so each saw the other's entry)."""
    deadline = time.monotonic() + timeout_s
    last, changes = None, 0
    while changes < turns:
        assert time.monotonic() < deadline, f"only {changes} turns within {timeout_s}s"
        nonce = plain.hget(LockKeys(LOCK).candidate_instances, identity)
        if nonce is not None and nonce != last:
            changes += last is not None
            last = nonce
        time.sleep(0.01)


def test_two_follower_daemons_with_one_identity_each_warn_once(
    daemon: DaemonStarter, seeded: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    # ttl 2 s for all three, not the 1 s default: the premise is a boss that leads throughout,
    # and at load 8 (`make test-loaded` #33) its 1 s lease lapsed and a twin led. 2 s doubles
    # the stall it outlasts (3 s made the turns below take about 40 s).
    boss = daemon("boss", ttl=TTL)
    wait_until(boss.is_leader, timeout_s=10)
    twins = []
    for name in ("one", "two"):  # one identity, a log file each
        (tmp_path / name).mkdir()
        twin = DaemonProcess(redis_url=redis_url, identity="same", log_dir=tmp_path / name, ttl=TTL)
        daemon.started.append(twin.start())  # stopped with the others
        twin.wait_http()
        twins.append(twin)
    wait_until(lambda: all(clash_gauge(t) == 1 for t in twins), timeout_s=30)
    registrations_in_turn(seeded, "same", turns=6, timeout_s=60)  # the clash goes on: no new line
    for twin in twins:
        clashes = [line for line in twin.log_lines() if line.get("event") == "identity_clash"]
        assert len(clashes) == 1, clashes
        assert clashes[0]["level"] == "warning" and clashes[0]["identity"] == "same"
        assert clashes[0]["lock"] == LOCK and "--identity" in clashes[0]["hint"]
        assert not twin.is_leader()
    assert boss.is_leader() and clash_gauge(boss) == 0
    assert not [line for line in boss.log_lines() if line.get("event") == "identity_clash"]
