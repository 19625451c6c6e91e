"""etcd as the peer of the timing benchmarks: install it, run a private server, and contend with
`etcdctl lock NAME -- CMD`, whose CMD writes its start time to a file and then sleeps.

etcdctl runs CMD while it holds the lock and releases the lock when CMD exits; it does not kill
CMD when it dies itself, so the benchmarks clean the orphan up (the whole process group).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from bench.harness.common import BenchError, spawn, stop, wait_until
from bench.servers.install import apt_install, present
from elector.testing.redis_server import free_tcp_port

PACKAGES = ("etcd-server", "etcd-client")


@dataclasses.dataclass(frozen=True)
class EtcdInstall:
    available: bool
    version: str  # e.g. "etcd 3.4.23, etcdctl 3.4.23"
    note: str  # how it was found or installed, or why it is missing


def ensure_etcd(say: Callable[[str], None]) -> EtcdInstall:
    """etcd and etcdctl from PATH; installed with apt-get (as root) when missing."""
    installed_now = False
    if not (present("etcd") and present("etcdctl")):
        reason = _apt_install(say)
        if reason is not None:
            say(f"etcd unavailable: {reason}; the etcd peer columns are skipped")
            return EtcdInstall(False, "", f"unavailable: {reason}")
        installed_now = True
    version = f"etcd {_version(['etcd', '--version'])}, etcdctl {_version(['etcdctl', 'version'])}"
    note = "installed by this run with apt-get" if installed_now else "found on PATH"
    say(f"{version} ({note})")
    return EtcdInstall(True, version, note)


def _apt_install(say: Callable[[str], None]) -> str | None:
    """None on success, else the reason etcd cannot be installed."""
    say(f"etcd/etcdctl missing: apt-get update && apt-get install -y {' '.join(PACKAGES)}")
    problem = apt_install(list(PACKAGES))
    if problem is not None:
        return f"etcd is not installed and {problem}"
    if not (present("etcd") and present("etcdctl")):
        return "apt-get install succeeded but etcd/etcdctl are still not on PATH"
    return None


def _version(argv: list[str]) -> str:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False).stdout
    first = out.strip().splitlines()[0] if out.strip() else "unknown"
    return first.split(":", 1)[-1].strip()


class EtcdServer:
    """A one-member etcd on free 127.0.0.1 ports with a throw-away data directory."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.client_port = free_tcp_port()
        self.peer_port = free_tcp_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    def start(self, timeout_s: float = 20.0) -> EtcdServer:
        peer = f"http://127.0.0.1:{self.peer_port}"
        argv = [
            "etcd",
            "--name", "bench",
            "--data-dir", str(self.workdir / "data"),
            "--listen-client-urls", self.endpoint,
            "--advertise-client-urls", self.endpoint,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"bench={peer}",
            "--logger", "zap",
            "--log-level", "warn",
        ]  # fmt: skip
        self.proc = spawn(argv, log_path=self.workdir / "etcd.log")
        wait_until(self._healthy, timeout_s=timeout_s, what="etcd to report healthy")
        return self

    def _healthy(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            log = (self.workdir / "etcd.log").read_text(errors="replace")[-1500:]
            raise BenchError(f"etcd exited with {self.proc.returncode}:\n{log}")
        try:
            with urllib.request.urlopen(f"{self.endpoint}/health", timeout=1) as response:
                return bool(json.loads(response.read()).get("health") == "true")
        except (OSError, ValueError):
            return False

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)
            self.proc = None

    def etcdctl(self, *args: str) -> list[str]:
        return ["etcdctl", "--endpoints", self.endpoint, *args]

    def keys(self, prefix: str) -> list[str]:
        argv = self.etcdctl("get", "--prefix", "--keys-only", prefix)
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10, env=_ENV, check=False)
        if done.returncode != 0:
            raise BenchError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
        return [line for line in done.stdout.splitlines() if line.strip()]


_ENV = {**os.environ, "ETCDCTL_API": "3"}


class LockContender:
    """`etcdctl lock [--ttl N] NAME -- sh -c 'date +%s.%N > FILE; exec sleep 3600'`."""

    def __init__(self, server: EtcdServer, *, lock: str, ttl_s: int | None, workdir: Path, tag: str) -> None:
        self.stamp = workdir / f"{tag}.started"
        self.log_path = workdir / f"{tag}.log"
        script = f"date +%s.%N > {shlex.quote(str(self.stamp))}.tmp && mv {shlex.quote(str(self.stamp))}.tmp "
        script += f"{shlex.quote(str(self.stamp))}; exec sleep 3600"
        ttl = ["--ttl", str(ttl_s)] if ttl_s is not None else []
        self.argv = server.etcdctl("lock", *ttl, lock, "--", "sh", "-c", script)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> LockContender:
        self.stamp.unlink(missing_ok=True)
        self.proc = spawn(self.argv, log_path=self.log_path, env={"ETCDCTL_API": "3"})
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def started_at(self) -> float | None:
        """Epoch seconds at which CMD started (it holds the lock), or None while waiting."""
        try:
            return float(self.stamp.read_text().strip())
        except (FileNotFoundError, ValueError):
            if self.proc is not None and self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-1500:]
                raise BenchError(
                    f"etcdctl exited with {self.proc.returncode} before CMD ran:\n{tail}"
                ) from None
            return None

    def wait_started(self, timeout_s: float) -> float:
        return wait_until(self.started_at, timeout_s=timeout_s, what="etcdctl to run its CMD")

    def cmd_pid(self) -> int:
        """PID of CMD (the `sleep` the shell exec'd into): etcdctl's only child."""
        children = wait_until(lambda: _children(self.pid), timeout_s=5, what="etcdctl's child")
        return children[0]

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Field 4 (ppid) follows the command name in parentheses, which may contain blanks.
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def wait_queued(server: EtcdServer, lock: str, count: int, timeout_s: float = 10.0) -> None:
    """Wait until `count` sessions hold or wait for LOCK (one key each under LOCK/)."""
    deadline = time.monotonic() + timeout_s
    while len(server.keys(f"{lock}/")) != count:
        if time.monotonic() > deadline:
            raise BenchError(f"etcd lock {lock!r} never had {count} contenders")
        time.sleep(0.05)
