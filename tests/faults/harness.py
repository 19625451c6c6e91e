"""A cluster of real exec-mode daemons for the fault suite, and the watcher that journals deaths.

    with Cluster(tmp_path, ttl_s=2.0) as cluster:   # lock Redis, resource Redis, 3 daemons
        faults.kill_leader(cluster)
    report = checker.check(cluster.directory)

Each daemon reaches the lock Redis through its own TcpProxy (so one node's link can be cut), and
runs tests/faults/child.py as its command. The resource Redis the children write to is never
faulted: the fence must survive every fault of the lock Redis. The proxies live in an event loop
on a thread of their own, so the harness itself is plain blocking code.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Self, TypeVar

import redis

from elector.daemon.execmode.proctree import Proc, all_procs, read_proc
from elector.daemon.testing_hooks import BLOCK_LOOP_ENV
from elector.testing.redis_server import RedisServerProcess
from tests.support.daemon import DaemonProcess
from tests.support.seed import seed_used_lock
from tests.support.sentinel import SentinelSet
from tests.support.tcp_proxy import TcpProxy

from .checker import CHILD_GLOB, HARNESS_JOURNAL

CHILD = Path(__file__).with_name("child.py")
LOCK = "jobs"
RESOURCE_KEY = "{jobs}:resource"
T = TypeVar("T")


def _process(pid: int, starttime: int | None) -> Proc | None:
    """The process `pid` names now, if any; with `starttime`, only while it is still the process
    that started then (pid_max can be 32768: a loaded suite recycles pids in minutes)."""
    proc = read_proc(pid)
    if proc is None or (starttime is not None and proc.start_ticks != starttime):
        return None
    return proc


def group_of(pid: int, starttime: int | None = None) -> int | None:
    """The process group of a leader's command: its keeper's (the command runs under one).

    With `starttime` (the child's start record has it), None once the pid belongs to another
    process: a worker of the suite once got a dead child's pid under `make test-loaded`, and the
    kill meant for the child's keeper group ended that worker."""
    proc = _process(pid, starttime)
    return None if proc is None else proc.pgid


def session_members(session: int) -> list[int]:
    """Live processes of a command's session (keeper, command, its descendants): orphans, once the
    lease they ran under is over."""
    return [proc.pid for proc in all_procs(session=session) if proc.alive]


def alive(pid: int, starttime: int | None = None) -> bool:
    """Still able to run: exists and is not a zombie (a zombie has exited, it only awaits its
    reaper), and (with `starttime`) is still the process that started then, not a later one."""
    proc = _process(pid, starttime)
    return proc is not None and proc.alive


class Journal:
    """The harness's own journal: one JSON line per write(), O_APPEND, fsynced."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()

    def append(self, kind: str, **fields: Any) -> None:
        line = (json.dumps({"kind": kind, **fields}, separators=(",", ":")) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)
            os.fsync(self._fd)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


class ProxyLoop:
    """An asyncio loop on a daemon thread, for the TcpProxies; call() runs code in it and waits."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="faults-proxies", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def call(self, fn: Callable[[], T]) -> T:
        async def wrapper() -> T:
            return fn()

        return self.run(wrapper())

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        self.loop.close()


class Node:
    """One replica: a daemon with its own proxy to the lock Redis and its own child journal."""

    def __init__(
        self,
        cluster: Cluster,
        slot: int,
        generation: int,
        *,
        program: tuple[str, ...] | None = None,
        options: tuple[str, ...] = (),
        lock: str = LOCK,
    ) -> None:
        self.slot = slot
        self.identity = f"n{slot}-{generation}"
        options = (*cluster.options_of(slot), *options)
        #: Its `--on-child-exit` policy (the last one given wins, as on the command line).
        self.policy = "release"
        for flag, value in itertools.pairwise(options):
            if flag == "--on-child-exit":
                self.policy = value
        self.journal = cluster.directory / f"child-{self.identity}.jsonl"
        # Through a proxy of its own to the lock Redis; with Sentinel straight to the sentinels.
        self.proxy: TcpProxy | None = None
        if cluster.sentinel is None:
            self.proxy = TcpProxy("127.0.0.1", cluster.lock_port)
            cluster.proxies.run(self.proxy.start())
        url = cluster.sentinel.url if cluster.sentinel is not None else self.proxy_of().url
        child = (sys.executable, str(CHILD), "--journal", str(self.journal),
                 "--resource-url", cluster.resource.url, "--key", RESOURCE_KEY)  # fmt: skip
        self.daemon = DaemonProcess(
            redis_url=url,
            identity=self.identity,
            log_dir=cluster.logs,
            lock=lock,
            ttl=f"{round(cluster.ttl_s * 1000)}ms",
            extra_args=(*options, "--", *child),
            # Armed in every daemon of the suite: the `block_loop` fault stalls one for 2 ttl.
            env={BLOCK_LOOP_ENV: f"{2 * cluster.ttl_s:g}"},
        )
        if program is not None:  # another build's `elector` (the previous release, for mixed fleets)
            assert self.daemon.command[1:3] == ["-m", "elector"], self.daemon.command
            self.daemon.command[:3] = program

    def proxy_of(self) -> TcpProxy:
        if self.proxy is None:
            raise AssertionError(f"{self.identity} talks to Sentinel directly: no proxy to fault")
        return self.proxy

    @property
    def pid(self) -> int:
        assert self.daemon.process is not None
        return self.daemon.process.pid

    def running(self) -> bool:
        return self.daemon.process is not None and self.daemon.process.poll() is None


class Cluster:
    """Lock Redis + resource Redis + `size` daemons; the watcher journals every child's death."""

    def __init__(
        self,
        directory: Path,
        *,
        ttl_s: float = 2.0,
        size: int = 3,
        sentinel: SentinelSet | None = None,
        options_of: Callable[[int], tuple[str, ...]] = lambda slot: (),
        redis_binary: str | None = None,
    ) -> None:
        """`options_of(slot)`: `elector run` options of every node in that slot (1..size)."""
        self.directory = directory
        self.options_of = options_of
        self.logs = directory / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.ttl_s = ttl_s
        self.size = size
        self.sentinel = sentinel  # started by the caller; then there is no lock_redis of our own
        self.journal = Journal(directory / HARNESS_JOURNAL)
        self.lock_redis = RedisServerProcess(binary=redis_binary)
        self.resource = RedisServerProcess(binary=redis_binary)
        self.proxies = ProxyLoop()
        self.nodes: list[Node] = []
        self.retired: list[Node] = []
        self._generation = 0
        # Watcher state: pid -> its latest start record; pids seen gone; end records seen.
        self.starts: dict[int, dict[str, Any]] = {}
        self.ended: set[int] = set()
        self.gone: set[int] = set()
        self._offsets: dict[Path, int] = {}
        self._watch_lock = threading.Lock()
        self._stop_watch = threading.Event()
        self._stopped = False
        self._watcher = threading.Thread(target=self._watch, name="faults-watcher", daemon=True)

    @property
    def lock_port(self) -> int:
        return self.lock_redis.port

    # -- life cycle -----------------------------------------------------------------------------------

    def start(self) -> Self:
        if self.sentinel is None:
            self.lock_redis.start()
            lock_url = self.lock_redis.url
        else:
            host, port = self.sentinel.master_address()
            lock_url = f"redis://{host}:{port}/0"
        self.resource.start()
        with redis.Redis.from_url(lock_url) as client:
            seed_used_lock(client, LOCK)  # skip the new lock's quiet period
        self._watcher.start()
        started = [self.add_node(wait=False) for _ in range(self.size)]
        for node in started:
            node.daemon.wait_http()
        self.wait_for_leader(timeout_s=10 + 2 * self.ttl_s)
        self.journal.append("run", t_begin=time.monotonic(), ttl_s=self.ttl_s, prompt_s=self.prompt_s)
        return self

    @property
    def prompt_s(self) -> float:
        """How soon a resumed ex-leader's child must be gone: a cycle, the kill grace, slack for load."""
        return max(1.5, self.ttl_s)

    def add_node(
        self,
        *,
        wait: bool = True,
        program: tuple[str, ...] | None = None,
        options: tuple[str, ...] = (),
        lock: str = LOCK,
    ) -> Node:
        """Start one more replica; `program` replaces `python -m elector` (e.g. an older release's),
        `options` go to `elector run` before the command, `lock` is its --lock."""
        self._generation += 1
        used = {node.slot for node in self.nodes}
        slot = next(i for i in range(1, len(self.nodes) + 2) if i not in used)
        node = Node(self, slot, self._generation, program=program, options=options, lock=lock)
        node.daemon.start()
        self.nodes.append(node)
        if wait:
            node.daemon.wait_http()
        return node

    def retire(self, node: Node) -> None:
        """Forget a node whose daemon is dead (it stays in `retired` for its logs)."""
        self.nodes.remove(node)
        self.retired.append(node)
        if node.proxy is not None:
            with contextlib.suppress(Exception):
                self.proxies.run(node.proxy.stop())

    def stop(self) -> None:
        """End the run window, stop every daemon (SIGTERM), and wait until every child is seen gone."""
        if self._stopped:
            return
        self._stopped = True
        self.journal.append("run", t_begin=self._run_begin(), t_end=time.monotonic(),
                            ttl_s=self.ttl_s, prompt_s=self.prompt_s)  # fmt: skip
        for pid in self.live_children():  # a frozen child would not act on its SIGTERM either
            with contextlib.suppress(OSError, TypeError):
                os.killpg(group_of(pid, self.starttime_of(pid)), signal.SIGCONT)  # type: ignore[arg-type]
        everyone = self.nodes + self.retired
        for node in everyone:  # all at once: followers must not take over one after another
            self._resume_quietly(node)
            if node.running():
                node.daemon.signal(signal.SIGTERM)
        for node in everyone:  # not daemon.stop(): a second SIGTERM would skip the orderly stop
            process = node.daemon.process
            if process is not None and process.poll() is None:
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self.live_children():
            time.sleep(0.02)
        for pid in self.live_children():  # a child that outlived its daemon: the worst case, journaled
            with contextlib.suppress(OSError, TypeError):
                os.killpg(group_of(pid, self.starttime_of(pid)), signal.SIGKILL)  # type: ignore[arg-type]
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and self.live_children():
            time.sleep(0.02)
        self._scan()
        self._stop_watch.set()
        if self._watcher.ident is not None:  # started (a failed start() may not have got there)
            self._watcher.join(timeout=5)

    def close(self) -> None:
        for node in self.nodes + self.retired:
            if node.proxy is not None:
                with contextlib.suppress(Exception):
                    self.proxies.run(node.proxy.stop())
        self.proxies.close()
        self.lock_redis.stop()
        self.resource.stop()
        self.journal.close()

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.stop()
            self.close()
            raise

    def __exit__(self, *exc_info: object) -> None:
        try:
            self.stop()
        finally:
            self.close()

    def _run_begin(self) -> float:
        path = self.directory / HARNESS_JOURNAL
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record["kind"] == "run":
                return float(record["t_begin"])
        return time.monotonic()

    @staticmethod
    def _resume_quietly(node: Node) -> None:
        if node.running():
            with contextlib.suppress(OSError):
                os.kill(node.pid, signal.SIGCONT)  # a stopped daemon would not act on SIGTERM

    # -- the watcher ----------------------------------------------------------------------------------

    def _watch(self) -> None:
        while not self._stop_watch.wait(0.005):
            self._scan()

    def _scan(self) -> None:
        with self._watch_lock:
            for path in self.directory.glob(CHILD_GLOB):
                offset = self._offsets.get(path, 0)
                with path.open("rb") as file:
                    file.seek(offset)
                    data = file.read()
                complete = data[: data.rfind(b"\n") + 1]
                self._offsets[path] = offset + len(complete)
                for line in complete.decode().splitlines():
                    record = json.loads(line)
                    if record["kind"] == "start":
                        self.starts[int(record["pid"])] = record
                    elif record["kind"] == "end":
                        self.ended.add(int(record["pid"]))
            for pid in list(self.starts):
                if pid not in self.gone and not alive(pid, self.starttime_of(pid)):
                    # Taken after the check: the process was dead by then, so this bounds its end late.
                    self.journal.append("gone", pid=pid, t=time.monotonic())
                    self.gone.add(pid)

    def starttime_of(self, pid: int) -> int | None:
        """The start time a child's start record gave (see child.py), if any."""
        record = self.starts.get(pid)
        value = None if record is None else record.get("starttime")
        return None if value is None else int(value)

    def live_children(self) -> list[int]:
        self._scan()
        return [pid for pid in self.starts if pid not in self.gone]

    # -- who leads ------------------------------------------------------------------------------------

    def leader(self) -> tuple[Node, int] | None:
        """The node whose child runs the newest term (child not ended, not gone), and that child's pid."""
        self._scan()
        candidates = [
            (record["t"], pid, record["identity"])
            for pid, record in self.starts.items()
            if pid not in self.gone and pid not in self.ended
        ]
        if not candidates:
            return None
        _, pid, identity = max(candidates)
        node = next((n for n in self.nodes if n.identity == identity), None)
        return None if node is None else (node, pid)

    def wait_for_leader(self, *, timeout_s: float, not_pid: int | None = None) -> tuple[Node, int]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = self.leader()
            if found is not None and found[1] != not_pid:
                return found
            time.sleep(0.01)
        logs = "\n".join(f"--- {n.identity}\n{n.daemon.logs_text()[-3000:]}" for n in self.nodes)
        raise AssertionError(f"no leader's child running within {timeout_s}s\n{logs}")

    def followers(self) -> list[Node]:
        found = self.leader()
        return [n for n in self.nodes if found is None or n is not found[0]]


def wait_ready(node: Node, *, timeout_s: float = 20.0) -> None:
    """/readyz 200: what a Deployment waits for before it terminates the next old pod."""
    deadline = time.monotonic() + timeout_s
    while node.daemon.get("/readyz")[0] != 200:
        if time.monotonic() > deadline:
            raise AssertionError(
                f"new pod {node.identity} not ready within {timeout_s}s:\n{node.daemon.logs_text()[-3000:]}"
            )
        time.sleep(0.05)


def terminate(cluster: Cluster, node: Node, *, leader_child: int | None, takeover_timeout_s: float) -> None:
    """A Deployment's termination of a replaced pod: SIGTERM (the daemon must exit 0), and, when the
    pod led (`leader_child`: its child's pid), wait until another replica's child runs."""
    node.daemon.signal(signal.SIGTERM)
    code = node.daemon.wait(timeout_s=15)
    assert code == 0, node.daemon.logs_text()[-3000:]
    cluster.retire(node)
    if leader_child is not None:
        cluster.wait_for_leader(timeout_s=takeover_timeout_s, not_pid=leader_child)
