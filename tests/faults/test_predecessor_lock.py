"""A lock renamed by an upgrade: the previous release on the old name, the current code on the new.

Chart 0.1.0 named the lock `<release>-elector`; chart 0.2.0 names it `<namespace>/<release>-elector`,
and passes the old name as `--predecessor-lock`. Daemons of the previous release
(tests/support/previous_release.py, built from the repository's history) on `jobs-elector` and of
the current code on `apps/jobs-elector` go through a rolling replacement as a Deployment does it
(a new pod up and ready, then SIGTERM to an old one, the leading one first), and then through the
rollback (the same, in the other direction). Safety is judged on the workers' own journals
(checker.py): no two leaders' terms overlap, tokens strictly increase, no stale fenced write lands.

Without the setting the same rollout runs two leaders: the second test shows the overlap.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from tests.support.previous_release import PreviousRelease
from tests.support.seed import seed_used_lock

from .checker import Report, check
from .conftest import SUMMARIES
from .harness import Cluster, Node, terminate, wait_ready

# A hang guard, not a budget: a run takes 20-40 s on 2 busy cores.
pytestmark = pytest.mark.timeout(240)

TTL_S = 2.0
OLD, NEW = "old", "new"
#: Chart 0.1.0's default lock for release `jobs`, and chart 0.2.0's in namespace `apps`.
OLD_LOCK, NEW_LOCK = "jobs-elector", "apps/jobs-elector"
#: A takeover after a SIGTERM is immediate; this bounds a hang on a loaded machine.
TAKEOVER_TIMEOUT_S = 10 + 4 * TTL_S


class RenameFleet(Cluster):
    """Replicas of the previous release on OLD_LOCK and of the current code on NEW_LOCK."""

    def __init__(self, directory: Path, *, previous: PreviousRelease, predecessor: bool) -> None:
        self.previous = previous
        self.predecessor = predecessor
        self.release_of: dict[str, str] = {}
        self._seeded = False
        super().__init__(directory, ttl_s=TTL_S, size=2)  # start() adds two replicas: old ones

    def add_node(  # type: ignore[override]
        self, *, wait: bool = True, release: str = OLD, **_: object
    ) -> Node:
        if not self._seeded:  # both names used before: no quiet period of a new lock
            with redis.Redis.from_url(self.lock_redis.url) as client:
                seed_used_lock(client, OLD_LOCK)
                seed_used_lock(client, NEW_LOCK)
            self._seeded = True
        if release == OLD:
            node = super().add_node(wait=wait, program=self.previous.elector, lock=OLD_LOCK)
        else:
            options = ("--predecessor-lock", OLD_LOCK) if self.predecessor else ()
            node = super().add_node(wait=wait, options=options, lock=NEW_LOCK)
        self.release_of[node.identity] = release
        return node

    def live(self, release: str) -> list[Node]:
        return [node for node in self.nodes if self.release_of[node.identity] == release]


def roll(cluster: RenameFleet, *, to: str) -> None:
    """Replace every pod of the other release by one of `to`, as a Deployment does it."""
    going = NEW if to == OLD else OLD
    while cluster.live(going):
        node = cluster.add_node(release=to)
        wait_ready(node)
        time.sleep(0.5 * TTL_S)  # the new pod contends for a while beside the old leader
        leader, child = cluster.wait_for_leader(timeout_s=TAKEOVER_TIMEOUT_S)
        candidates = cluster.live(going)
        victim = leader if leader in candidates else candidates[0]
        leading = victim is leader
        cluster.journal.append(
            "fault", fault="rollout", t=time.monotonic(), target=victim.identity,
            target_pid=child if leading else None, excuse_s=0.0, takeover=leading,
        )  # fmt: skip
        terminate(
            cluster, victim, leader_child=child if leading else None, takeover_timeout_s=TAKEOVER_TIMEOUT_S
        )
        time.sleep(0.3 * TTL_S)


def run_rename(
    previous: PreviousRelease, directory: Path, *, predecessor: bool, rollback: bool
) -> tuple[Report, dict[str, str]]:
    """The journals' verdict, and the release of each replica."""
    with RenameFleet(directory, previous=previous, predecessor=predecessor) as cluster:
        time.sleep(0.3 * TTL_S)  # the old leader's child makes a few fenced writes
        roll(cluster, to=NEW)
        assert {cluster.release_of[n.identity] for n in cluster.nodes} == {NEW}
        if rollback:
            roll(cluster, to=OLD)
            assert {cluster.release_of[n.identity] for n in cluster.nodes} == {OLD}
        cluster.wait_for_leader(timeout_s=TAKEOVER_TIMEOUT_S)
        time.sleep(0.3 * TTL_S)
        cluster.stop()
        release_of = dict(cluster.release_of)
    return check(directory), release_of


def _figures(report: Report, *, title: str) -> str:
    return (
        f"{title}: faults {sum(report.fault_counts().values())}; overlaps {len(report.overlaps)}, "
        f"token order violations {len(report.token_violations)}, stale writes accepted "
        f"{len(report.fence_violations)}; {len(report.terms)} terms, fenced writes accepted/rejected "
        f"{report.writes_accepted}/{report.writes_rejected}"
    )


def test_a_rename_with_the_predecessor_keeps_one_leader_through_a_rollout_and_a_rollback(
    previous_release: PreviousRelease, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    started = time.monotonic()
    report, release_of = run_rename(previous_release, tmp_path / "run", predecessor=True, rollback=True)
    title = (
        f"lock rename ({previous_release.version} on {OLD_LOCK} x2 -> current on {NEW_LOCK} with "
        f"--predecessor-lock x2 -> back, ttl {TTL_S}s, {time.monotonic() - started:.0f}s wall)"
    )
    figures = _figures(report, title=title)
    print(figures)
    request.config.stash.setdefault(SUMMARIES, []).append(figures)
    assert report.violations == 0, f"{figures}\n{report.explain()}"
    assert report.covered_overlaps == [], report.explain()  # nothing was paused: no excuse applies
    assert report.writes_accepted > 0, report.explain()
    releases = [release_of[term.identity] for term in report.terms]
    # Leadership went from the old release to the new and back.
    assert releases[0] == OLD and NEW in releases and releases[-1] == OLD, (releases, report.explain())
    rollout = [f for f in report.faults if f.kind == "rollout" and f.expects_takeover]
    assert len(rollout) >= 2, f"the rollouts never terminated a leader\n{figures}"


def test_without_the_predecessor_the_same_rollout_runs_two_leaders(
    previous_release: PreviousRelease, tmp_path: Path
) -> None:
    """The trap the setting closes: the new pod leads the new lock while the old leader works on."""
    report, _ = run_rename(previous_release, tmp_path / "run", predecessor=False, rollback=False)
    assert report.overlaps, report.explain()
