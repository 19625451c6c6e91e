"""The five systems of the peers benchmark, each able to start its server and its candidates.

Every candidate runs the same CMD (bench/peers/candidates/work.py) with its own id, appending to the
system's journal. A system says when its waiters are queued (`waiters_ready`), how a graceful
stop is sent, and how requests are counted (a Redis MONITOR, or a server-wide total).
"""

from __future__ import annotations

import abc
import dataclasses
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from bench.harness.common import REPO, BenchError, Daemon, RedisLab, spawn
from bench.harness.context import Context
from bench.peers.probes import etcd_messages_received, zk_packets_received
from bench.servers import zookeeper
from bench.servers.etcd import EtcdServer

TTL_S = 2
LOCK = "bench-peers"
CANDIDATES = REPO / "bench" / "peers" / "candidates"
WORK = CANDIDATES / "work.py"


def work_cmd(journal: Path, cid: str) -> list[str]:
    """CMD of every system: this venv's Python without site (-S) or user paths (-I)."""
    return [sys.executable, "-I", "-S", str(WORK), str(journal), cid]


@dataclasses.dataclass
class Candidate:
    cid: str
    proc: subprocess.Popen[bytes]
    ready: Callable[[], bool]  # queued as a waiter (meaningful for a non-leader)
    daemon: Daemon | None = None


class System(abc.ABC):
    key: str
    label: str
    #: Redis systems: requests attributed per client through MONITOR; others by difference.
    monitor: bool = False

    def __init__(self, ctx: Context, workdir: Path) -> None:
        self.ctx = ctx
        self.workdir = workdir
        self.journal = workdir / "journal"
        self.lab: RedisLab | None = None

    def cmd(self, cid: str) -> list[str]:
        return work_cmd(self.journal, cid)

    @abc.abstractmethod
    def unavailable(self) -> str | None:
        """Why this system cannot run here, or None."""

    @abc.abstractmethod
    def start_server(self) -> None: ...

    @abc.abstractmethod
    def spawn(self, cid: str, incarnation: int) -> Candidate: ...

    def waiters_ready(self, waiters: list[Candidate]) -> bool:
        return all(c.ready() for c in waiters)

    def graceful_stop(self, leader: Candidate, *, cmd_pid: int) -> None:
        """The graceful stop of the leader (the caller takes the time right before)."""
        os.kill(leader.proc.pid, signal.SIGTERM)

    def request_total(self) -> float:
        raise NotImplementedError

    def redis_address(self) -> tuple[str, int]:
        assert self.lab is not None
        return "127.0.0.1", self.lab.server.port

    def close(self) -> None:
        if self.lab is not None:
            self.lab.__exit__(None, None, None)
            self.lab = None

    def _start_redis(self) -> RedisLab:
        self.lab = RedisLab(self.ctx.redis_binary).__enter__()
        return self.lab

    def _log(self, cid: str, incarnation: int) -> Path:
        return self.workdir / f"{cid}-{incarnation}.log"


def _alive_and(proc: subprocess.Popen[bytes], log: Path, check: Callable[[], bool]) -> Callable[[], bool]:
    def ready() -> bool:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-1500:]
            raise BenchError(f"candidate exited with {proc.returncode}:\n{tail}")
        return check()

    return ready


class ElectorSystem(System):
    key = "elector"
    label = "elector (`elector run`, exec mode)"
    monitor = True

    def __init__(self, ctx: Context, workdir: Path, *, python: str) -> None:
        super().__init__(ctx, workdir)
        self.python = python

    def unavailable(self) -> str | None:
        return None

    def start_server(self) -> None:
        self._start_redis().seed(LOCK)

    def spawn(self, cid: str, incarnation: int) -> Candidate:
        assert self.lab is not None
        daemon = Daemon(
            python=self.python,
            redis_url=self.lab.url,
            lock=LOCK,
            identity=cid,
            ttl=f"{TTL_S}s",
            log_path=self._log(cid, incarnation),
            extra_args=("--", *self.cmd(cid)),
        ).start()
        assert daemon.proc is not None
        # A follower logs `new_leader_observed` at its first look at the lock: it is subscribed.
        return Candidate(cid, daemon.proc, lambda: daemon.event("new_leader_observed") is not None, daemon)


class EtcdSystem(System):
    key = "etcd"
    label = "etcd (`etcdctl lock --ttl 2`)"

    def __init__(self, ctx: Context, workdir: Path) -> None:
        super().__init__(ctx, workdir)
        self.server: EtcdServer | None = None
        self.lock = f"{LOCK}-{os.getpid()}-{id(self)}"

    def unavailable(self) -> str | None:
        install = self.ctx.etcd_install
        return None if install.available else install.note

    def start_server(self) -> None:
        self.server = self.ctx.etcd()
        if self.server is None:
            raise BenchError(self.ctx.etcd_install.note)

    def spawn(self, cid: str, incarnation: int) -> Candidate:
        assert self.server is not None
        argv = self.server.etcdctl("lock", "--ttl", str(TTL_S), self.lock, "--", *self.cmd(cid))
        log = self._log(cid, incarnation)
        proc = spawn(argv, log_path=log, env={"ETCDCTL_API": "3"})
        return Candidate(cid, proc, _alive_and(proc, log, lambda: True))

    def waiters_ready(self, waiters: list[Candidate]) -> bool:
        assert self.server is not None
        for waiter in waiters:
            waiter.ready()  # raises if it died
        # One key per session under LOCK/: the holder's and each waiter's.
        return len(self.server.keys(f"{self.lock}/")) == len(waiters) + 1

    def graceful_stop(self, leader: Candidate, *, cmd_pid: int) -> None:
        # etcdctl handles only SIGINT, and even then waits for CMD; SIGTERM kills it without an
        # unlock. Its graceful end is CMD's end: then it unlocks and exits.
        os.kill(cmd_pid, signal.SIGTERM)

    def request_total(self) -> float:
        assert self.server is not None
        return etcd_messages_received(self.server.endpoint)


class ZooKeeperSystem(System):
    key = "zookeeper"
    label = "ZooKeeper 3.8 + kazoo `Election`"

    def __init__(self, ctx: Context, workdir: Path) -> None:
        super().__init__(ctx, workdir)
        self.server: zookeeper.ZooKeeperServer | None = None

    def unavailable(self) -> str | None:
        if importlib.util.find_spec("kazoo") is None:
            return "kazoo is not installed (the `bench` extra)"
        return zookeeper.unavailable_reason()

    def start_server(self) -> None:
        self.server = zookeeper.ZooKeeperServer(self.workdir / "server").start()

    def spawn(self, cid: str, incarnation: int) -> Candidate:
        assert self.server is not None
        return _python_candidate(
            self, "kazoo", name="/bench/election", server=self.server.hosts, cid=cid, incarnation=incarnation
        )

    def request_total(self) -> float:
        assert self.server is not None
        return zk_packets_received(self.server.port)

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


class RedisLockSystem(System):
    key = "python-redis-lock"
    label = "python-redis-lock (auto renewal)"
    monitor = True

    def unavailable(self) -> str | None:
        found = importlib.util.find_spec("redis_lock") is not None
        return None if found else "python-redis-lock is not installed (the `bench` extra)"

    def start_server(self) -> None:
        self._start_redis()

    def spawn(self, cid: str, incarnation: int) -> Candidate:
        assert self.lab is not None
        return _python_candidate(
            self, "redis-lock", name=LOCK, server=self.lab.url, cid=cid, incarnation=incarnation
        )


class RedisPySystem(System):
    key = "redis-py"
    label = "redis-py `Lock` + reacquire thread"
    monitor = True

    def unavailable(self) -> str | None:
        return None

    def start_server(self) -> None:
        self._start_redis()

    def spawn(self, cid: str, incarnation: int) -> Candidate:
        assert self.lab is not None
        return _python_candidate(
            self, "redis-py", name=LOCK, server=self.lab.url, cid=cid, incarnation=incarnation
        )


def _python_candidate(
    system: System, kind: str, *, name: str, server: str, cid: str, incarnation: int
) -> Candidate:
    ready_file = system.workdir / f"{cid}-{incarnation}.ready"
    argv = [
        sys.executable, str(CANDIDATES / "candidate.py"), kind,
        "--id", cid, "--ready", str(ready_file), "--name", name, "--server", server,
        "--ttl", str(TTL_S), "--", *system.cmd(cid),
    ]  # fmt: skip
    log = system._log(cid, incarnation)
    proc = spawn(argv, log_path=log)
    return Candidate(cid, proc, _alive_and(proc, log, ready_file.exists))


def all_systems(ctx: Context, workdir: Callable[[str], Path], *, elector_python: str) -> list[System]:
    return [
        ElectorSystem(ctx, workdir("elector"), python=elector_python),
        EtcdSystem(ctx, workdir("etcd")),
        ZooKeeperSystem(ctx, workdir("zookeeper")),
        RedisLockSystem(ctx, workdir("python-redis-lock")),
        RedisPySystem(ctx, workdir("redis-py")),
    ]


def tool_versions() -> str:
    """Versions of the peers' clients, for the method text."""
    from importlib.metadata import PackageNotFoundError, version

    parts = []
    for dist in ("redis", "kazoo", "python-redis-lock"):
        try:
            parts.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            parts.append(f"{dist} missing")
    parts.append(f"zookeeper {zookeeper.version()}" if shutil.which("dpkg-query") else "zookeeper ?")
    return ", ".join(parts)
