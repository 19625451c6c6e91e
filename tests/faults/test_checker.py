"""The checker on hand-written journals: it must see every overlap, regression and stale write."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .checker import check


class Journals:
    """Writes child and harness journals the way child.py and harness.py do."""

    def __init__(
        self, directory: Path, *, begin: float = 0.0, end: float = 10.0, prompt_s: float = 2.0
    ) -> None:
        self.directory = directory
        self.harness("run", t_begin=begin, t_end=end, ttl_s=2.0, prompt_s=prompt_s)

    def _append(self, name: str, record: dict[str, Any]) -> None:
        with (self.directory / name).open("a") as file:
            file.write(json.dumps(record) + "\n")

    def harness(self, kind: str, **fields: Any) -> None:
        self._append("harness.jsonl", {"kind": kind, **fields})

    def term(
        self,
        identity: str,
        pid: int,
        token: int,
        start: float,
        end: float | None,
        *,
        writes: list[tuple[float, bool | None]] | None = None,
    ) -> None:
        """A child's records; writes are (send time, accepted), each answered 1 ms later."""
        base = {"identity": identity, "pid": pid, "token": token}
        self._append(f"child-{identity}.jsonl", {"kind": "start", "t": start, "lock": "jobs", **base})
        for seq, (sent, accepted) in enumerate(writes or [(start + 0.01, True)]):
            self._append(
                f"child-{identity}.jsonl",
                {"kind": "write", "op": "set", "seq": seq, "t": sent, "t_reply": sent + 0.001,
                 "accepted": accepted, "highest": token if accepted else token + 1000, **base},
            )  # fmt: skip
        if end is not None:
            self._append(f"child-{identity}.jsonl", {"kind": "end", "t": end, "writes": 1, **base})


@pytest.fixture
def journals(tmp_path: Path) -> Journals:
    return Journals(tmp_path)


def test_consecutive_terms_are_clean_and_the_takeover_is_measured(journals: Journals, tmp_path: Path) -> None:
    journals.term("a", 100, 5, 0.0, 4.0)
    journals.harness("fault", fault="term_leader", t=3.9, target_pid=100, excuse_s=0.0, takeover=True)
    journals.term("b", 200, 6, 4.2, None)
    journals.harness("gone", pid=200, t=10.5)  # after the window: clipped
    report = check(tmp_path)
    assert report.violations == 0, report.explain()
    ((kind, seconds),) = report.takeovers
    assert kind == "term_leader" and seconds == pytest.approx(0.3)
    assert report.availability == pytest.approx(9.8 / 10)


def test_two_running_terms_that_overlap_are_a_violation(journals: Journals, tmp_path: Path) -> None:
    journals.term("a", 100, 5, 0.0, 4.0)
    journals.term("b", 200, 6, 3.5, 8.0)
    report = check(tmp_path)
    (overlap,) = report.overlaps
    assert (overlap.older.pid, overlap.newer.pid) == (100, 200)
    assert overlap.end - overlap.begin == pytest.approx(0.5)
    assert report.covered_overlaps == []


def test_a_term_without_end_nor_death_stays_open_to_the_end_of_the_run(
    journals: Journals, tmp_path: Path
) -> None:
    journals.term("a", 100, 5, 0.0, None)
    journals.term("b", 200, 6, 6.0, 8.0)
    report = check(tmp_path)
    assert len(report.overlaps) == 1, report.explain()
    assert report.terms[0].end_source == "open" and report.terms[0].end == 10.0


def test_a_killed_child_ends_when_the_harness_saw_it_gone(journals: Journals, tmp_path: Path) -> None:
    journals.term("a", 100, 5, 0.0, None)
    journals.harness("gone", pid=100, t=3.0)
    journals.term("b", 200, 6, 5.0, 8.0)
    journals.term("c", 300, 7, 8.5, None)
    journals.harness("gone", pid=300, t=9.5)
    journals.term("d", 400, 8, 9.0, 9.8)  # starts before c was seen gone: c may still have run
    report = check(tmp_path)
    assert report.terms[0].end == 3.0 and report.terms[0].end_source == "gone"
    (overlap,) = report.overlaps
    assert (overlap.older.pid, overlap.newer.pid) == (300, 400)


def test_a_gone_record_from_before_a_reused_pid_started_is_not_its_end(
    journals: Journals, tmp_path: Path
) -> None:
    journals.harness("gone", pid=100, t=0.5)
    journals.term("a", 100, 5, 1.0, None)
    journals.term("b", 200, 6, 5.0, 8.0)
    report = check(tmp_path)
    assert len(report.overlaps) == 1


def test_tokens_must_strictly_increase_in_the_order_of_the_terms(journals: Journals, tmp_path: Path) -> None:
    journals.term("a", 100, 7, 0.0, 2.0)
    journals.term("b", 200, 7, 3.0, 4.0)
    journals.term("c", 300, 6, 5.0, 6.0)
    report = check(tmp_path)
    assert len(report.token_violations) == 2, report.explain()
    assert report.overlaps == []


def test_a_restart_under_the_same_lease_keeps_its_token_but_only_after_the_old_command_ended(
    journals: Journals, tmp_path: Path
) -> None:
    # `--on-child-exit restart`: the same replica starts its command again, same token.
    journals.term("a", 100, 7, 0.0, 2.0)
    journals.term("a", 101, 7, 3.0, 4.0)
    assert check(tmp_path).violations == 0, check(tmp_path).explain()
    # ...never beside the old one, nor on another replica.
    journals.term("a", 102, 7, 3.5, 4.5)
    journals.term("b", 200, 7, 5.0, 6.0)
    report = check(tmp_path)
    assert len(report.token_violations) == 2 and len(report.overlaps) == 1, report.explain()


def test_a_stale_token_accepted_after_a_higher_one_is_a_fence_violation(
    journals: Journals, tmp_path: Path
) -> None:
    journals.term("a", 100, 5, 0.0, 2.0, writes=[(0.1, True), (1.5, True)])
    journals.term("b", 200, 6, 1.0, 3.0, writes=[(1.01, True)])
    report = check(tmp_path)
    assert len(report.fence_violations) == 1, report.explain()
    assert "token 5" in report.fence_violations[0]


def test_a_frozen_ex_leader_rejected_by_the_fence_is_a_covered_overlap(
    journals: Journals, tmp_path: Path
) -> None:
    journals.term("a", 100, 5, 0.0, 5.1, writes=[(0.5, True), (5.02, False)])
    journals.harness("pause", pids=[10, 100], t=1.0, t_resume=5.0)
    journals.term("b", 200, 6, 3.0, 9.0, writes=[(3.01, True)])
    report = check(tmp_path)
    assert report.violations == 0, report.explain()
    (covered,) = report.covered_overlaps
    assert covered.older.pid == 100


@pytest.mark.parametrize(
    ("writes", "pause", "end", "reason"),
    [
        ([(0.5, True), (5.02, True)], (1.0, 5.0), 5.1, "was accepted"),
        ([(0.5, True), (5.02, None)], (1.0, 5.0), 5.1, "was unanswered"),
        ([(0.5, True)], (3.5, 5.0), 5.1, "both children were running"),  # frozen after b began
        ([(0.5, True), (5.02, False)], (1.0, 5.0), 7.5, "after it was resumed"),  # not stopped promptly
    ],
)
def test_a_frozen_ex_leader_is_not_covered_unless_fenced_and_stopped_promptly(  # noqa: PLR0917
    journals: Journals,
    tmp_path: Path,
    writes: list[tuple[float, bool | None]],
    pause: tuple[float, float],
    end: float,
    reason: str,
) -> None:
    journals.term("a", 100, 5, 0.0, end, writes=writes)
    journals.harness("pause", pids=[100], t=pause[0], t_resume=pause[1])
    journals.term("b", 200, 6, 3.0, 9.0, writes=[(3.01, True)])
    report = check(tmp_path)
    (overlap,) = report.overlaps
    assert reason in overlap.reason, overlap.reason
    assert report.covered_overlaps == []


def test_a_late_write_accepted_before_the_successor_first_wrote_is_covered(
    journals: Journals, tmp_path: Path
) -> None:
    # a resumes at 5.0 and writes at 5.02, before b's first write (5.3): the resource orders it
    # before all of b's writes. Its next write, after b's reply at 5.301, must be rejected.
    journals.term("a", 100, 5, 0.0, 5.4, writes=[(0.5, True), (5.02, True), (5.35, False)])
    journals.harness("pause", pids=[100], t=1.0, t_resume=5.0)
    journals.term("b", 200, 6, 3.0, 9.0, writes=[(5.3, True)])
    report = check(tmp_path)
    assert report.violations == 0, report.explain()
    assert len(report.covered_overlaps) == 1


def test_a_late_write_accepted_after_the_successor_first_wrote_is_a_violation(
    journals: Journals, tmp_path: Path
) -> None:
    journals.term("a", 100, 5, 0.0, 5.4, writes=[(0.5, True), (5.35, True)])
    journals.harness("pause", pids=[100], t=1.0, t_resume=5.0)
    journals.term("b", 200, 6, 3.0, 9.0, writes=[(5.3, True)])
    (overlap,) = check(tmp_path).overlaps
    assert "was accepted" in overlap.reason


def test_a_pause_of_another_process_covers_nothing(journals: Journals, tmp_path: Path) -> None:
    journals.term("a", 100, 5, 0.0, 5.1, writes=[(0.5, True)])
    journals.harness("pause", pids=[999], t=1.0, t_resume=5.0)
    journals.term("b", 200, 6, 3.0, 9.0)
    assert len(check(tmp_path).overlaps) == 1


def test_the_excused_gap_after_a_crash_does_not_count_against_availability(
    journals: Journals, tmp_path: Path
) -> None:
    journals.term("a", 100, 5, 0.0, None)
    journals.harness("gone", pid=100, t=4.0)
    journals.harness("fault", fault="kill_leader", t=4.0, target_pid=100, excuse_s=2.0, takeover=True)
    journals.term("b", 200, 6, 6.0, 10.0)
    report = check(tmp_path)
    assert report.availability == pytest.approx(1.0)
    assert report.takeover_percentile(0.5) == pytest.approx(2.0)


def test_a_leader_that_rode_out_a_fault_has_no_takeover(journals: Journals, tmp_path: Path) -> None:
    journals.term("a", 100, 5, 0.0, 6.0)
    journals.harness("fault", fault="blackhole_leader", t=2.0, target_pid=100, excuse_s=2.0, takeover=True)
    journals.harness("fault", fault="kill_leader", t=5.9, target_pid=100, excuse_s=2.0, takeover=True)
    journals.term("b", 200, 6, 7.0, None)
    report = check(tmp_path)
    ((kind, seconds),) = report.takeovers
    assert kind == "kill_leader" and seconds == pytest.approx(1.1)


def test_availability_counts_the_time_without_a_leader(journals: Journals, tmp_path: Path) -> None:
    journals.term("a", 100, 5, 0.0, 4.0)
    journals.term("b", 200, 6, 6.0, 10.0)
    assert check(tmp_path).availability == pytest.approx(0.8)


def test_a_line_still_being_written_is_not_read(journals: Journals, tmp_path: Path) -> None:
    journals.term("a", 100, 5, 0.0, 4.0)
    with (tmp_path / "child-a.jsonl").open("a") as file:
        file.write('{"kind": "start", "t": 5.0, "pid"')
    assert len(check(tmp_path).terms) == 1


def test_a_journal_without_a_run_record_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no run record"):
        check(tmp_path)
