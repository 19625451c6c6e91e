"""A mixed fleet through a failover and a failback (issue 22 item 6), with three real servers.

The previous release (tests/support/previous_release.py) serves the quiet period on a promoted
server and leads; a second failover, then a failback to that server, which lagged behind: a
current daemon must not be granted there while the old leader still believes its lease.
Judged on the workers' journals (checker.py), as the rest of the fault suite.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
import redis

from elector.backend.lua.lease import LockKeys
from elector.testing.redis_server import RedisServerProcess
from tests.support.daemon import wait_until
from tests.support.previous_release import PreviousRelease
from tests.support.seed import seed_used_lock
from tests.support.tcp_proxy import TcpProxy

from .checker import check
from .harness import LOCK, Cluster, Node

#: The daemons' log events (and their fields) that tell the story of a failure.
STORY_EVENTS = frozenset({"acquired", "released", "stepped_down", "quiet_period", "new_leader_observed"})
STORY_FIELDS = ("reason", "remaining_ms", "holder", "fencing_token")

#: Longer than the fleet's: the previous release's command runs 2/3 ttl after its last renewal,
#: room enough for a wrongly granted successor's command to start on a busy machine.
FAILBACK_TTL_S = 4.0


class FailbackFleet(Cluster):
    """Three lock servers R1, R2, R3 (replication by hand, REPLICAOF) and no replica at first; each
    replica reaches whichever server `master_port` names, through its own proxy."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory, ttl_s=FAILBACK_TTL_S, size=0)
        self.r2 = RedisServerProcess()
        self.r3 = RedisServerProcess()
        self.master_port = 0
        #: R2's replication link to R3 (cut: R2 lags behind).
        self.link = TcpProxy("127.0.0.1", 0)

    @property
    def lock_port(self) -> int:
        return self.master_port

    def start(self) -> FailbackFleet:
        for server in (self.lock_redis, self.r2, self.r3, self.resource):
            server.start()
        self.master_port = self.lock_redis.port
        for server in (self.lock_redis, self.r2, self.r3):
            with redis.Redis(port=server.port) as client:
                client.config_set("repl-diskless-sync-delay", 0)
        self.proxies.run(self.link.start())
        self._watcher.start()
        self.journal.append("run", t_begin=time.monotonic(), ttl_s=self.ttl_s, prompt_s=self.prompt_s)
        return self

    def point(self, node: Node, port: int) -> None:
        """The node's connections go to the server on `port` from now on (old ones are reset)."""
        proxy = node.proxy_of()

        def retarget() -> None:
            proxy.upstream_port = port
            proxy.cut()
            proxy.restore()

        self.proxies.call(retarget)

    def close(self) -> None:
        try:
            self.proxies.run(self.link.stop())
        finally:
            super().close()
            self.r2.stop()
            self.r3.stop()


def _replicate(replica: int, master_port: int) -> None:
    with redis.Redis(port=replica) as client:
        client.replicaof("127.0.0.1", master_port)
        wait_until(lambda: client.info("replication").get("master_link_status") == "up", timeout_s=20)


def _promote(port: int) -> None:
    with redis.Redis(port=port) as client:
        client.replicaof("NO", "ONE")


def _grant_and_release_with_protocol_2(url: str) -> None:
    """A protocol-2 grant on R1: the meta hash names R1's replication stream and run_id."""
    from elector.backend import RedisLeaseBackend, RedisSettings, make_client
    from elector.lease import Granted

    async def run() -> None:
        client = make_client(RedisSettings(url=url, request_timeout_s=1.0))
        try:
            backend = RedisLeaseBackend(client, lock=LOCK)
            result = await backend.acquire("earlier", ttl_ms=round(FAILBACK_TTL_S * 1000))
            assert isinstance(result, Granted), result
            await backend.release(result.lease)
        finally:
            await client.aclose()

    asyncio.run(run())


@pytest.mark.timeout(150)
def test_a_failback_to_a_server_the_previous_release_served_on_waits_for_its_leader(
    previous_release: PreviousRelease, tmp_path: Path
) -> None:
    """Issue 22 item 6. A protocol-2 grant on R1 records R1's stream in the meta hash. Failover
    R1 -> R2: the previous release serves the quiet period on R2 (its server key: R2's run_id)
    and leads. Failover R2 -> R3: it renews there; R2 follows R3, then lags. Failback to R2, while
    the old leader, cut off, still believes its lease renewed on R3. R2's server key holds R2's
    own run_id, the meta hash names R1: 0.2.0 took that for "protocol 1 served the quiet period
    for this promotion" and granted a current daemon at once (its command overlapped the old
    one's). The server was promoted out of R3's stream, not R1's: a quiet period is due."""
    directory = tmp_path / "run"
    keys = LockKeys(LOCK)
    ttl_ms = round(FAILBACK_TTL_S * 1000)
    with FailbackFleet(directory) as fleet:
        r1, r2, r3 = fleet.lock_redis.port, fleet.r2.port, fleet.r3.port
        with redis.Redis(port=r1) as client:
            seed_used_lock(client, LOCK)
        _grant_and_release_with_protocol_2(fleet.lock_redis.url)
        for replica in (r2, r3):
            _replicate(replica, r1)
        # Failover R1 -> R2 (R3 follows R2); the previous release looks first and wins after its
        # quiet period. The current daemon cannot reach any server until the failback, so it
        # retries every few hundred ms instead of waiting out a holder's lease.
        _promote(r2)
        _replicate(r3, r2)
        fleet.master_port = r2
        old = fleet.add_node(program=previous_release.elector)
        fleet.wait_for_leader(timeout_s=30)
        new = fleet.add_node()
        fleet.proxies.call(new.proxy_of().cut)
        # Failover R2 -> R3: the old leader renews on R3; R2 follows R3, then lags behind.
        _promote(r3)
        fleet.master_port = r3
        fleet.point(old, r3)
        link = fleet.link
        link.upstream_port = r3
        _replicate(r2, link.port)
        with redis.Redis(port=r3) as master:
            wait_until(lambda: master.pttl(keys.lease) > 0, timeout_s=10)
            fleet.proxies.call(link.cut)
            with redis.Redis(port=r2) as lagging:  # its copy of the lease lapses, the leader renews on R3
                wait_until(lambda: lagging.get(keys.lease) is None, timeout_s=3 * FAILBACK_TTL_S)
            # Right after a renewal on R3 the old leader is cut off: its command runs 2/3 ttl more.
            wait_until(lambda: master.pttl(keys.lease) > ttl_ms - 150, timeout_s=FAILBACK_TTL_S)
            fleet.proxies.call(old.proxy_of().blackhole)
            assert fleet.leader() is not None and fleet.leader()[0] is old  # type: ignore[index]
        # Failback to R2; the current daemon reaches it at once.
        _promote(r2)
        fleet.master_port = r2
        fleet.point(new, r2)
        fleet.wait_for_leader(timeout_s=6 * FAILBACK_TTL_S, not_pid=fleet.leader()[1])  # type: ignore[index]
        time.sleep(0.5)
        fleet.stop()
        lease_events = "\n".join(
            f"{node.identity}: " + json.dumps({k: line.get(k) for k in ("timestamp", "event", *STORY_FIELDS)})
            for node in fleet.nodes for line in node.daemon.log_lines() if line.get("event") in STORY_EVENTS
        )  # fmt: skip
    report = check(directory)
    assert report.violations == 0, f"{report.explain()}\n{lease_events}"
    assert {term.identity for term in report.terms} == {old.identity, new.identity}, report.explain()
