"""Each fault once, against three real exec-mode daemons; the checker judges the journals after.

Every scenario ends with `judge()`: no overlapping terms (except a frozen ex-leader's, covered by
fencing), fencing tokens strictly increasing, no stale fenced write accepted. The scenario-
specific asserts come on top. Times are asserted only with wide margins (the machine is busy).
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import pytest

from elector.election import ElectionTiming
from tests.support.daemon import DaemonProcess, wait_until

from . import faults
from .checker import Report, check
from .harness import CHILD, RESOURCE_KEY, Cluster, Node

pytestmark = pytest.mark.timeout(60)

TTL_S = 2.0
TIMING = ElectionTiming.from_ttl(TTL_S)


def wrote(journal: Path, pid: int) -> bool:
    """Whether the child `pid` journaled a fenced write."""
    lines = journal.read_text().splitlines() if journal.exists() else []
    records = [json.loads(line) for line in lines if line.endswith("}")]
    return any(record["kind"] == "write" and record["pid"] == pid for record in records)


def judge(cluster: Cluster) -> Report:
    """Stop the cluster and check its journals; fail with the whole story on any violation."""
    cluster.stop()
    report = check(cluster.directory)
    assert report.violations == 0, report.explain()
    assert report.writes_accepted > 0, report.explain()
    return report


def wait_for_writes(cluster: Cluster, *, not_pid: int | None = None) -> tuple[Node, int]:
    """The leader (other than `not_pid`'s) once its child made a fenced write: a loaded machine may
    take a second to import the child's client, and a run without writes has nothing to judge."""
    node, pid = cluster.wait_for_leader(timeout_s=TTL_S + 8, not_pid=not_pid)
    wait_until(lambda: wrote(node.journal, pid), timeout_s=20)
    return node, pid


def test_sigkill_of_the_leader_pod_is_taken_over_after_the_lease_expires(cluster: Cluster) -> None:
    wait_for_writes(cluster)
    killed = faults.kill_leader(cluster)
    node, _ = cluster.wait_for_leader(timeout_s=TTL_S + 8, not_pid=killed.child_pid)
    assert node is not killed.node
    time.sleep(0.5)
    report = judge(cluster)
    (takeover,) = report.takeovers_s
    # Nobody was granted the lock before the killed leader's lease lapsed: at the earliest one
    # renew deadline after its last renewal. (How long after that is the load's business: the
    # takeover's liveness is wait_for_leader's.)
    assert takeover >= TTL_S - TIMING.renew_deadline_s, report.explain()
    print(f"\nSIGKILL of the leader: taken over after {takeover:.2f}s (ttl {TTL_S}s)")
    assert report.covered_overlaps == []


def test_sigterm_of_the_leader_releases_and_the_next_term_has_a_higher_token(cluster: Cluster) -> None:
    wait_for_writes(cluster)
    injected, code = faults.term_leader(cluster)
    assert code == 0
    node, pid = cluster.wait_for_leader(timeout_s=TTL_S + 8, not_pid=injected.child_pid)
    # A loaded machine may take a second to import the child's client: judge() wants writes.
    wait_until(lambda: wrote(node.journal, pid), timeout_s=10)
    events = [line.get("event") for line in injected.node.daemon.log_lines()]
    assert "released" in events, events
    report = judge(cluster)
    old = next(term for term in report.terms if term.pid == injected.child_pid)
    assert old.end_source == "end"  # stopped by its SIGTERM, not killed
    assert report.covered_overlaps == []


def test_a_pause_shorter_than_the_margin_costs_no_term(cluster: Cluster) -> None:
    wait_for_writes(cluster)
    # A renewal due at the freeze goes out after it: within the renew deadline if the pause, the
    # renew interval and one request timeout fit in it (0.1 ttl + 0.3 ttl + 0.15 ttl < 2/3 ttl).
    paused = faults.pause_leader(cluster, seconds=0.1 * TTL_S)
    time.sleep(TTL_S)
    found = cluster.leader()
    node = paused.injected.node
    # Measured: how long the pod was frozen, and whether a request failed (a loaded machine).
    paused_s = paused.resumed - paused.frozen
    failed = [line for line in node.daemon.log_lines() if line.get("event") == "redis_unreachable"]
    must_keep = (
        paused_s + TIMING.renew_interval_s + TIMING.request_timeout_s < TIMING.renew_deadline_s and not failed
    )
    kept = found is not None and found[1] == paused.injected.child_pid
    print(f"\npause of {paused_s:.3f}s: term kept {kept} (required: {must_keep}; failed requests: {failed})")
    if must_keep:
        assert kept, node.daemon.logs_text()[-3000:]  # still the same term
    report = judge(cluster)  # whatever the pause cost: no overlap, tokens increasing
    assert report.covered_overlaps == []


def test_a_pause_longer_than_the_ttl_is_covered_by_fencing(cluster: Cluster) -> None:
    wait_for_writes(cluster)
    paused = faults.pause_leader(cluster, seconds=1.5 * TTL_S, child_first=True)
    old = paused.injected
    wait_until(lambda: old.child_pid in cluster.gone, timeout_s=cluster.prompt_s + 2)
    report = judge(cluster)
    (covered,) = report.covered_overlaps
    assert covered.older.pid == old.child_pid and covered.newer.start < paused.resumed
    stale = [w for w in covered.older.writes if w.sent >= paused.resumed]
    assert stale, "the resumed child made no write to be fenced"
    # The fence knows the newer token from the newer term's first accepted write on; a stale write
    # the resource took before that is ordered before all of the newer term's writes, which is
    # what fencing promises (tests/faults/checker.py). At load 11 the new child's first write came
    # 1.1 s after its term began, after the resumed child's one write: that write was accepted,
    # with its own token the highest the resource had seen, and the checker found no violation.
    # Loaded run #5: the new child had no accepted write yet when the old one was gone; then
    # nothing is fenced yet, and every stale write is ordered before the newer term's (infinity).
    fenced_at = min((w.replied for w in covered.newer.writes if w.accepted is True), default=math.inf)
    for w in stale:
        if w.sent < fenced_at:
            assert w.accepted is True and w.highest == covered.older.token, (w, fenced_at)
    assert all(
        w.accepted is False and w.highest == covered.newer.token for w in stale if w.sent >= fenced_at
    ), (
        [(w.accepted, w.highest, w.sent) for w in stale],
        covered.newer.token,
        report.explain(),
    )
    reasons = [
        line.get("reason") for line in old.node.daemon.log_lines() if line.get("event") == "stepped_down"
    ]
    assert reasons and reasons[-1] in ("lease_expired", "lost"), reasons


@pytest.mark.parametrize("kind", ["cut_leader", "blackhole_leader"])
def test_a_leader_cut_off_from_redis_stops_its_command_before_anyone_takes_over(
    cluster: Cluster, kind: str
) -> None:
    wait_for_writes(cluster)
    injected = faults.link_fault(cluster, kind, seconds=2 * TTL_S)
    cluster.wait_for_leader(timeout_s=TTL_S + 8, not_pid=injected.child_pid)
    report = judge(cluster)
    old = next(term for term in report.terms if term.pid == injected.child_pid)
    successor = next(term for term in report.terms if term.start > injected.t)
    assert old.end_source == "end" and old.end < successor.start
    assert successor.identity != old.identity
    assert report.covered_overlaps == []


@pytest.mark.parametrize("kind", ["kill_daemon", "pause_daemon", "block_loop"])
def test_the_daemon_alone_killed_frozen_or_stalled_leaves_no_command_beside_the_successor(
    cluster: Cluster, kind: str
) -> None:
    wait_for_writes(cluster)
    if kind == "kill_daemon":
        injected = faults.kill_daemon(cluster)
    elif kind == "pause_daemon":
        injected = faults.pause_daemon(cluster, seconds=2 * TTL_S)
    else:
        injected = faults.block_loop(cluster)  # the harness arms the hook for 2 ttl
    _, successor_pid = cluster.wait_for_leader(timeout_s=TTL_S + 8, not_pid=injected.child_pid)
    assert faults.orphans(injected) == [], "the old command's session outlived its lease"
    if kind != "kill_daemon":  # the daemon lives on, and sees its term ended once it runs again
        daemon = injected.node.daemon
        wait_until(lambda: "stepped_down" in [line.get("event") for line in daemon.log_lines()], timeout_s=10)
        assert daemon.process is not None and daemon.process.poll() is None
    wait_for_writes(cluster, not_pid=injected.child_pid)
    report = judge(cluster)
    old = next(term for term in report.terms if term.pid == injected.child_pid)
    successor = next(term for term in report.terms if term.pid == successor_pid)
    # Stopped by its keeper's SIGTERM (it wrote its end), before the successor began.
    assert old.end_source == "end" and old.end < successor.start, report.explain()
    assert report.covered_overlaps == []


@pytest.mark.parametrize("policy", ["release", "restart"])
def test_a_keeper_killed_alone_then_its_daemon_frozen_leaves_no_command_beside_the_successor(
    tmp_path: Path, policy: str, redis_binary: str
) -> None:
    # Two faults: nothing of elector can act after the first but the command's death signal
    # (PR_SET_PDEATHSIG towards its keeper); before, the command ran on beside the successor.
    with Cluster(
        tmp_path / "run",
        ttl_s=TTL_S,
        options_of=lambda slot: ("--on-child-exit", policy),
        redis_binary=redis_binary,
    ) as cluster:
        wait_for_writes(cluster)
        injected = faults.kill_keeper(cluster, then_pause_daemon_s=2 * TTL_S)
        _, successor_pid = cluster.wait_for_leader(timeout_s=TTL_S + 8, not_pid=injected.child_pid)
        assert faults.orphans(injected) == [], "the old command's session outlived its keeper"
        daemon = injected.node.daemon
        wait_until(lambda: "keeper_lost" in [line.get("event") for line in daemon.log_lines()], timeout_s=10)
        wait_for_writes(cluster, not_pid=injected.child_pid)
        report = judge(cluster)
    old = next(term for term in report.terms if term.pid == injected.child_pid)
    successor = next(term for term in report.terms if term.pid == successor_pid)
    assert old.end < successor.start, report.explain()
    assert report.covered_overlaps == []


def test_a_keeper_killed_alone_under_restart_has_its_command_killed_at_once_and_started_again(
    tmp_path: Path, redis_binary: str
) -> None:
    with Cluster(
        tmp_path / "run",
        ttl_s=TTL_S,
        options_of=lambda slot: ("--on-child-exit", "restart"),
        redis_binary=redis_binary,
    ) as cluster:
        wait_for_writes(cluster)
        injected = faults.kill_keeper(cluster)
        assert injected.kind == "kill_keeper_restart"
        node, pid = cluster.wait_for_leader(timeout_s=TTL_S + 8, not_pid=injected.child_pid)
        assert node is injected.node, "the daemon keeps leading and restarts its command"
        assert faults.orphans(injected) == []
        wait_until(lambda: wrote(node.journal, pid), timeout_s=10)
        report = judge(cluster)
    old = next(term for term in report.terms if term.pid == injected.child_pid)
    restarted = next(term for term in report.terms if term.pid == pid)
    # Killed at once (no SIGTERM, so no end record of its own), not after the restart's back-off.
    assert old.end_source == "gone", report.explain()
    assert restarted.token == old.token and old.end < restarted.start, report.explain()


def test_a_slow_link_to_the_leader_never_gives_two_leaders(cluster: Cluster) -> None:
    wait_for_writes(cluster)
    # 0.13 s each way: a round trip just inside the request timeout (0.3 s at ttl 2 s), so some
    # renewals succeed late and, on a loaded machine, some time out.
    faults.link_fault(cluster, "slow_leader", seconds=2 * TTL_S, delay_s=0.13)
    cluster.wait_for_leader(timeout_s=TTL_S + 8)
    report = judge(cluster)
    assert report.covered_overlaps == []


def test_redis_restarted_empty_keeps_tokens_increasing(cluster: Cluster) -> None:
    wait_for_writes(cluster)
    injected = faults.redis_restart(cluster)
    cluster.wait_for_leader(timeout_s=3 * TTL_S + 8, not_pid=injected.child_pid)
    time.sleep(0.5)
    report = judge(cluster)
    old = next(term for term in report.terms if term.pid == injected.child_pid)
    successor = next(term for term in report.terms if term.start > injected.t)
    assert successor.token > old.token and old.end < successor.start
    quiet = [
        line
        for node in cluster.nodes
        for line in node.daemon.log_lines()
        if line.get("event") == "quiet_period"
    ]
    assert quiet, "no replica reported the quiet period after the data loss"


def test_a_follower_cut_off_does_not_disturb_the_leader(cluster: Cluster) -> None:
    wait_for_writes(cluster)
    injected = faults.cut_follower(cluster, seconds=2 * TTL_S)
    time.sleep(TTL_S)
    found = cluster.leader()
    assert found is not None and found[1] == injected.child_pid
    report = judge(cluster)
    assert len([t for t in report.terms if t.start < injected.t + 3 * TTL_S]) == 1, report.explain()


@pytest.mark.timeout(40)
def test_an_unresolvable_redis_host_keeps_the_daemon_up_not_leading_and_saying_why(tmp_path: Path) -> None:
    journal = tmp_path / "child-x.jsonl"
    daemon = DaemonProcess(
        redis_url="redis://no-such-host.invalid:6379/0",
        identity="x",
        log_dir=tmp_path,
        ttl="2s",
        extra_args=(
            "--",
            sys.executable,
            str(CHILD),
            "--journal",
            str(journal),
            "--resource-url",
            "redis://127.0.0.1:1/0",
            "--key",
            RESOURCE_KEY,
        ),
    ).start()
    try:
        daemon.wait_http()
        time.sleep(3 * TTL_S)
        assert daemon.process is not None and daemon.process.poll() is None, daemon.logs_text()
        assert daemon.get("/healthz")[0] == 200  # an outage is not a reason to restart the pod
        status, body = daemon.get("/readyz")
        assert status == 503, body
        leader = daemon.leader()
        assert leader is not None and leader["is_leader"] is False
        assert "elector_redis_up" in daemon.metrics()
        assert [line for line in daemon.metrics().splitlines() if line.startswith("elector_redis_up{")] == [
            'elector_redis_up{lock="jobs"} 0.0'
        ]
        unreachable = [line for line in daemon.log_lines() if line.get("event") == "redis_unreachable"]
        assert len(unreachable) == 1, unreachable  # said once, not once per retry
        assert "no-such-host.invalid" in json.dumps(unreachable[0]) or unreachable[0].get("error"), (
            unreachable
        )
        assert not journal.exists()  # the command never ran
    finally:
        daemon.stop()
