"""Rolling upgrades: the previous release and the current code on one lock, under faults.

A Deployment rollout runs old and new replicas side by side for minutes, so the two must agree on
who leads. Two daemons of the previous release (tests/support/previous_release.py, built from the
repository's history) and two of the current code run in exec mode on one lock; the leader is
SIGKILLed, SIGTERMed, the lock Redis restarts empty, and `elector handoff` (of either release) asks
for a handover. A replica that dies comes back as the same release, so the fleet stays 2 + 2.
Faults go on (bounded) until every pairing has taken over from the other: old->new, new->old,
old->old, new->new; targeted handoffs steer towards a pairing still missing. Then the old pods are
replaced one by one as a Deployment does it: start a new pod, wait until it is ready, SIGTERM an
old one (the old leader first).

Safety is judged on the workers' own journals (checker.py): no overlapping terms, tokens strictly
increasing, no stale fenced write accepted. `elector status` of either release must name the
leader whose command runs, with its token, and list every live replica as a candidate; every
replica's `--leader-file` must show that leader and token, with all the fields 0.1.0 wrote. The
figures line is printed with the fault summaries.

A "current" release that used other keys than the previous one (a stand-in for a protocol change
that breaks compatibility) fails this test with overlapping terms: checked once by hand.

The second test pins down one interaction the mix can only hit by chance: an empty restart won by
the previous release, then a handoff to a current daemon.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from elector.testing.redis_server import RedisServerProcess
from tests.support.daemon import DaemonProcess, wait_until
from tests.support.previous_release import PreviousRelease
from tests.support.seed import seed_used_lock

from . import faults
from .checker import Report, Term, check
from .conftest import SUMMARIES
from .harness import LOCK, Cluster, Node, terminate, wait_ready

# A hang guard, not a budget: a run takes 25-60 s on 2 busy cores (build, faults, rollout, stop).
pytestmark = pytest.mark.timeout(240)

TTL_S = 2.0
OLD, NEW = "old", "new"
DIRECTIONS = ((OLD, NEW), (NEW, OLD), (OLD, OLD), (NEW, NEW))
#: Every kind once first, in this order; then handoffs steered at the pairings still missing.
FIRST_FAULTS = ("kill_leader", "handoff", "term_leader", "redis_restart", "handoff")
#: At most this many faults in the mixed phase: 4 steps cover any missing pairing from any leader.
MAX_FAULTS = len(FIRST_FAULTS) + 8
#: The leader file's fields in 0.1.0: later releases may add fields, never drop these.
LEADER_FILE_FIELDS = frozenset({"lock", "identity", "is_leader", "fencing_token", "holder",
                                "holder_fencing_token", "state", "updated_at"})  # fmt: skip
#: The daemons' log events (and their fields) that tell the story of a failure.
STORY_EVENTS = frozenset({"acquired", "released", "stepped_down", "quiet_period", "new_leader_observed"})
STORY_FIELDS = ("reason", "remaining_ms", "holder", "fencing_token")
#: A takeover after a kill waits out the ttl; after an empty Redis restart also the quiet period.
TAKEOVER_TIMEOUT_S = 10 + 4 * TTL_S
#: Times `check_status` is repeated when the leader changed while it ran (see there).
STATUS_ATTEMPTS = 3


class MixedFleet(Cluster):
    """A Cluster whose replicas run either release; the first four are old, new, old, new."""

    def __init__(self, directory: Path, *, previous: PreviousRelease) -> None:
        self.programs: dict[str, tuple[str, ...] | None] = {OLD: previous.elector, NEW: None}
        self.release_of: dict[str, str] = {}
        self.leader_file_of: dict[str, Path] = {}
        self._initial = [OLD, NEW, OLD, NEW]
        super().__init__(directory, ttl_s=TTL_S, size=len(self._initial))

    def add_node(
        self, *, wait: bool = True, program: tuple[str, ...] | None = None, release: str | None = None
    ) -> Node:
        if release is None:
            release = self._initial.pop(0) if self._initial else NEW
        leader_file = self.directory / f"leader-file-{len(self.leader_file_of) + 1}.json"
        node = super().add_node(
            wait=wait,
            program=self.programs[release] if program is None else program,
            options=("--leader-file", str(leader_file)),
        )
        self.release_of[node.identity] = release
        self.leader_file_of[node.identity] = leader_file
        return node

    def live(self, release: str) -> list[Node]:
        return [node for node in self.nodes if self.release_of[node.identity] == release]

    def cli(self, release: str) -> tuple[str, ...]:
        return self.programs[release] or (sys.executable, "-m", "elector")

    def handovers(self) -> list[tuple[str, str]]:
        """Directions of the handovers so far: consecutive terms (children) of different replicas."""
        self._scan()
        starts = sorted((record["t"], record["identity"]) for record in self.starts.values())
        return [
            (self.release_of[a], self.release_of[b])
            for (_, a), (_, b) in itertools.pairwise(starts)
            if a != b
        ]


def _record_fault(cluster: Cluster, kind: str, *, node: Node, child_pid: int | None, takeover: bool) -> float:
    t = time.monotonic()
    cluster.journal.append(
        "fault", fault=kind, t=t, target=node.identity, target_pid=child_pid,
        excuse_s=0.0, takeover=takeover,
    )  # fmt: skip
    return t


def handoff(cluster: MixedFleet, *, to: Node | None, via: str) -> tuple[Node, int]:
    """`elector handoff` of release `via`; returns the old leader and its child's pid."""
    node, child = cluster.wait_for_leader(timeout_s=TAKEOVER_TIMEOUT_S)
    _record_fault(cluster, "handoff", node=node, child_pid=child, takeover=True)
    argv = [
        *cluster.cli(via), "handoff", "--redis-url", cluster.lock_redis.url, "--lock", LOCK,
        "--timeout", "20s", "--window", f"{round(2 * TTL_S)}s",
        *(["--to", to.identity] if to is not None else []),
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, (
        f"{via} `elector handoff` from {node.identity} ({cluster.release_of[node.identity]}) to "
        f"{to.identity if to else 'anyone'} exited {done.returncode}:\n{done.stdout}{done.stderr}"
        f"{story(cluster)}"
    )
    return node, child


def story(cluster: MixedFleet, *, last: int = 40) -> str:
    """The daemons' lease events on one (wall) clock, for a failure message: who did what, when."""
    rows = sorted(
        ((str(line.get("timestamp")), node, line) for node in cluster.nodes + cluster.retired
         for line in node.daemon.log_lines() if line.get("event") in STORY_EVENTS),
        key=lambda row: row[0],
    )  # fmt: skip
    text = [
        f"{at[11:23]} {node.identity} ({cluster.release_of[node.identity]}) {line['event']} "
        + " ".join(f"{key}={line[key]}" for key in STORY_FIELDS if key in line)
        for at, node, line in rows[-last:]
    ]
    return "\nlast lease events:\n" + "\n".join(text)


def check_status(cluster: MixedFleet) -> None:
    """`elector status` of either release names the leader whose command runs, with its token,
    and lists every live replica (of either release) as a candidate; every replica's leader file
    shows the same leader and token, with at least the fields 0.1.0 wrote (what readers rely on)."""
    # The check needs one leader throughout. At a load average of 10 (`make test-loaded`, run #21)
    # the two CLIs took seconds and the 2 s-ttl leader stepped down between them (no fault, no
    # overlap): a check that saw a takeover during it is repeated, up to STATUS_ATTEMPTS times.
    for attempt in range(1, STATUS_ATTEMPTS + 1):
        leader, child = cluster.wait_for_leader(timeout_s=TAKEOVER_TIMEOUT_S)
        token = int(cluster.starts[child]["token"])
        documents: dict[str, dict[str, Any]] = {}
        for via in (OLD, NEW):
            argv = [
                *cluster.cli(via),
                "status",
                "--redis-url",
                cluster.lock_redis.url,
                "--lock",
                LOCK,
                "--json",
            ]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
            assert done.returncode == 0, f"{via} `elector status` exited {done.returncode}:\n{done.stderr}"
            documents[via] = json.loads(done.stdout)
        if attempt < STATUS_ATTEMPTS and cluster.wait_for_leader(timeout_s=TAKEOVER_TIMEOUT_S)[1] != child:
            continue
        break
    for via, document in documents.items():
        assert (document["holder"], document["fencing_token"]) == (leader.identity, token), (
            via, document, story(cluster),
        )  # fmt: skip
        listed = {candidate["identity"] for candidate in document["candidates"]}
        assert {node.identity for node in cluster.nodes} <= listed, (via, document)
    for node in cluster.nodes:  # followers see the new holder at their next look: wait for that
        expected = {"is_leader": node is leader, "holder": leader.identity, "holder_fencing_token": token}
        if node is leader:
            expected["fencing_token"] = token
        deadline = time.monotonic() + 3 * TTL_S + 5
        shown = _leader_file(cluster, node)
        while shown is None or any(shown.get(key) != value for key, value in expected.items()):
            assert time.monotonic() < deadline, (cluster.release_of[node.identity], shown, expected)
            time.sleep(0.05)
            shown = _leader_file(cluster, node)
        assert shown.keys() >= LEADER_FILE_FIELDS, (cluster.release_of[node.identity], shown)


def _leader_file(cluster: MixedFleet, node: Node) -> dict[str, Any] | None:
    try:
        document: dict[str, Any] = json.loads(cluster.leader_file_of[node.identity].read_text())
    except (OSError, ValueError):
        return None
    return document


def _steer(cluster: MixedFleet, leader: Node, missing: set[tuple[str, str]]) -> Node:
    """The handoff target that makes a missing pairing happen now, or leads to one next time."""
    here = cluster.release_of[leader.identity]
    wanted = sorted(to for frm, to in missing if frm == here)
    if not wanted:  # no missing pairing starts here: hand over to a release where one does
        wanted = sorted(frm for frm, _ in missing)
    return next(node for node in cluster.live(wanted[0]) if node is not leader)


def _replace_dead(cluster: MixedFleet) -> None:
    """The pod comes back as the same release (a new name), so the fleet stays 2 old + 2 new."""
    for release in (OLD, NEW):
        while len(cluster.live(release)) < 2:
            cluster.add_node(release=release)


def _inject(cluster: MixedFleet, kind: str, *, count: int) -> None:
    missing = set(DIRECTIONS) - set(cluster.handovers())
    if kind == "kill_leader":
        child = faults.kill_leader(cluster).child_pid
    elif kind == "term_leader":
        injected, code = faults.term_leader(cluster)
        assert code == 0, injected.node.daemon.logs_text()[-3000:]
        child = injected.child_pid
    elif kind == "redis_restart":
        child = faults.redis_restart(cluster).child_pid
    elif kind == "handoff":
        leader, _ = cluster.wait_for_leader(timeout_s=TAKEOVER_TIMEOUT_S)
        target = _steer(cluster, leader, missing) if count >= len(FIRST_FAULTS) else None
        via = (OLD, NEW)[count % 2]  # either release's CLI asks either release's leader
        _, child = handoff(cluster, to=target, via=via)
        if target is not None:
            node, _ = cluster.wait_for_leader(timeout_s=TAKEOVER_TIMEOUT_S, not_pid=child)
            assert node is target, f"handed to {target.identity}, {node.identity} leads{story(cluster)}"
    else:
        raise ValueError(f"unknown fault {kind!r}")
    cluster.wait_for_leader(timeout_s=TAKEOVER_TIMEOUT_S, not_pid=child)


def _roll(cluster: MixedFleet) -> None:
    """Replace every old pod as a Deployment does: new pod up and ready, then SIGTERM an old one.

    The leading old pod goes first; if no old pod leads yet, a handoff makes one lead, so that at
    least one SIGTERM of the rollout hits a leader (its release is then a handover too)."""
    rolled_a_leader = False
    while cluster.live(OLD):
        new = cluster.add_node(release=NEW)
        wait_ready(new)
        leader, child = cluster.wait_for_leader(timeout_s=TAKEOVER_TIMEOUT_S)
        olds = cluster.live(OLD)
        if not rolled_a_leader and leader not in olds:
            _, previous = handoff(cluster, to=olds[0], via=NEW)
            leader, child = cluster.wait_for_leader(timeout_s=TAKEOVER_TIMEOUT_S, not_pid=previous)
            time.sleep(0.3 * TTL_S)
        old = leader if leader in olds else olds[0]
        leading = old is leader
        rolled_a_leader = rolled_a_leader or leading
        _record_fault(cluster, "rollout", node=old, child_pid=child if leading else None, takeover=leading)
        terminate(
            cluster, old, leader_child=child if leading else None, takeover_timeout_s=TAKEOVER_TIMEOUT_S
        )
        time.sleep(0.3 * TTL_S)


def takeovers_by_direction(report: Report, release_of: dict[str, str]) -> dict[tuple[str, str], list[float]]:
    """Seconds from the fault that caused each handover to the successor's start, by direction.

    A handover is two consecutive terms of different replicas; its cause is the last fault after
    the older term began (without one, the gap between the terms counts)."""
    result: dict[tuple[str, str], list[float]] = {direction: [] for direction in DIRECTIONS}
    terms: list[Term] = report.terms
    for older, newer in itertools.pairwise(terms):
        if older.identity == newer.identity:
            continue
        causes = [f.t for f in report.faults if older.start <= f.t <= newer.start]
        seconds = newer.start - (max(causes) if causes else older.end)
        result[(release_of[older.identity], release_of[newer.identity])].append(seconds)
    return result


def _figures(report: Report, by_direction: dict[tuple[str, str], list[float]], *, title: str) -> str:
    def times(values: list[float]) -> str:
        if not values:
            return "0"
        ordered = sorted(values)
        return f"{len(values)} (p50 {ordered[(len(ordered) - 1) // 2]:.2f}s, max {ordered[-1]:.2f}s)"

    kinds = " ".join(f"{kind}={n}" for kind, n in sorted(report.fault_counts().items()))
    directions = ", ".join(f"{a}->{b} {times(by_direction[(a, b)])}" for a, b in DIRECTIONS)
    return (
        f"{title}: faults {sum(report.fault_counts().values())} ({kinds}); takeovers {directions}; "
        f"overlaps {len(report.overlaps)}, token order violations {len(report.token_violations)}, "
        f"stale writes accepted {len(report.fence_violations)}; {len(report.terms)} terms, "
        f"fenced writes accepted/rejected {report.writes_accepted}/{report.writes_rejected}"
    )


def test_previous_and_current_release_agree_on_one_leader_through_faults_and_a_rollout(
    previous_release: PreviousRelease, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    directory = tmp_path / "run"
    started = time.monotonic()
    count = 0
    with MixedFleet(directory, previous=previous_release) as cluster:
        while count < MAX_FAULTS:
            missing = set(DIRECTIONS) - set(cluster.handovers())
            if count >= len(FIRST_FAULTS) and not missing:
                break
            _replace_dead(cluster)
            cluster.wait_for_leader(timeout_s=TAKEOVER_TIMEOUT_S)
            time.sleep(0.3 * TTL_S)  # the leader's child makes a few fenced writes
            _inject(cluster, FIRST_FAULTS[count] if count < len(FIRST_FAULTS) else "handoff", count=count)
            count += 1
        _replace_dead(cluster)
        time.sleep(0.5 * TTL_S)  # a replacement registers as a candidate at its first attempt
        check_status(cluster)
        _roll(cluster)
        cluster.wait_for_leader(timeout_s=TAKEOVER_TIMEOUT_S)
        time.sleep(0.3 * TTL_S)
        assert {cluster.release_of[n.identity] for n in cluster.nodes} == {NEW}
        check_status(cluster)
        cluster.stop()
        release_of = dict(cluster.release_of)
        lease_story = story(cluster, last=80)
    report = check(directory)
    by_direction = takeovers_by_direction(report, release_of)
    build = "cached" if previous_release.build_s is None else f"built in {previous_release.build_s:.1f}s"
    title = (
        f"mixed fleet ({previous_release.version} at {previous_release.commit[:7]} ({build}) x2 + "
        f"current x2, rollout to current, ttl {TTL_S}s, {time.monotonic() - started:.0f}s wall)"
    )
    figures = _figures(report, by_direction, title=title)
    print(figures)
    (directory / "summary.txt").write_text(figures + "\n")
    request.config.stash.setdefault(SUMMARIES, []).append(figures)

    assert report.violations == 0, f"{figures}\n{report.explain()}{lease_story}"
    assert report.writes_accepted > 0, report.explain()
    assert report.covered_overlaps == [], report.explain()  # nothing was paused: no excuse applies
    counts = report.fault_counts()
    for kind in (*FIRST_FAULTS, "rollout"):
        assert counts[kind] >= 1, figures
    assert all(by_direction[direction] for direction in DIRECTIONS), (
        f"{figures}\n{report.explain()}{lease_story}"
    )
    rollout = [f for f in report.faults if f.kind == "rollout" and f.expects_takeover]
    assert rollout, f"the rollout never terminated a leading old pod\n{figures}"


@pytest.mark.timeout(90)
def test_a_handoff_to_current_after_a_restart_won_by_the_previous_release_costs_no_quiet_period(
    previous_release: PreviousRelease, tmp_path: Path
) -> None:
    """The restart's quiet period is served once. A current daemon that saw the meta hash before the
    restart must not start another one when the old release's leader later hands over to it: that
    quiet period would outlast the handoff's window (one ttl), after which anyone may win."""
    logs = tmp_path / "logs"
    logs.mkdir()
    with RedisServerProcess() as server:
        with redis.Redis.from_url(server.url) as client:
            seed_used_lock(client, LOCK)
        new = DaemonProcess(redis_url=server.url, identity="new-c", log_dir=logs, ttl="2s")
        old = DaemonProcess(redis_url=server.url, identity="old-a", log_dir=logs, ttl="2s")
        old.command[:3] = previous_release.elector
        try:
            new.start().wait_http(timeout_s=20)
            wait_until(new.is_leader, timeout_s=15)  # its grant writes the meta hash; it remembers it
            old.start().wait_http(timeout_s=20)
            _cli_handoff(server.url, to="old-a")
            token = _token(old)
            os.kill(_pid(new), signal.SIGSTOP)  # so that the previous release wins after the restart
            try:
                server.restart_empty()
                wait_until(lambda: _token(old) not in (None, token), timeout_s=20)  # a grant after it
            finally:
                os.kill(_pid(new), signal.SIGCONT)
            wait_until(lambda: (new.leader() or {}).get("holder_fencing_token") == _token(old), timeout_s=20)
            quiet_before = _quiet_periods(new, old)
            done = _cli_handoff(server.url, to="new-c", check=False)
            holder = (new.leader() or {}).get("holder")
            quiet_after = _quiet_periods(new, old)
        finally:
            new.stop()
            old.stop()
    assert quiet_after == quiet_before, (
        "a quiet period started during the handoff (the restart's was already served):\n"
        + "\n".join(json.dumps(line) for line in quiet_after[len(quiet_before) :])
    )
    assert done.returncode == 0 and holder == "new-c", f"{done.stdout}{done.stderr}holder: {holder}"


def _token(daemon: DaemonProcess) -> int | None:
    """The daemon's own fencing token while it leads, else None."""
    shown = daemon.leader() or {}
    return shown.get("fencing_token") if shown.get("is_leader") else None


def _pid(daemon: DaemonProcess) -> int:
    assert daemon.process is not None
    return daemon.process.pid


def _quiet_periods(*daemons: DaemonProcess) -> list[dict[str, Any]]:
    """The quiet periods the daemons reported so far, oldest first."""
    lines = [line for daemon in daemons for line in daemon.log_lines() if line.get("event") == "quiet_period"]
    return sorted(lines, key=lambda line: str(line.get("timestamp")))


def _cli_handoff(url: str, *, to: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "elector", "handoff", "--redis-url", url, "--lock", LOCK, "--to", to,
            "--timeout", "10s", "--window", f"{round(2 * TTL_S)}s"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert not check or done.returncode == 0, f"{done.stdout}{done.stderr}"
    return done
