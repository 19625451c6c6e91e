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
from .summary import format_summary

pytestmark = [pytest.mark.integration]


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
}

#: With Sentinel the daemons talk to the sentinels directly: no proxy, so no link faults.
SENTINEL_WEIGHTS = {
    "kill_leader": 3,
    "term_leader": 2,
    "pause_short": 2,
    "pause_long": 3,
    "sentinel_failover": 2,
    "sentinel_kill_master": 2,
}


def inject(cluster: Cluster, kind: str, rng: random.Random) -> None:
    ttl = cluster.ttl_s
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


def test_random_mix_of_faults_never_gives_two_leaders(
    profile: Profile, tmp_path: Path, request: pytest.FixtureRequest, backend: str
) -> None:
    seed = profile.seed if profile.seed is not None else random.randrange(2**32)
    rng = random.Random(seed)
    by_kind = SENTINEL_WEIGHTS if backend == "sentinel" else WEIGHTS
    kinds, weights = list(by_kind), list(by_kind.values())
    mix_s = profile.mix_s / 2 if backend == "sentinel" else profile.mix_s
    directory = tmp_path / "run"
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        sentinel = stack.enter_context(SentinelSet(replicas=2)) if backend == "sentinel" else None
        cluster = stack.enter_context(Cluster(directory, ttl_s=profile.ttl_s, sentinel=sentinel))
        deadline = time.monotonic() + mix_s
        while time.monotonic() < deadline:
            while len(cluster.nodes) < cluster.size:  # the pod comes back, under a new name
                cluster.add_node()
            cluster.wait_for_leader(timeout_s=10 + 4 * cluster.ttl_s)
            time.sleep(rng.uniform(0.2, 1.0) * cluster.ttl_s)
            inject(cluster, rng.choices(kinds, weights)[0], rng)
        cluster.wait_for_leader(timeout_s=10 + 4 * cluster.ttl_s)
        cluster.stop()
    report = check(directory)
    title = (
        f"fault mix ({backend} Redis, {profile.name} profile, {mix_s / 60:.1f} min of faults, "
        f"ttl {profile.ttl_s}s, seed {seed}, {time.monotonic() - started:.0f}s wall)"
    )
    table = format_summary(report, title=title)
    (directory / "summary.txt").write_text(table + "\n")
    request.config.stash.setdefault(SUMMARIES, []).append(table)
    assert report.violations == 0, f"{table}\n{report.explain()}"
    assert len(report.faults) >= 3, table
