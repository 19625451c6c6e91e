"""Reads the journals of a fault run and judges it: overlaps, token order, fenced writes, availability.

Inputs (JSON lines, all times on CLOCK_MONOTONIC, see child.py and harness.py):
- ``child-*.jsonl``: the children's ``start`` / ``write`` / ``end`` records;
- ``harness.jsonl``: ``run`` (the observed window, the ttl), ``fault`` (kind, time, target pid,
  the unavoidable gap it excuses), ``pause`` (pids frozen from ``t`` to ``t_resume``) and ``gone``
  (the first moment the harness saw a child's process no longer running).

A term is a child's life as a leader: from its ``start`` to its ``end``. A SIGKILLed child has no
``end``: its term is bounded by the harness's ``gone`` observation of its pid, which comes after
the death (the watcher polls), so the bound is late, never early. A term with neither stays open
to the end of the run (or for ever): an unknown end is never taken for an early one, because a
false "no overlap" is the worst answer this checker could give.

Overlapping terms are violations, with one exception the issue names: the older term's processes
were frozen (SIGSTOP) before the newer term began, so the older child cannot know it was replaced.
Such an overlap is "covered by fencing" only if every write the older child sent after the newer
term's first accepted write (the moment the fence knew the newer token) was rejected by the fence
(an unanswered write counts as accepted), and the older child ended promptly after it was resumed.
Anything short of that is a violation too. A late write accepted BEFORE the newer term first wrote
is ordered before all of the newer term's writes, which is what fencing promises.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

HARNESS_JOURNAL = "harness.jsonl"
CHILD_GLOB = "child-*.jsonl"


@dataclasses.dataclass
class Write:
    identity: str
    pid: int
    token: int
    op: str
    sent: float
    replied: float
    #: True accepted, False rejected by the fence, None unknown (no reply: may have landed).
    accepted: bool | None
    highest: int | None


@dataclasses.dataclass
class Term:
    identity: str
    pid: int
    token: int
    start: float
    end: float = math.inf
    #: "end" (the child's own record), "gone" (the harness saw it dead), "open" (neither).
    end_source: str = "open"
    writes: list[Write] = dataclasses.field(default_factory=list)

    def label(self) -> str:
        return f"{self.identity}/pid {self.pid}/token {self.token}"


@dataclasses.dataclass(frozen=True)
class Pause:
    pids: frozenset[int]
    #: After the last SIGSTOP was sent (the processes may act until then).
    frozen: float
    #: Before the first SIGCONT was sent.
    resumed: float


@dataclasses.dataclass(frozen=True)
class Fault:
    kind: str
    t: float
    target_pid: int | None
    #: Seconds after `t` not counted in the availability (the unavoidable gap, e.g. one ttl).
    excuse_s: float
    expects_takeover: bool


@dataclasses.dataclass
class Overlap:
    older: Term
    newer: Term
    begin: float
    end: float
    reason: str

    def describe(self) -> str:
        return (
            f"{self.older.label()} [{self.older.start:.3f}, {self.older.end:.3f} {self.older.end_source}] "
            f"overlaps {self.newer.label()} [{self.newer.start:.3f}, ...] for "
            f"{self.end - self.begin:.3f}s: {self.reason}"
        )


@dataclasses.dataclass
class Report:
    terms: list[Term]
    faults: list[Fault]
    overlaps: list[Overlap]
    covered_overlaps: list[Overlap]
    token_violations: list[str]
    fence_violations: list[str]
    availability: float
    #: (fault kind, seconds from the fault to the next term of another child)
    takeovers: list[tuple[str, float]]
    window_s: float
    writes_accepted: int
    writes_rejected: int

    @property
    def violations(self) -> int:
        return len(self.overlaps) + len(self.token_violations) + len(self.fence_violations)

    def fault_counts(self) -> Counter[str]:
        return Counter(fault.kind for fault in self.faults)

    @property
    def takeovers_s(self) -> list[float]:
        return [seconds for _, seconds in self.takeovers]

    def takeover_percentile(self, q: float, *, kind: str | None = None) -> float | None:
        """Nearest-rank percentile of the takeover times (of one fault kind, or all)."""
        ordered = sorted(s for k, s in self.takeovers if kind is None or k == kind)
        if not ordered:
            return None
        return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]

    def explain(self) -> str:
        lines = [f"terms: {len(self.terms)}, faults: {dict(self.fault_counts())}"]
        lines += [f"OVERLAP {overlap.describe()}" for overlap in self.overlaps]
        lines += [f"covered by fencing: {overlap.describe()}" for overlap in self.covered_overlaps]
        lines += [f"TOKEN {text}" for text in self.token_violations]
        lines += [f"FENCE {text}" for text in self.fence_violations]
        lines += [
            f"term {term.label()} [{term.start:.3f}, {term.end:.3f}] ({term.end_source}, "
            f"{len(term.writes)} writes)"
            for term in self.terms
        ]
        return "\n".join(lines)


def _records(path: Path) -> Iterable[dict[str, Any]]:
    """Complete lines only: a line still being written (no newline yet) is not a record."""
    text = path.read_text()
    for line in text.splitlines(keepends=True):
        if line.endswith("\n") and line.strip():
            yield json.loads(line)


def _union_length(intervals: Iterable[tuple[float, float]]) -> float:
    total, current_begin, current_end = 0.0, None, None
    for begin, end in sorted(intervals):
        if end <= begin:
            continue
        if current_end is None or begin > current_end:
            if current_end is not None and current_begin is not None:
                total += current_end - current_begin
            current_begin, current_end = begin, end
        else:
            current_end = max(current_end, end)
    if current_end is not None and current_begin is not None:
        total += current_end - current_begin
    return total


def _clip(intervals: Iterable[tuple[float, float]], begin: float, end: float) -> list[tuple[float, float]]:
    return [(max(a, begin), min(b, end)) for a, b in intervals if min(b, end) > max(a, begin)]


def _intersection_with_union(
    intervals: list[tuple[float, float]], others: list[tuple[float, float]]
) -> list[tuple[float, float]]:
    return [(max(a, c), min(b, d)) for a, b in intervals for c, d in others if min(b, d) > max(a, c)]


def load_terms(directory: Path, harness: list[dict[str, Any]], run_end: float) -> list[Term]:
    terms: dict[tuple[int, float], Term] = {}
    by_pid: dict[int, list[Term]] = {}
    for path in sorted(directory.glob(CHILD_GLOB)):
        for record in _records(path):
            kind, pid = record["kind"], int(record["pid"])
            if kind == "start":
                term = Term(record["identity"], pid, int(record["token"]), float(record["t"]))
                terms[(pid, term.start)] = term
                by_pid.setdefault(pid, []).append(term)
                continue
            owners = [term for term in by_pid.get(pid, []) if term.start <= float(record["t"])]
            if not owners:
                raise ValueError(f"{path.name}: a {kind} record of pid {pid} before its start record")
            owner = max(owners, key=lambda term: term.start)
            if kind == "write":
                owner.writes.append(
                    Write(
                        owner.identity, pid, int(record["token"]), record["op"], float(record["t"]),
                        float(record["t_reply"]), record["accepted"], record.get("highest"),
                    )
                )  # fmt: skip
            elif kind == "end":
                owner.end, owner.end_source = float(record["t"]), "end"
    for record in harness:
        if record["kind"] != "gone":
            continue
        for term in by_pid.get(int(record["pid"]), []):
            seen_gone = float(record["t"])
            if term.end_source != "end" and term.start <= seen_gone < term.end:
                term.end, term.end_source = seen_gone, "gone"
    for term in terms.values():
        if term.end_source == "open":
            term.end = max(run_end, term.start)  # still running when the run ended
    return sorted(terms.values(), key=lambda term: term.start)


def _classify(older: Term, newer: Term, pauses: list[Pause], prompt_s: float) -> str | None:
    """None if the overlap is covered by fencing (see the module docstring), else why it is not."""
    # The LATEST freeze before the newer term began: an earlier short pause of the same process
    # would measure "ended promptly after it was resumed" from the wrong resume.
    pause = max(
        (
            p for p in pauses
            if older.pid in p.pids and older.start <= p.frozen <= newer.start and p.resumed < older.end
        ),
        key=lambda p: p.frozen,
        default=None,
    )  # fmt: skip
    if pause is None:
        return "both children were running"
    if older.token >= newer.token:
        return "the paused (older) term does not hold the lower token"
    # The fence protects from the newer term's first accepted write on: a late write of the old
    # term that the resource took before it is ordered before every write of the newer term,
    # exactly as if it had been sent just before the handoff. (A successor that has not written
    # yet has nothing a stale write could overwrite.) After that reply, every late write must be
    # rejected; an unanswered one counts as accepted.
    fenced_at = min((w.replied for w in newer.writes if w.accepted is True), default=math.inf)
    late = [w for w in older.writes if w.sent >= max(newer.start, fenced_at)]
    not_rejected = [w for w in late if w.accepted is not False]
    if not_rejected:
        w = not_rejected[0]
        state = "accepted" if w.accepted else "unanswered"
        return f"the paused child's write sent at {w.sent:.3f} after the new term began was {state}"
    if older.end > pause.resumed + prompt_s:
        return (
            f"the paused child ran {older.end - pause.resumed:.3f}s after it was resumed "
            f"(allowed {prompt_s:.3f}s)"
        )
    return None


def _fence_violations(terms: list[Term]) -> list[str]:
    """Writes accepted with a token lower than one the resource had accepted before they were sent."""
    writes = [w for term in terms for w in term.writes]
    accepted_by_reply = sorted((w for w in writes if w.accepted is True), key=lambda w: w.replied)
    problems, index, highest, highest_write = [], 0, -1, None
    for w in sorted((w for w in writes if w.accepted is True), key=lambda w: w.sent):
        while index < len(accepted_by_reply) and accepted_by_reply[index].replied < w.sent:
            if accepted_by_reply[index].token > highest:
                highest, highest_write = accepted_by_reply[index].token, accepted_by_reply[index]
            index += 1
        if w.token < highest and highest_write is not None:
            problems.append(
                f"{w.identity}/pid {w.pid} wrote with token {w.token} at {w.sent:.3f} and it was accepted, "
                f"after token {highest} ({highest_write.identity}) was accepted at "
                f"{highest_write.replied:.3f}"
            )
    for w in writes:
        if w.accepted is False and w.highest is not None and w.highest <= w.token:
            problems.append(
                f"{w.identity} write at {w.sent:.3f} rejected with a fence {w.highest} <= its token"
            )
    return problems


def _restart(older: Term, newer: Term) -> bool:
    """Whether `newer` is the same replica's command started again under the same lease
    (`--on-child-exit restart`: the token stays) after `older` had ended."""
    return newer.identity == older.identity and newer.token == older.token and older.end <= newer.start


def check(directory: Path) -> Report:
    harness_path = directory / HARNESS_JOURNAL
    harness = list(_records(harness_path)) if harness_path.exists() else []
    runs = [record for record in harness if record["kind"] == "run"]
    if not runs:
        raise ValueError(f"{harness_path}: no run record (window and ttl)")
    run = runs[-1]
    begin, end = float(run["t_begin"]), float(run.get("t_end", math.inf))
    prompt_s = float(run["prompt_s"])
    terms = load_terms(directory, harness, end)
    pauses = [
        Pause(frozenset(int(pid) for pid in r["pids"]), float(r["t"]), float(r["t_resume"]))
        for r in harness
        if r["kind"] == "pause"
    ]
    faults = [
        Fault(r["fault"], float(r["t"]), r.get("target_pid"), float(r["excuse_s"]), bool(r["takeover"]))
        for r in harness
        if r["kind"] == "fault"
    ]

    overlaps, covered = [], []
    for j, newer in enumerate(terms):
        for older in terms[:j]:
            if older.end > newer.start:
                overlap = Overlap(older, newer, newer.start, min(older.end, newer.end), "")
                reason = _classify(older, newer, pauses, prompt_s)
                if reason is None:
                    covered.append(overlap)
                else:
                    overlap.reason = reason
                    overlaps.append(overlap)

    token_problems = [
        f"{b.label()} started at {b.start:.3f} after {a.label()} started at {a.start:.3f}"
        for a, b in itertools.pairwise(terms)
        if b.token < a.token or (b.token == a.token and not _restart(a, b))
    ]

    window_end = (
        end if math.isfinite(end) else max((t.end for t in terms if math.isfinite(t.end)), default=begin)
    )
    excused = _clip([(f.t, f.t + f.excuse_s) for f in faults], begin, window_end)
    led = _clip([(t.start, t.end) for t in terms], begin, window_end)
    window = window_end - begin
    counted = window - _union_length(excused)
    led_counted = _union_length(led) - _union_length(_intersection_with_union(led, excused))
    availability = 1.0 if counted <= 0 else max(0.0, min(1.0, led_counted / counted))

    # A takeover is the first term of another child after the fault, if it began before the next
    # fault: a leader that rode out a short fault has no takeover (the next fault's is not its).
    takeovers = []
    fault_times = sorted(f.t for f in faults)
    for fault in faults:
        if not fault.expects_takeover:
            continue
        next_fault = next((t for t in fault_times if t > fault.t), math.inf)
        successor = next((t for t in terms if t.start > fault.t and t.pid != fault.target_pid), None)
        if successor is not None and successor.start < next_fault:
            takeovers.append((fault.kind, successor.start - fault.t))

    all_writes = [w for term in terms for w in term.writes]
    return Report(
        terms=terms,
        faults=faults,
        overlaps=overlaps,
        covered_overlaps=covered,
        token_violations=token_problems,
        fence_violations=_fence_violations(terms),
        availability=availability,
        takeovers=takeovers,
        window_s=window,
        writes_accepted=sum(1 for w in all_writes if w.accepted is True),
        writes_rejected=sum(1 for w in all_writes if w.accepted is False),
    )
