"""docs/topologies.md's per-namespace Redis ACL recipe, run against a real redis-server.

Two teams share one Redis, each with the recipe's user for its namespace. Each team's daemons lead,
hand over (`elector handoff`), report (`elector status`) and release under it with nothing denied
(`ACL LOG` stays empty), while team A's user is refused team B's keys, channel and lock, and
`CLIENT KILL`/`CLIENT PAUSE`. (Issue 42: the documented ACL, `~elector:*` with `+client`, let any
team take any lock and kill or pause every client.)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from elector.backend.lua.lease import LockKeys
from elector.testing.redis_server import RedisServerProcess
from tests.support.daemon import DaemonProcess, wait_until
from tests.support.seed import seed_used_lock

DOC = Path(__file__).resolve().parents[2] / "docs" / "topologies.md"
ELECTOR = str(Path(sys.executable).with_name("elector"))
PASSWORDS = {"team-a": "secret-of-a", "team-b": "secret-of-b"}


def recipe() -> str:
    text = DOC.read_text()
    (block,) = re.findall(r"<!-- acl-recipe[^>]*-->\n```\n(ACL SETUSER [^\n]+)\n```", text)
    return block


def setuser_args(namespace: str, server: redis.Redis) -> list[str]:
    words = recipe().replace("team-a", namespace).replace(">PASSWORD", f">{PASSWORDS[namespace]}").split()
    assert words[:2] == ["ACL", "SETUSER"]
    version = tuple(int(part) for part in server.info("server")["redis_version"].split(".")[:2])
    if version < (7, 2):
        words.remove("+client|setinfo")  # Redis before 7.2, as the page says
    return words[2:]


def url(server: RedisServerProcess, namespace: str) -> str:
    return f"redis://elector-{namespace}:{PASSWORDS[namespace]}@127.0.0.1:{server.port}/0"


@pytest.fixture
def server(redis_binary: str) -> Iterator[RedisServerProcess]:
    with RedisServerProcess(binary=redis_binary) as process:
        admin = redis.Redis(port=process.port)
        for namespace in PASSWORDS:
            admin.execute_command("ACL", "SETUSER", *setuser_args(namespace, admin))
        for lock in ("team-a/jobs", "team-b/jobs"):
            seed_used_lock(admin, lock)  # no quiet period of a new lock
        admin.execute_command("ACL", "LOG", "RESET")
        yield process


def _env() -> dict[str, str]:
    return {
        k: v for k, v in os.environ.items() if not k.startswith("ELECTOR_") or k == "ELECTOR_REDIS_SERVER"
    }


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ELECTOR, *args], capture_output=True, text=True, timeout=60, env=_env(), check=False
    )


def _auth_errors(daemon: DaemonProcess) -> float:
    found = re.search(r'elector_redis_errors_total\{kind="auth",lock="[^"]+"\} (\S+)', daemon.metrics())
    return float(found.group(1)) if found else 0.0


def test_the_recipe_names_only_one_namespace_and_no_client_kill() -> None:
    words = recipe().split()
    assert "~elector:{team-a/*" in words and "&elector:{team-a/*" in words
    assert "-@all" in words and "resetkeys" in words and "resetchannels" in words
    assert not [w for w in words if w.startswith(("+@", "~*", "&*", "allkeys", "allchannels"))]
    assert "+client" not in words and "+client|kill" not in words and "+client|pause" not in words


def test_each_team_elects_under_its_user_and_nothing_is_denied(
    server: RedisServerProcess, tmp_path: Path
) -> None:
    daemons = []
    try:
        for namespace, identity in (("team-a", "a-1"), ("team-a", "a-2"), ("team-b", "b-1")):
            daemon = DaemonProcess(
                redis_url=url(server, namespace), identity=identity, log_dir=tmp_path,
                lock=f"{namespace}/jobs", ttl="2s",
            )  # fmt: skip
            daemons.append(daemon.start())
        for daemon in daemons:
            daemon.wait_http()
        a1, a2, b1 = daemons
        wait_until(lambda: a1.is_leader() or a2.is_leader(), timeout_s=30)
        wait_until(b1.is_leader, timeout_s=30)
        leader, follower = (a1, a2) if a1.is_leader() else (a2, a1)
        status = _cli("status", "--redis-url", url(server, "team-a"), "--lock", "team-a/jobs")
        assert status.returncode == 0 and leader.identity in status.stdout, status.stdout + status.stderr
        handoff = _cli("handoff", "--redis-url", url(server, "team-a"), "--lock", "team-a/jobs",
                       "--to", follower.identity)  # fmt: skip
        assert handoff.returncode == 0, handoff.stdout + handoff.stderr
        wait_until(follower.is_leader, timeout_s=30)
        follower.stop()  # SIGTERM: releases the lease
        admin = redis.Redis(port=server.port, decode_responses=True)
        wait_until(leader.is_leader, timeout_s=30)
        assert admin.execute_command("ACL", "LOG") == []
        assert _auth_errors(leader) == _auth_errors(b1) == 0
    finally:
        for daemon in daemons:
            daemon.stop()


def test_team_a_cannot_touch_team_b(server: RedisServerProcess, tmp_path: Path) -> None:
    team_a = redis.Redis.from_url(url(server, "team-a"))
    theirs = LockKeys("team-b/jobs")
    ours = LockKeys("team-a/jobs")
    team_a.set(ours.lease, "x")  # its own keys: allowed
    team_a.delete(ours.lease)
    refused = [
        lambda: team_a.set(theirs.lease, "mine"),
        lambda: team_a.get(theirs.fencing),
        lambda: team_a.delete(theirs.lease),
        lambda: team_a.eval("return redis.call('DEL', KEYS[1])", 1, theirs.lease),
        lambda: team_a.eval("return redis.call('DEL', KEYS[1])", 1, ours.lease),  # EVAL is not allowed
        lambda: team_a.publish(theirs.channel, "released"),
        lambda: team_a.execute_command("CLIENT", "KILL", "ID", "1"),
        lambda: team_a.execute_command("CLIENT", "PAUSE", "10"),
        lambda: team_a.execute_command("CLIENT", "LIST"),
        lambda: team_a.keys("*"),
        team_a.flushall,
        lambda: team_a.execute_command("CONFIG", "GET", "*"),
        lambda: team_a.set("elector:{team-ab/jobs}:lease", "x"),  # team-a is no prefix of team-ab
    ]
    refused.append(lambda: team_a.execute_command("SUBSCRIBE", theirs.channel))
    for attempt in refused:
        with pytest.raises(redis.exceptions.NoPermissionError):
            attempt()

    # A daemon of team A's pointed at team B's lock never leads, before and after B's leader goes.
    b1 = DaemonProcess(redis_url=url(server, "team-b"), identity="b-1", log_dir=tmp_path,
                       lock="team-b/jobs", ttl="2s")  # fmt: skip
    intruder = DaemonProcess(redis_url=url(server, "team-a"), identity="a-9", log_dir=tmp_path,
                             lock="team-b/jobs", ttl="2s")  # fmt: skip
    try:
        b1.start().wait_http()
        wait_until(b1.is_leader, timeout_s=30)
        intruder.start().wait_http()
        wait_until(lambda: _auth_errors(intruder) >= 1, timeout_s=30)
        b1.stop()
        admin = redis.Redis(port=server.port)
        wait_until(lambda: admin.exists(theirs.lease) == 0, timeout_s=30)
        # Several of the intruder's attempts on a free lock, all refused.
        refusals = _auth_errors(intruder)
        wait_until(lambda: _auth_errors(intruder) >= refusals + 3, timeout_s=60)
        assert not intruder.is_leader() and admin.exists(theirs.lease) == 0
    finally:
        intruder.stop()
        b1.stop()
