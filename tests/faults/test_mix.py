"""The random mix: faults of every kind, one after another, on one cluster; the soak is a long mix.

Killed and terminated replicas are replaced, as Kubernetes would restart their pods, so three
replicas compete throughout. The seed is printed with the summary: `--faults-seed N` replays the
same sequence of faults (the timing of a busy machine, of course, does not replay).
"""

from __future__ import annotations

import contextlib
import random
import time
from pathlib import Path

import pytest

from tests.support.sentinel import SentinelSet

from . import faults
from .checker import check
from .conftest import SUMMARIES, Profile
from .harness import Cluster
from .http_faults import HTTP_ATTACK, HttpAttacks
from .summary import format_summary


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """The Sentinel-backed mix runs in the soak only: its failovers are in the short profile's
    scenarios (test_sentinel.py), and a second mix would not fit CI's few minutes."""
    if "backend" in metafunc.fixturenames:
        soak = metafunc.config.getoption("--faults-profile") == "soak"
        metafunc.parametrize("backend", ["plain", "sentinel"] if soak else ["plain"])


#: Relative weights: the faults that threaten safety most come up most often.
WEIGHTS = {
    "kill_leader": 3,
    "term_leader": 2,
    "pause_short": 2,
    "pause_long": 3,
    "cut_leader": 2,
    "blackhole_leader": 3,
    "slow_leader": 2,
    "redis_restart": 2,
    "cut_follower": 1,
    "kill_daemon": 2,
    "pause_daemon": 2,
    "block_loop": 2,
    "kill_keeper": 2,
    "kill_keeper_pause_daemon": 2,
    HTTP_ATTACK: 2,  # the leader must ride it out (tests/faults/http_faults.py)
}

#: With Sentinel the daemons talk to the sentinels directly: no proxy, so no link faults.
SENTINEL_WEIGHTS = {
    "kill_leader": 3,
    "term_leader": 2,
    "pause_short": 2,
    "pause_long": 3,
    "sentinel_failover": 2,
    "sentinel_kill_master": 2,
    "kill_daemon": 1,
    "pause_daemon": 1,
    "block_loop": 1,
    "kill_keeper": 1,
    "kill_keeper_pause_daemon": 1,
}


def node_options(slot: int) -> tuple[str, ...]:
    """Two replicas of three restart their command when it exits (`kill_keeper` is then
    `kill_keeper_restart`: the daemon keeps leading), the third releases."""
    return ("--on-child-exit", "restart") if slot < 3 else ()


def inject(cluster: Cluster, kind: str, rng: random.Random) -> faults.Injected | None:
    """Inject one fault; what was injected, for the daemon-only faults (their orphans are checked)."""
    ttl = cluster.ttl_s
    if kind == "kill_daemon":
        return faults.kill_daemon(cluster)
    if kind == "pause_daemon":
        return faults.pause_daemon(cluster, seconds=rng.uniform(1.2, 2.0) * ttl)
    if kind == "block_loop":
        return faults.block_loop(cluster)
    if kind == "kill_keeper":  # recorded as kill_keeper_restart or _release, after the leader's policy
        return faults.kill_keeper(cluster)
    if kind == "kill_keeper_pause_daemon":
        return faults.kill_keeper(cluster, then_pause_daemon_s=rng.uniform(1.2, 2.0) * ttl)
    if kind == "kill_leader":
        faults.kill_leader(cluster)
    elif kind == "term_leader":
        faults.term_leader(cluster)
    elif kind == "pause_short":
        faults.pause_leader(cluster, seconds=rng.uniform(0.02, 0.3) * ttl)
    elif kind == "pause_long":
        faults.pause_leader(cluster, seconds=rng.uniform(1.1, 2.0) * ttl, child_first=rng.random() < 0.5)
    elif kind in ("cut_leader", "blackhole_leader"):
        faults.link_fault(cluster, kind, seconds=rng.uniform(0.2, 1.5) * ttl)
    elif kind == "slow_leader":
        faults.link_fault(cluster, kind, seconds=rng.uniform(0.5, 1.5) * ttl, delay_s=rng.uniform(0.02, 0.25))
    elif kind == "redis_restart":
        faults.redis_restart(cluster)
    elif kind == "cut_follower":
        faults.cut_follower(cluster, seconds=rng.uniform(0.5, 2.0) * ttl)
    elif kind in ("sentinel_failover", "sentinel_kill_master"):
        faults.sentinel_failover(cluster, kill_master=kind == "sentinel_kill_master")
        faults.heal_sentinel(cluster)
    else:
        raise ValueError(f"unknown fault {kind!r}")
    return None


def test_random_mix_of_faults_never_gives_two_leaders(
    profile: Profile, tmp_path: Path, request: pytest.FixtureRequest, backend: str, redis_binary: str
) -> None:
    seed = profile.seed if profile.seed is not None else random.randrange(2**32)
    rng = random.Random(seed)
    by_kind = SENTINEL_WEIGHTS if backend == "sentinel" else WEIGHTS
    kinds, weights = list(by_kind), list(by_kind.values())
    mix_s = profile.mix_s / 2 if backend == "sentinel" else profile.mix_s
    directory = tmp_path / "run"
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        sentinel = None
        if backend == "sentinel":
            sentinel = stack.enter_context(SentinelSet(replicas=2, binary=redis_binary))
        cluster = stack.enter_context(
            Cluster(
                directory,
                ttl_s=profile.ttl_s,
                sentinel=sentinel,
                options_of=node_options,
                redis_binary=redis_binary,
            )
        )
        deadline = time.monotonic() + mix_s
        orphans: list[tuple[str, list[int]]] = []
        attacks = HttpAttacks.for_profile(profile.name)
        while time.monotonic() < deadline:
            while len(cluster.nodes) < cluster.size:  # the pod comes back, under a new name
                cluster.add_node()
            cluster.wait_for_leader(timeout_s=10 + 4 * cluster.ttl_s)
            time.sleep(rng.uniform(0.2, 1.0) * cluster.ttl_s)
            kind = rng.choices(kinds, weights)[0]
            if kind == HTTP_ATTACK:
                attacks.inject(cluster)
                continue
            injected = inject(cluster, kind, rng)
            if injected is not None:
                # Once another command runs, the faulted term's lease is over: nothing of its
                # command may run any more.
                cluster.wait_for_leader(timeout_s=10 + 4 * cluster.ttl_s, not_pid=injected.child_pid)
                if left := faults.orphans(injected):
                    orphans.append((injected.kind, left))
        if profile.name == "soak" and backend == "plain":
            attacks.run_missing(cluster)  # every HTTP attack, each for 10 s, during the soak
        cluster.wait_for_leader(timeout_s=10 + 4 * cluster.ttl_s)
        cluster.stop()
    report = check(directory)
    title = (
        f"fault mix ({backend} Redis, {profile.name} profile, {mix_s / 60:.1f} min of faults, "
        f"ttl {profile.ttl_s}s, seed {seed}, {time.monotonic() - started:.0f}s wall)"
    )
    table = format_summary(report, title=title) + f"\n{'orphans after daemon-only faults':<35}{len(orphans)}"
    table += f"\n{attacks.summary()}"
    (directory / "summary.txt").write_text(table + "\n")
    request.config.stash.setdefault(SUMMARIES, []).append(table)
    assert report.violations == 0, f"{table}\n{report.explain()}"
    assert orphans == [], f"{table}\nprocesses of a command outlived its lease: {orphans}"
    assert attacks.lease_problems() == [], f"{table}\nthe leader lost to HTTP: {attacks.lease_problems()}"
    # How many faults fit in the mix depends on how fast the machine recovers from each one; the
    # checker must have seen at least one (the loop always injects one before its deadline).
    assert report.faults, table
