"""A throw-away Redis Sentinel deployment: a master, replicas and three sentinels on 127.0.0.1.

    with SentinelSet(replicas=2) as deployment:
        client = make_client(RedisSettings(url=deployment.url))
        deployment.failover()          # SENTINEL FAILOVER; returns the new master's address
        deployment.kill_master()       # SIGKILL the master; returns once a replica was promoted
        deployment.master_address()    # ("127.0.0.1", port) as the sentinels report it

Every process runs on a free port, from a temporary directory (sentinels rewrite their config
file, so it must be writable), and is stopped by its PID, never by name. Sentinels judge a
master down after `down_after_ms` (1 s by default): a SIGKILLed master is replaced in about 2 s.
Start-up waits until every sentinel knows every replica and the other sentinels, since a
failover asked for earlier fails (NOGOODSLAVE, or no quorum to elect a sentinel leader). Each
sentinel is told them in its config file (its own id and the others' are chosen here), so that
takes about 1 s instead of the 2 s of hello messages it takes sentinels to find each other.

`renew_until_ok()` renews a lease until the deployment takes writes again (after a failover).

Used by tests/backend/topologies/test_sentinel*.py and the fault-injection suite; keep the API small.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import redis

from elector.lease import Lease, LeaseBackend, LeaseBackendError, Renewed
from elector.testing.redis_server import RedisServerProcess, find_redis_server, free_tcp_port
from tests.support.lifecycle import StartStop

HOST = "127.0.0.1"
STOP_TIMEOUT_S = 3.0
#: How often Sentinel reads each node's INFO by default (its SENTINEL_INFO_PERIOD).
SENTINEL_INFO_PERIOD_MS = 10_000


class SentinelSetError(RuntimeError):
    """The deployment did not reach the state asked for in time."""


class _SentinelProcess:
    """One `redis-server sentinel.conf --sentinel` child."""

    def __init__(self, *, port: int, workdir: Path) -> None:
        self.port = port
        #: The sentinel's run id, chosen here so that the others can be told of it in advance.
        self.myid = secrets.token_hex(20)
        self.workdir = workdir
        self.config = workdir / "sentinel.conf"
        self.process: subprocess.Popen[bytes] | None = None

    def start(
        self,
        *,
        binary: str,
        master_name: str,
        master_port: int,
        options: str,
        replicas: list[int],
        others: list[_SentinelProcess],
    ) -> None:
        # What a sentinel would learn by itself within about 2 s (the replicas from the master's
        # INFO, the other sentinels from their hello messages) is written in its config instead,
        # the way sentinels write it themselves: the set is ready as soon as the replicas link.
        known = [f"sentinel known-replica {master_name} {HOST} {port}\n" for port in replicas]
        known += [
            f"sentinel known-sentinel {master_name} {HOST} {other.port} {other.myid}\n" for other in others
        ]
        self.config.write_text(
            f"port {self.port}\n"
            f"bind {HOST}\n"
            f"dir {self.workdir}\n"
            f"logfile {self.workdir / 'sentinel.log'}\n"
            f"sentinel myid {self.myid}\n"
            f"sentinel monitor {master_name} {HOST} {master_port} 2\n"
            + options.format(name=master_name)
            + "".join(known)
        )
        self.process = subprocess.Popen(
            [binary, str(self.config), "--sentinel"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=(self.workdir / "stderr.log").open("ab"),
            start_new_session=True,
        )

    def client(self) -> redis.Redis:
        return redis.Redis(host=HOST, port=self.port, socket_timeout=1.0, decode_responses=True)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=STOP_TIMEOUT_S)


class SentinelSet(StartStop):
    """A master, `replicas` replicas and `sentinels` sentinels (quorum 2), started and stopped by PID."""

    def __init__(
        self,
        *,
        replicas: int = 2,
        sentinels: int = 3,
        master_name: str = "mymaster",
        binary: str | None = None,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 3000,
        server_args: tuple[str, ...] = (),
    ) -> None:
        if replicas < 1 or sentinels < 3:
            raise ValueError("a failover needs at least 1 replica and 3 sentinels")
        self.master_name = master_name
        self._binary = binary or find_redis_server()
        self._replica_count = replicas
        self._sentinel_count = sentinels
        #: A sentinel PINGs every instance this often; it judges a crash from its own PINGs only.
        self._ping_period_s = min(down_after_ms, 1000) / 1000
        self._options = (
            f"sentinel down-after-milliseconds {{name}} {down_after_ms}\n"
            f"sentinel failover-timeout {{name}} {failover_timeout_ms}\n"
            "sentinel parallel-syncs {name} 1\n"
        )
        self._server_args = server_args
        self._root: Path | None = None
        #: Every data node (the first one is the initial master), by start order.
        self.servers: list[RedisServerProcess] = []
        self.sentinels: list[_SentinelProcess] = []

    # -- life cycle ------------------------------------------------------------------------------

    def start(self, *, timeout_s: float = 20.0) -> Self:
        self._root = Path(tempfile.mkdtemp(prefix="elector-sentinel-"))
        try:
            # No diskless-sync delay (5 s by default): replicas link at once, after failovers too.
            fast_sync = ("--repl-diskless-sync-delay", "0")
            master = RedisServerProcess(binary=self._binary, extra_args=(*fast_sync, *self._server_args))
            self.servers.append(master.start())
            for _ in range(self._replica_count):
                replica = RedisServerProcess(
                    binary=self._binary,
                    extra_args=(*fast_sync, *self._server_args, "--replicaof", HOST, str(master.port)),
                )
                self.servers.append(replica.start())
            for index in range(self._sentinel_count):
                workdir = self._root / f"sentinel-{index}"
                workdir.mkdir()
                self.sentinels.append(_SentinelProcess(port=free_tcp_port(), workdir=workdir))
            sentinels_started = time.monotonic()
            for sentinel in self.sentinels:
                sentinel.start(
                    binary=self._binary,
                    master_name=self.master_name,
                    master_port=master.port,
                    options=self._options,
                    replicas=[server.port for server in self.servers[1:]],
                    others=[other for other in self.sentinels if other is not sentinel],
                )
            self._wait_settled(timeout_s=timeout_s)
            # Until its first PING round (one period after its start) a sentinel notices a crashed
            # master about a second later than it does afterwards: wait for it, so that the
            # promotion times the tests measure are those of a running deployment.
            time.sleep(max(0.0, sentinels_started + self._ping_period_s + 0.1 - time.monotonic()))
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every process (sentinels first, so they do not fail over a stopping master)."""
        for sentinel in self.sentinels:
            sentinel.stop()
        for server in self.servers:
            server.stop()
        self.sentinels, self.servers = [], []
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    # -- what the sentinels say --------------------------------------------------------------------

    @property
    def url(self) -> str:
        """redis+sentinel://127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3/<master name>"""
        hosts = ",".join(f"{HOST}:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.master_name}"

    def master_address(self) -> tuple[str, int]:
        """The master's address according to the first sentinel that answers."""
        for sentinel in self.sentinels:
            with contextlib.suppress(redis.RedisError), sentinel.client() as client:
                host, port = client.sentinel_get_master_addr_by_name(self.master_name)
                return str(host), int(port)
        raise SentinelSetError("no sentinel answered")

    def master(self) -> RedisServerProcess:
        """The data node the sentinels currently call master."""
        return self.server_at(self.master_address()[1])

    def server_at(self, port: int) -> RedisServerProcess:
        for server in self.servers:
            if server.port == port:
                return server
        raise SentinelSetError(f"no data node of this deployment listens on port {port}")

    def set_replica_priority(
        self, server: RedisServerProcess, priority: int, *, timeout_s: float = 10.0
    ) -> None:
        """Set a replica's `replica-priority` (0: never promoted) and wait until every sentinel knows.

        Sentinels read it from the replica's INFO, which they ask for every 10 s: a failover started
        before then would choose by the old value. They are told to ask every 100 ms meanwhile.
        """
        with redis.Redis(host=HOST, port=server.port, socket_timeout=1.0) as client:
            client.config_set("replica-priority", priority)

        def known() -> bool:
            return all(self._replica_priority(s, server.port) == priority for s in self.sentinels)

        with self.info_period(period_ms=100):
            deadline = time.monotonic() + timeout_s
            while not known():
                if time.monotonic() > deadline:
                    raise SentinelSetError(f"the sentinels did not learn the priority of {server.port}")
                time.sleep(0.05)

    @contextlib.contextmanager
    def info_period(self, *, period_ms: int) -> Iterator[None]:
        """Sentinels ask each node's INFO every `period_ms` meanwhile, then every
        SENTINEL_INFO_PERIOD_MS (their own default) again.

        Shorter: they learn a node's settings sooner. Longer: after a planned failover the old
        master is demoted only once a sentinel has read its INFO (its role still "master"), so the
        window stays open longer. A failover itself is not slowed: during one, sentinels poll the
        replicas every second whatever this says."""
        self._set_info_period(period_ms)
        try:
            yield
        finally:
            with contextlib.suppress(redis.RedisError, OSError):
                self._set_info_period(SENTINEL_INFO_PERIOD_MS)

    def _set_info_period(self, ms: int) -> None:
        for sentinel in self.sentinels:
            with sentinel.client() as client:
                client.execute_command("SENTINEL", "DEBUG", "INFO-PERIOD", ms)

    def _replica_priority(self, sentinel: _SentinelProcess, port: int) -> int | None:
        try:
            with sentinel.client() as client:
                replicas = client.sentinel_slaves(self.master_name)
        except redis.RedisError:
            return None
        for replica in replicas:
            if int(replica["port"]) == port:
                return int(replica.get("slave-priority", -1))
        return None

    # -- faults ----------------------------------------------------------------------------------

    def failover(self, *, timeout_s: float = 15.0) -> tuple[str, int]:
        """SENTINEL FAILOVER (a planned switch-over); the new master's address once it serves."""
        old = self.master_address()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with self.sentinels[0].client() as client:
                    client.execute_command("SENTINEL", "FAILOVER", self.master_name)
                break
            except redis.ResponseError as exc:
                # Just after start or another failover: NOGOODSLAVE / INPROG; try again shortly.
                if time.monotonic() > deadline:
                    raise SentinelSetError(f"SENTINEL FAILOVER kept failing: {exc}") from None
                time.sleep(0.2)
        return self._wait_new_master(old, deadline=deadline)

    def kill_master(self, *, timeout_s: float = 20.0) -> tuple[str, int]:
        """SIGKILL the master (a crash); the new master's address once a replica was promoted."""
        old = self.master_address()
        self.server_at(old[1]).kill()
        return self._wait_new_master(old, deadline=time.monotonic() + timeout_s)

    # -- waiting -----------------------------------------------------------------------------------

    def _wait_new_master(self, old: tuple[str, int], *, deadline: float) -> tuple[str, int]:
        """Until every sentinel names the same new master, and it answers as a master."""
        while time.monotonic() < deadline:
            addresses = {self._ask(s, "get-master-addr-by-name") for s in self.sentinels}
            if len(addresses) == 1:
                (address,) = addresses
                if address is not None and address != old and self._role(address[1]) == "master":
                    return str(address[0]), int(address[1])
            time.sleep(0.05)
        raise SentinelSetError(f"no new master replaced {old} in time")

    def _wait_settled(self, *, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        others = self._sentinel_count - 1
        state: Any = None
        while time.monotonic() < deadline:
            state = [self._ask(s, "master") for s in self.sentinels]
            if all(
                m is not None
                and int(m["num-other-sentinels"]) == others
                and int(m["num-slaves"]) == self._replica_count
                for m in state
            ) and all(self._replica_linked(server) for server in self.servers[1:]):
                return
            time.sleep(0.1)
        raise SentinelSetError(f"the sentinels did not discover each other and the replicas: {state}")

    def _ask(self, sentinel: _SentinelProcess, what: str) -> Any:
        try:
            with sentinel.client() as client:
                if what == "master":
                    return client.sentinel_master(self.master_name)
                host, port = client.sentinel_get_master_addr_by_name(self.master_name)
                return str(host), int(port)
        except (redis.RedisError, TypeError):
            return None

    @staticmethod
    def _role_of(port: int) -> dict[str, Any] | None:
        try:
            with redis.Redis(host=HOST, port=port, socket_timeout=1.0, decode_responses=True) as client:
                info: dict[str, Any] = client.info("replication")
                return info
        except redis.RedisError:
            return None

    def _role(self, port: int) -> str | None:
        info = self._role_of(port)
        return None if info is None else str(info.get("role"))

    def _replica_linked(self, server: RedisServerProcess) -> bool:
        info = self._role_of(server.port)
        return info is not None and info.get("master_link_status") == "up"


# -- riding out a failover -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RenewedAgain:
    #: Failed renewals before the one that succeeded.
    failures: int
    #: When (time.monotonic()) the successful renewal was sent: its ttl counts from no earlier.
    sent_at: float
    #: Seconds from the first attempt to the success.
    after_s: float


async def renew_until_ok(backend: LeaseBackend, lease: Lease, *, timeout_s: float) -> RenewedAgain:
    """Renew every 50 ms (each attempt cut at 1 s) until one succeeds; AssertionError after `timeout_s`."""
    started, failures = time.monotonic(), 0
    while time.monotonic() - started < timeout_s:
        sent_at = time.monotonic()
        try:
            if isinstance(await asyncio.wait_for(backend.renew(lease), 1.0), Renewed):
                return RenewedAgain(failures=failures, sent_at=sent_at, after_s=time.monotonic() - started)
        except (LeaseBackendError, TimeoutError):
            failures += 1
        await asyncio.sleep(0.05)
    raise AssertionError(f"no successful renewal within {timeout_s}s ({failures} failures)")
