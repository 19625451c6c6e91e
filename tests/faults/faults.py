"""The faults, each injected into a running Cluster and journaled for the checker.

Every function journals a ``fault`` record (kind, time, the leader child's pid, the unavoidable
gap it excuses from the availability, whether a takeover is expected) at the moment the fault
begins, heals the fault itself when it is a temporary one, and returns what the scenario tests
need to assert on. "The leader" is the node whose child runs the newest term.

A crash or a freeze of the pod hits the daemon AND its command's process group (the command runs
under its keeper, in the keeper's group), as a container runtime or a frozen VM would. The
daemon-only faults (`kill_daemon`, `pause_daemon`, `block_loop`) hit the daemon alone, as an OOM
kill, systemd's KillMode=process or a stalled event loop would: the keeper must then stop the
command before the lease can expire, leaving no orphan (`session` is recorded to check that).
The keeper faults (`kill_keeper`) SIGKILL the keeper alone, as an OOM kill would, and may freeze
the daemon right after: then nothing of elector runs that could stop the command but the death
signal the keeper gave it, and the daemon's kill of the tree once it runs again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import time

import redis

from tests.support.sentinel import SentinelSetError

from .harness import Cluster, Node, group_of, session_members

#: Kinds that take the leader away: the checker measures a takeover after each.
TAKEOVER_KINDS = frozenset({"kill_leader", "term_leader", "pause_long", "cut_leader", "blackhole_leader",
                            "redis_restart", "sentinel_failover", "sentinel_kill_master",
                            "kill_daemon", "pause_daemon", "block_loop",
                            "kill_keeper_pause_daemon", "kill_keeper_release"})  # fmt: skip
#: The daemon alone is hit (its command must be stopped by its keeper), or the keeper alone.
DAEMON_ONLY_KINDS = frozenset({"kill_daemon", "pause_daemon", "block_loop", "kill_keeper_pause_daemon",
                               "kill_keeper_restart", "kill_keeper_release"})  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Injected:
    kind: str
    t: float
    node: Node
    child_pid: int
    #: The session of the leader's command (its keeper's pid), while it ran.
    session: int | None = None


def _record(cluster: Cluster, kind: str, *, excuse_ttls: float, node: Node, child_pid: int) -> Injected:
    t = time.monotonic()
    session = None
    with contextlib.suppress(ProcessLookupError):
        session = os.getsid(child_pid)
    cluster.journal.append(
        "fault", fault=kind, t=t, target=node.identity, target_pid=child_pid,
        excuse_s=excuse_ttls * cluster.ttl_s, takeover=kind in TAKEOVER_KINDS,
    )  # fmt: skip
    return Injected(kind, t, node, child_pid, session=session)


def _leader(cluster: Cluster) -> tuple[Node, int]:
    return cluster.wait_for_leader(timeout_s=10 + 3 * cluster.ttl_s)


def kill_leader(cluster: Cluster) -> Injected:
    """SIGKILL the leader's pod: the daemon and its command's process group, at once."""
    node, child = _leader(cluster)
    injected = _record(cluster, "kill_leader", excuse_ttls=1.0, node=node, child_pid=child)
    group = group_of(child, cluster.starttime_of(child))
    os.kill(node.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, TypeError):
        os.killpg(group, signal.SIGKILL)  # type: ignore[arg-type]
    node.daemon.wait(timeout_s=5)
    cluster.retire(node)
    return injected


def kill_daemon(cluster: Cluster) -> Injected:
    """SIGKILL the leader's daemon ALONE: its command's keeper sees the pipe close and stops it."""
    node, child = _leader(cluster)
    injected = _record(cluster, "kill_daemon", excuse_ttls=1.0, node=node, child_pid=child)
    os.kill(node.pid, signal.SIGKILL)
    node.daemon.wait(timeout_s=5)
    cluster.retire(node)
    return injected


def pause_daemon(cluster: Cluster, *, seconds: float) -> Injected:
    """SIGSTOP the leader's daemon ALONE for `seconds` (> ttl), then SIGCONT it: no renewal comes,
    and the keeper stops the command by the lease's deadline. The command is not frozen, so any
    overlap with the successor is a violation (no fencing excuse)."""
    node, child = _leader(cluster)
    injected = _record(cluster, "pause_daemon", excuse_ttls=1.0, node=node, child_pid=child)
    os.kill(node.pid, signal.SIGSTOP)
    time.sleep(seconds)
    os.kill(node.pid, signal.SIGCONT)
    return injected


def block_loop(cluster: Cluster) -> Injected:
    """Block the leader's event loop for 2 ttl (the daemon's testing hook, armed by the harness):
    the process lives and holds its pipe to the keeper, but nothing it runs can stop the command."""
    node, child = _leader(cluster)
    injected = _record(cluster, "block_loop", excuse_ttls=1.0, node=node, child_pid=child)
    os.kill(node.pid, signal.SIGUSR2)
    return injected


def kill_keeper(cluster: Cluster, *, then_pause_daemon_s: float | None = None) -> Injected:
    """SIGKILL the leader's keeper ALONE (an OOM kill); with `then_pause_daemon_s`, SIGSTOP the
    daemon right after it for that long (> ttl), then SIGCONT it.

    The kind says what was hit: `kill_keeper_pause_daemon`, or `kill_keeper_restart` /
    `kill_keeper_release` after the leader's `--on-child-exit` policy (see `Node.policy`)."""
    node, child = _leader(cluster)
    paused = then_pause_daemon_s is not None
    kind = "kill_keeper_pause_daemon" if paused else f"kill_keeper_{node.policy}"
    injected = _record(cluster, kind, excuse_ttls=1.0, node=node, child_pid=child)
    keeper = group_of(child, cluster.starttime_of(child))  # the command runs in its keeper's group
    if keeper is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(keeper, signal.SIGKILL)
    if then_pause_daemon_s is not None:
        os.kill(node.pid, signal.SIGSTOP)
        time.sleep(then_pause_daemon_s)
        os.kill(node.pid, signal.SIGCONT)
    return injected


def orphans(injected: Injected) -> list[int]:
    """What still runs of the command's session the fault hit (its lease is over by now)."""
    return [] if injected.session is None else session_members(injected.session)


def term_leader(cluster: Cluster) -> tuple[Injected, int]:
    """SIGTERM the leader's daemon: it stops its command, releases, exits 0. Returns its exit code."""
    node, child = _leader(cluster)
    injected = _record(cluster, "term_leader", excuse_ttls=0.0, node=node, child_pid=child)
    node.daemon.signal(signal.SIGTERM)
    code = node.daemon.wait(timeout_s=10)
    cluster.retire(node)
    return injected, code


@dataclasses.dataclass(frozen=True)
class Paused:
    injected: Injected
    frozen: float
    resumed: float


def pause_leader(cluster: Cluster, *, seconds: float, child_first: bool = False) -> Paused:
    """SIGSTOP the leader's pod (daemon and command) for `seconds`, then SIGCONT it.

    child_first: resume the command first and let it make one write (rejected, if the pause
    outlived the lease) before resuming its keeper and the daemon. A VM resumes its threads in any
    order; this one makes sure the stale write happens, so the test can check the fence rejects
    it (resumed first, the keeper would kill the command at once: its deadline passed).
    """
    node, child = _leader(cluster)
    kind = "pause_long" if seconds > cluster.ttl_s else "pause_short"
    injected = _record(cluster, kind, excuse_ttls=1.0 if kind == "pause_long" else 0.0, node=node,
                       child_pid=child)  # fmt: skip
    # The keeper's group: a frozen pod freezes the keeper too.
    group = group_of(child, cluster.starttime_of(child))
    os.kill(node.pid, signal.SIGSTOP)
    with contextlib.suppress(ProcessLookupError, TypeError):
        os.killpg(group, signal.SIGSTOP)  # type: ignore[arg-type]
    frozen = time.monotonic()  # after the last SIGSTOP: until then the processes could act
    time.sleep(seconds)
    resumed = time.monotonic()  # before the first SIGCONT
    if child_first:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGCONT)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and not _wrote_since(cluster, node, child, resumed):
            time.sleep(0.005)
    with contextlib.suppress(ProcessLookupError, TypeError):
        os.killpg(group, signal.SIGCONT)  # type: ignore[arg-type]
    os.kill(node.pid, signal.SIGCONT)
    cluster.journal.append(
        "pause", pids=[node.pid, child], t=frozen, t_resume=resumed, identity=node.identity
    )
    return Paused(injected, frozen, resumed)


def _wrote_since(cluster: Cluster, node: Node, child: int, since: float) -> bool:
    for line in node.journal.read_text().splitlines():
        record = json.loads(line)
        if record["kind"] in ("write", "end") and record["pid"] == child and record["t"] >= since:
            return True
    return False


def link_fault(cluster: Cluster, kind: str, *, seconds: float, delay_s: float = 0.0) -> Injected:
    """Fault the leader's link to the lock Redis for `seconds`: `cut_leader` (RST),
    `blackhole_leader` (silence), or `slow_leader` (each chunk `delay_s` late); then heal it."""
    node, child = _leader(cluster)
    injected = _record(cluster, kind, excuse_ttls=1.0, node=node, child_pid=child)
    proxy = node.proxy_of()
    if kind == "cut_leader":
        cluster.proxies.call(proxy.cut)
    elif kind == "blackhole_leader":
        cluster.proxies.call(proxy.blackhole)
    elif kind == "slow_leader":
        cluster.proxies.call(lambda: proxy.delay(delay_s))
    else:
        raise ValueError(f"unknown link fault {kind!r}")
    time.sleep(seconds)
    cluster.proxies.call(proxy.restore)
    return injected


def cut_follower(cluster: Cluster, *, seconds: float) -> Injected:
    """Cut one follower off the lock Redis for `seconds`: the leader must not notice."""
    node, child = _leader(cluster)
    follower = next(n for n in cluster.nodes if n is not node)
    injected = _record(cluster, "cut_follower", excuse_ttls=0.0, node=node, child_pid=child)
    cluster.proxies.call(follower.proxy_of().cut)
    time.sleep(seconds)
    cluster.proxies.call(follower.proxy_of().restore)
    return injected


def redis_restart(cluster: Cluster) -> Injected:
    """Restart the lock Redis empty (no persistence) on the same port."""
    node, child = _leader(cluster)
    # The old lease is gone at once; the quiet period (one ttl) starts at the first acquire.
    injected = _record(cluster, "redis_restart", excuse_ttls=2.0, node=node, child_pid=child)
    cluster.lock_redis.restart_empty()
    return injected


def sentinel_failover(cluster: Cluster, *, kill_master: bool) -> tuple[Injected, tuple[str, int]]:
    """A Sentinel failover: planned (SENTINEL FAILOVER), or forced by a SIGKILL of the master.

    Returns the new master's address once every sentinel names it. A planned failover is recorded
    when a sentinel accepts it, not when it was first asked for: shortly after a start or another
    failover the sentinels refuse it (NOGOODSLAVE, INPROG) for seconds, and that wait is neither a
    fault nor elector's."""
    sentinel = cluster.sentinel
    if sentinel is None:
        raise AssertionError("a Sentinel fault needs a Cluster built with sentinel=")
    node, child = _leader(cluster)
    kind = "sentinel_kill_master" if kill_master else "sentinel_failover"
    # The promoted replica has another run_id: one quiet ttl; a SIGKILL adds down-after (1 s).
    if kill_master:
        injected = _record(cluster, kind, excuse_ttls=2.0, node=node, child_pid=child)
        return injected, sentinel.kill_master()
    old = sentinel.master_address()
    deadline = time.monotonic() + 60
    injected: Injected | None = None
    while time.monotonic() < deadline:
        try:
            with sentinel.sentinels[0].client() as client:
                client.execute_command("SENTINEL", "FAILOVER", sentinel.master_name)
        except redis.ResponseError:
            time.sleep(0.1)  # refused (NOGOODSLAVE, INPROG): ask again
            continue
        if injected is None:
            injected = _record(cluster, kind, excuse_ttls=2.0, node=node, child_pid=child)
        # Sentinel may abort an accepted failover (its failover-timeout): then ask again.
        attempt_ends = min(deadline, time.monotonic() + 15)
        while time.monotonic() < attempt_ends:
            with contextlib.suppress(redis.RedisError, SentinelSetError):
                address = sentinel.master_address()
                if address != old:
                    return injected, address
            time.sleep(0.05)
    raise AssertionError("the sentinels named no new master in time (60 s, failovers asked again)")


def heal_sentinel(cluster: Cluster, *, timeout_s: float = 30.0) -> None:
    """Bring a SIGKILLed ex-master back (empty; the sentinels turn it into a replica of the new
    master) and wait until every replica is linked again, so the next failover has a candidate."""
    sentinel = cluster.sentinel
    if sentinel is None:
        return
    for server in sentinel.servers:
        if not server.running:
            server.start()
    deadline = time.monotonic() + timeout_s
    expected = len(sentinel.servers) - 1
    while time.monotonic() < deadline:
        with contextlib.suppress(redis.RedisError, SentinelSetError):
            host, port = sentinel.master_address()
            with redis.Redis(host=host, port=port, socket_timeout=1.0) as client:
                info = client.info("replication")
            linked = [k for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)
                      and v.get("state") == "online"]  # fmt: skip
            if info.get("role") == "master" and len(linked) == expected:
                return
        time.sleep(0.1)
    raise AssertionError(f"the Sentinel deployment did not heal within {timeout_s}s")
