"""A private standalone ZooKeeper for the peers benchmark: Debian's zookeeper jar (package
zookeeperd, which brings java), started as our own process on a free 127.0.0.1 port with its own
data directory and config, and stopped by PID. The system service is never used.

tickTime is 200 ms (the default is 2 s) so that a 2 s session timeout can be negotiated at all
(ZooKeeper allows 2 to 20 ticks) and expiry is checked every 200 ms, not every 2 s: a crashed
holder's session then ends about 2 s after its last ping, comparable to the other systems' ttl 2 s.
`mntr` and `srvr` are whitelisted for the request counts; the admin HTTP server is off.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from bench.harness.common import BenchError, spawn, stop, wait_until
from bench.peers.probes import zk_four_letter
from elector.testing.redis_server import free_tcp_port

JARS = (Path("/usr/share/java/zookeeper.jar"),)
TICK_MS = 200
MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"


def unavailable_reason() -> str | None:
    """None when java and the zookeeper jar are installed, else why ZooKeeper cannot run."""
    if shutil.which("java") is None:
        return "java is not installed (package zookeeperd brings it)"
    missing = [str(jar) for jar in JARS if not jar.exists()]
    if missing:
        return f"{', '.join(missing)} missing (package zookeeperd)"
    return None


def version() -> str:
    done = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Version}", "zookeeper"], capture_output=True, text=True, check=False
    )
    return done.stdout.strip() or "unknown"


class ZooKeeperServer:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_tcp_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 40.0) -> ZooKeeperServer:
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "zoo.cfg"
        config.write_text(
            f"tickTime={TICK_MS}\n"
            f"dataDir={data}\n"
            f"clientPort={self.port}\n"
            "clientPortAddress=127.0.0.1\n"
            "maxClientCnxns=0\n"
            "admin.enableServer=false\n"
            "4lw.commands.whitelist=mntr,srvr,ruok\n"
            # Snapshots and log purging are irrelevant for a throw-away server.
            "autopurge.purgeInterval=0\n"
        )
        classpath = ":".join([*map(str, JARS), "/etc/zookeeper/conf"])
        argv = [
            "java", "-Xmx256m", "-cp", classpath,
            f"-Dzookeeper.log.dir={self.workdir}", "-Dzookeeper.root.logger=WARN,CONSOLE",
            MAIN, str(config),
        ]  # fmt: skip
        self.proc = spawn(argv, log_path=self.workdir / "zookeeper.log")
        wait_until(self._serving, timeout_s=timeout_s, what="ZooKeeper to answer ruok")
        return self

    def _serving(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            log = (self.workdir / "zookeeper.log").read_text(errors="replace")[-1500:]
            raise BenchError(f"ZooKeeper exited with {self.proc.returncode}:\n{log}")
        try:
            return zk_four_letter(self.port, "ruok").startswith("imok")
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)
            self.proc = None
