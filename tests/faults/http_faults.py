"""The HTTP attacker as a fault of the random mix: one attack at a time on the current leader.

The mix draws the kind `http_attack` like any other; `HttpAttacks.inject` then runs the next
attack of tests/faults/http_attacker.py in turn (so a long mix goes through all of them) for
`seconds` against the leader's HTTP port, measured by tests/faults/http_measure.py. An attack is
journaled as a fault that expects no takeover and excuses no gap: the leader must ride it out.
In the soak profile `run_missing` then runs every attack the draw did not reach, so that each
one ran at least once, for at least 10 s, during the soak.

What the mix asserts (`lease_problems`): no lease lost, no step-down, no renewal gap beyond the
renew interval plus one request timeout, the leader's child still the newest term; unless the
gaps stayed within the machine's measured lateness and a witness the attack cannot reach stalled
too (`Figures.loss_excuse`: the machine ended the term). The probes'
share and the memory are kept in the summary (the regular suite's tests/daemon/test_http_attacks.py
asserts them).
"""

from __future__ import annotations

import time

from elector.election import ElectionTiming

from .harness import LOCK, Cluster, Node
from .http_attacker import ATTACKS
from .http_measure import Figures, NotTheHolder, Target, measure_attack

HTTP_ATTACK = "http_attack"
#: Each attack's length: the issue asks for at least 10 s in the soak; CI's short mix has 40 s in all.
SOAK_ATTACK_S = 10.0
SHORT_ATTACK_S = 3.0
#: Tries to find a leader that holds the lease on Redis (a takeover may be under way).
ATTEMPTS = 5


def http_sweep_s(profile_name: str) -> float:
    """The longest `run_missing` can take: every attack, with the wait for a leader and the tail."""
    return len(ATTACKS) * (SOAK_ATTACK_S + 15) if profile_name == "soak" else 0.0


class HttpAttacks:
    """The attacks in turn, and the figures of every run."""

    def __init__(self, *, seconds: float) -> None:
        self.seconds = seconds
        self.runs: list[Figures] = []
        #: (attack, what went wrong) of runs whose leader's child did not stay the newest term.
        self.lost_terms: list[tuple[str, str]] = []
        self._order = sorted(ATTACKS)

    @classmethod
    def for_profile(cls, profile_name: str) -> HttpAttacks:
        return cls(seconds=SOAK_ATTACK_S if profile_name == "soak" else SHORT_ATTACK_S)

    def inject(self, cluster: Cluster) -> None:
        attack = self._order[len(self.runs) % len(self._order)]
        for _ in range(ATTEMPTS):
            node, child = cluster.wait_for_leader(timeout_s=10 + 3 * cluster.ttl_s)
            target = Target(
                leader=node.daemon,
                others=tuple(n.daemon for n in cluster.nodes if n is not node),
                redis_url=cluster.lock_redis.url,
                lock=LOCK,
                timing=ElectionTiming.from_ttl(cluster.ttl_s),
            )

            # The newest term as the attack starts: what it must not end. The child found above
            # can be a moment stale on a loaded machine (a takeover by the same node whose new
            # child had not journaled yet: seen in a loaded soak), so it is read again then.
            at_start: list[tuple[Node, int]] = []

            def journal(
                node: Node = node, child: int = child, at_start: list[tuple[Node, int]] = at_start
            ) -> None:
                found = cluster.leader()
                at_start.append(found if found is not None else (node, child))
                cluster.journal.append(
                    "fault", fault=HTTP_ATTACK, t=time.monotonic(), target=at_start[0][0].identity,
                    target_pid=at_start[0][1], excuse_s=0.0, takeover=False, attack=attack,
                )  # fmt: skip

            try:
                figures = measure_attack(target, attack=attack, seconds=self.seconds, on_start=journal)
            except NotTheHolder:
                # The previous fault's takeover is still under way: the newest child's node does
                # not hold the lease yet. Not the attack's doing; wait for the dust to settle.
                time.sleep(cluster.ttl_s)
                continue
            self.runs.append(figures)
            if at_start:
                node, child = at_start[0]
            found = cluster.leader()
            # A term the machine ended (see Figures.load_explains_loss) is not the attack's loss.
            if (found is None or found[1] != child) and not figures.load_explains_loss:
                now = "none" if found is None else f"{found[0].identity}'s child {found[1]}"
                self.lost_terms.append(
                    (attack, f"{node.identity}'s child {child} no longer the newest term ({now})")
                )
            return
        raise AssertionError(f"no node held the lease as its child's term began, {ATTEMPTS} times")

    def run_missing(self, cluster: Cluster) -> None:
        """Run every attack that has not run yet (the soak runs them all)."""
        while len({figures.attack for figures in self.runs}) < len(self._order):
            cluster.wait_for_leader(timeout_s=10 + 4 * cluster.ttl_s)
            self.inject(cluster)

    def lease_problems(self) -> list[str]:
        found = [
            f"{figures.attack}: {problem}" for figures in self.runs for problem in figures.lease_problems()
        ]
        return found + [f"{attack}: {problem}" for attack, problem in self.lost_terms]

    def summary(self) -> str:
        lines = [f"{'http attacks (' + format(self.seconds, 'g') + ' s each)':<35}{len(self.runs)}"]
        for figures in self.runs:
            lines.append(
                f"  {figures.attack:<20} gap max {figures.max_gap_s:.2f}s/{figures.allowed_gap_s:.2f}s, "
                f"lost {figures.leases_lost}, step-downs {figures.step_downs}, probes "
                f"{figures.probes_in_time}/{figures.probes}, RSS max {figures.rss_max_mib:.1f} MiB, "
                f"leader CPU {figures.leader_cpu_s:.1f}s, load {figures.load_average:.1f}"
                + (
                    f"; excused: {figures.loss_excuse}"
                    if figures.load_explains_loss and (figures.leases_lost or figures.step_downs)
                    else ""
                )
            )
            if figures.lease_problems() or figures.leases_lost or figures.step_downs:
                # Every witness and the leader's threads, for the run that lost or was excused.
                lines.append(f"    {figures.describe()}")
        return "\n".join(lines)
