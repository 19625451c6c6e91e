"""Sentinel failovers under real exec-mode daemons: planned, and forced by a SIGKILL of the master.

The daemons use a redis+sentinel:// URL (tests/support/sentinel.py starts the master, two
replicas and three sentinels). Replication is asynchronous, so a failover may lose the lease
key: then the promoted replica's other run_id starts a quiet period of one ttl, and the old
leader's next renewal finds its key gone. Either way: never two leaders, tokens increasing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.sentinel import SentinelSet

from . import faults
from .harness import Cluster
from .test_scenarios import TTL_S, judge

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def sentinel_cluster(tmp_path: Path, deployment: SentinelSet) -> Iterator[Cluster]:
    """The fault suite's daemons on a fresh Sentinel deployment (each test fails it over)."""
    with Cluster(tmp_path / "run", ttl_s=TTL_S, sentinel=deployment) as c:
        yield c


@pytest.mark.parametrize("kill_master", [False, True], ids=["planned", "sigkill-master"])
def test_a_sentinel_failover_never_gives_two_leaders(sentinel_cluster: Cluster, kill_master: bool) -> None:
    cluster = sentinel_cluster
    time.sleep(0.5)
    injected, new_master = faults.sentinel_failover(cluster, kill_master=kill_master)
    done = time.monotonic()
    assert cluster.sentinel is not None and cluster.sentinel.master_address() == new_master
    cluster.wait_for_leader(timeout_s=4 * TTL_S + 10)  # the old term, or a new one after the quiet ttl
    time.sleep(TTL_S)
    _, child = cluster.wait_for_leader(timeout_s=4 * TTL_S + 10)
    report = judge(cluster)
    (last,) = [term for term in report.terms if term.pid == child]
    assert last.end > done + TTL_S, report.explain()  # a leader working on the new master
    assert injected.kind in report.fault_counts()
