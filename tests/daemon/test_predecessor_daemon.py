"""`elector run --predecessor-lock`: real daemons on a real redis-server show one leadership.

The new lock's counter is set far above the predecessor's, so that a token taken from the wrong lock
shows: the leader's /leader and leader file, its followers' view of it, and both keys on Redis.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import redis

from elector.backend.lua.lease import LockKeys
from tests.support.daemon import DaemonProcess, DaemonStarter, wait_until
from tests.support.seed import seed_used_lock

OLD, NEW = "jobs-elector", "apps/jobs-elector"
#: Far above any token from the server's clock (~1.7e12): the new lock's own tokens stand out.
NEW_COUNTER = 10**14
#: Bounds on a hang on a loaded machine, not claims of speed.
START_S = 20.0


def _file(path: Path) -> dict[str, Any]:
    try:
        document: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return document


def _holder(client: redis.Redis, lock: str) -> str | None:
    raw = client.get(LockKeys(lock).lease)
    return None if raw is None else str(json.loads(raw)["identity"])


def test_renamed_replicas_show_one_leadership_with_the_predecessors_token(
    daemon: DaemonStarter, redis_url: str, tmp_path: Path
) -> None:
    client = redis.Redis.from_url(redis_url)
    seed_used_lock(client, OLD)
    seed_used_lock(client, NEW, counter=NEW_COUNTER)

    def start(identity: str) -> DaemonProcess:
        leader_file = str(tmp_path / f"{identity}.json")
        options = ("--predecessor-lock", OLD, "--leader-file", leader_file)
        return daemon(identity, *options, lock=NEW, ttl="2s")

    a = start("a")
    wait_until(a.is_leader, timeout_s=START_S)
    b = start("b")
    token = int(client.get(LockKeys(OLD).fencing) or 0)
    assert 0 < token < NEW_COUNTER
    shown = a.leader() or {}
    assert (shown.get("is_leader"), shown.get("fencing_token"), shown.get("lock")) == (True, token, NEW)
    assert (_holder(client, OLD), _holder(client, NEW)) == ("a", "a")  # both names held
    wait_until(lambda: (b.leader() or {}).get("holder_fencing_token") == token, timeout_s=START_S)
    assert (b.leader() or {}).get("holder") == "a"
    wait_until(lambda: _file(tmp_path / "a.json").get("fencing_token") == token, timeout_s=START_S)
    wait_until(lambda: _file(tmp_path / "b.json").get("holder_fencing_token") == token, timeout_s=START_S)
    assert _file(tmp_path / "b.json").get("is_leader") is False
    assert 'elector_is_leader{lock="apps/jobs-elector"} 1.0' in a.metrics()
    assert 'elector_is_leader{lock="apps/jobs-elector"} 0.0' in b.metrics()

    a.signal(signal.SIGTERM)  # a rolling update's termination: both names released, b takes over
    assert a.wait(timeout_s=30) == 0
    wait_until(b.is_leader, timeout_s=START_S)
    assert (_holder(client, OLD), _holder(client, NEW)) == ("b", "b")
    assert int((b.leader() or {}).get("fencing_token") or 0) == int(client.get(LockKeys(OLD).fencing) or 0)
    started = [line for line in b.log_lines() if line.get("event") == "started"]
    assert started and started[0].get("predecessor_lock") == OLD
