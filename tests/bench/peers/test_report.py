"""The peers benchmark's pure parts: its table and ratio rows, its targets, the journal and
MONITOR attribution, the report's images and the plots (the processes are the bench's own run)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from bench.harness.common import BenchResult, Stats
from bench.harness.report import RunInfo, render_section
from bench.peers.probes import requests_of
from bench.peers.report import Outcome, results_table, targets
from bench.peers.trials import Idle, Line, read_journal

FLOOR = Stats.of([0.010, 0.010, 0.012])


def _outcome(key: str, *, handoff_ms: list[float], crash_ms: list[float], rate: float = 0.5) -> Outcome:
    return Outcome(
        key,
        key,
        crash=[ms / 1000 for ms in crash_ms],
        handoff=[ms / 1000 for ms in handoff_ms],
        idle=Idle(rate, 40.0, 0.1, "MONITOR, per client"),
    )


def _target(outcomes: list[Outcome], prefix: str) -> tuple[bool | None, str]:
    found = next(t for t in targets(outcomes, FLOOR) if t.what.startswith(prefix))
    return found.met, found.figure


def test_a_skipped_peer_is_a_row_with_its_reason_and_gets_no_ratio_row() -> None:
    elector = _outcome("elector", handoff_ms=[12, 14], crash_ms=[1800, 1900])
    etcd = _outcome("etcd", handoff_ms=[24, 30], crash_ms=[2000, 2400], rate=1.0)
    zk = Outcome("zookeeper", "zookeeper", skipped="java is not installed")

    rows = {row[0]: row for row in results_table([elector, etcd, zk], FLOOR).rows}

    assert rows["zookeeper"][1] == "skipped: java is not installed"
    assert "ratio elector / zookeeper" not in rows
    # median 13 / 27 = 0.48, p99 14 / 30 = 0.47; requests 0.5 / 1.0
    assert rows["ratio elector / etcd"][2] == "0.48 / 0.47"
    assert rows["ratio elector / etcd"][3] == "0.50"
    assert any(row[0].startswith("spawn floor") for row in rows.values())


def test_handoff_must_be_below_every_peer_in_both_percentiles() -> None:
    elector = _outcome("elector", handoff_ms=[20, 40], crash_ms=[1900])
    faster_p99 = _outcome("etcd", handoff_ms=[25, 35], crash_ms=[2000])
    slower = _outcome("redis-py", handoff_ms=[60, 100], crash_ms=[2000])

    met, figure = _target([elector, faster_p99, slower], "peers: handoff p50 and p99 below")

    assert met is False
    assert "not below etcd" in figure
    assert "redis-py" not in figure.split("not below", 1)[1]
    assert _target([elector, slower], "peers: handoff p50 and p99 below")[0] is True


def test_floor_relative_targets_and_missing_elector() -> None:
    # floor median 10 ms: p50 goal 16 ms, p99 goal 25 ms
    elector = _outcome("elector", handoff_ms=[15, 15, 26], crash_ms=[1900, 2100, 2300], rate=0.8)
    assert _target([elector], "peers: exec-mode handoff p50")[0] is True
    assert _target([elector], "peers: exec-mode handoff p99")[0] is False
    # The crash target is on the median (2100 ms > the 2 s ttl); a late p99 alone does not miss it.
    assert _target([elector], "peers: crash takeover p50")[0] is False
    elector.crash = [1.5, 1.9, 2.3]
    assert _target([elector], "peers: crash takeover p50")[0] is True
    assert _target([elector], "peers: idle waiter requests")[0] is False  # 0.8 > 1 / (2/3 * 2 s)

    skipped = Outcome("elector", "elector", skipped="could not start: boom")
    met, figure = _target([skipped], "peers: crash takeover p50")
    assert met is None
    assert "boom" in figure


def test_journal_lines_and_a_half_written_one(tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    journal.write_text("1700000000.250000 42 c1\n1700000001.5 43 c2\n1700000002")
    assert read_journal(journal) == [Line(1700000000.25, 42, "c1"), Line(1700000001.5, 43, "c2")]
    assert read_journal(tmp_path / "absent") == []


def test_monitor_counts_are_attributed_by_local_port_and_scripts_are_not_requests() -> None:
    counts = Counter({"127.0.0.1:5000": 3, "127.0.0.1:5001": 2, "[::1]:5002": 4, "lua": 9})
    assert requests_of(counts, {5000, 5002}) == 7
    assert requests_of(counts, set()) == 0


def test_a_section_shows_its_images_relative_to_the_docs(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    image = docs / "img" / "bench" / "peers-handoff.png"
    result = BenchResult("peers", "t", "m", images=[(image, "Graceful handoff")])
    run = RunInfo("python -m bench", "today", "quick", 1.0, {}, [])

    section = render_section(result, run, docs_dir=docs)

    assert "![Graceful handoff](img/bench/peers-handoff.png)" in section
