"""Printing results, and keeping docs/benchmarks.md up to date.

docs/benchmarks.md has a header (last run, machine, how to read, target summary) rewritten on every
run, and one section per benchmark between `<!-- bench:NAME:begin/end -->` markers. A run with
`--only` replaces only its own sections; each section names the run it comes from.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Sequence
from pathlib import Path

from bench.harness.common import BenchResult, Table

_SECTION = re.compile(r"<!-- bench:(\w+):begin -->\n.*?<!-- bench:\1:end -->\n", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class RunInfo:
    command: str
    date: str
    mode: str  # "full" or "quick"
    total_s: float
    facts: dict[str, str]
    setup: list[str]


def render_console(result: BenchResult) -> str:
    out = [f"== {result.name}: {result.title} ({result.seconds:.0f} s)"]
    if result.error:
        out.append(f"FAILED: {result.error}")
    out += [f"\n{table.render()}" for table in result.tables]
    out += [""] + [
        f"target {t.what}: {t.verdict} ({t.figure}; goal {t.goal})" + (f"; why: {t.why}" if t.why else "")
        for t in result.targets
    ]
    out += [f"note: {note}" for note in result.notes]
    out += [f"image: {image} ({caption})" for image, caption in result.images]
    return "\n".join(out) + "\n"


def render_section(result: BenchResult, run: RunInfo, *, docs_dir: Path) -> str:
    out = [
        f"<!-- bench:{result.name}:begin -->",
        f"## {result.name}: {result.title}",
        "",
        f"_From the {run.mode} run of {run.date} (`{run.command}`), {result.seconds:.0f} s"
        + (f"; measured by `{result.source}`._" if result.source else "._"),
        "",
        result.method,
        "",
    ]
    if result.error:
        out += [f"**This benchmark failed:** `{result.error}`", ""]
    for table in result.tables:
        out += [table.render(), ""]
    for image, caption in result.images:
        out += [f"![{caption}]({_relative(image, docs_dir)})", ""]
    if result.targets:
        out += ["Targets:", ""]
        out += [
            f"- {t.what}: **{t.verdict}**: {t.figure} (goal {t.goal})" + (f". Why: {t.why}" if t.why else "")
            for t in result.targets
        ]
        out.append("")
    out += [f"Note: {note}\n" for note in result.notes]
    out.append(f"<!-- bench:{result.name}:end -->")
    return "\n".join(out) + "\n"


def _relative(image: Path, docs_dir: Path) -> str:
    """The image's path as the Markdown file refers to it (POSIX, relative to its directory)."""
    try:
        return image.resolve().relative_to(docs_dir.resolve()).as_posix()
    except ValueError:
        return Path(os.path.relpath(image.resolve(), docs_dir.resolve())).as_posix()


def render_header(run: RunInfo, results: Sequence[BenchResult]) -> str:
    facts = Table("Machine", ["fact", "value"])
    for key, value in run.facts.items():
        facts.add(key, value.replace("|", "/"))
    summary = Table("Targets of this run", ["benchmark", "target", "measured", "verdict", "why missed"])
    for result in results:
        for t in result.targets:
            summary.add(result.name, t.what, t.figure, t.verdict, t.why.replace("|", "/"))
        if result.error:
            summary.add(result.name, "(benchmark failed)", result.error[:80].replace("\n", " "), "error", "")
    lines = [
        "# Benchmarks",
        "",
        "Written by `python -m bench` (the `bench/` package, `make bench`); do not edit by hand. "
        "Each section names the module that measured it: bench/lease/ (one lock: takeover, handoff, "
        "idle, start-up), bench/many_locks/, bench/peers/, bench/library_peers/ and bench/overrun/ "
        "(on_overrun='exit'); bench/harness/ "
        "runs them and writes this page, bench/servers/ finds or installs etcd and ZooKeeper.",
        "Measurements on a small, noisy machine, not pass/fail tests: every figure below is what was "
        "measured, including the targets it misses.",
        "",
        "## Last run",
        "",
        f"- command: `{run.command}`",
        f"- date: {run.date}",
        f"- mode: {run.mode}" + (" (fewer runs, shorter idle windows)" if run.mode == "quick" else ""),
        f"- total runtime: {run.total_s:.0f} s ({run.total_s / 60:.1f} min)",
        f"- benchmarks run: {', '.join(r.name for r in results)}",
        *[f"- setup: {line}" for line in run.setup],
        "",
        facts.render(),
        "",
        "## How to read the figures",
        "",
        "- Percentiles are nearest-rank: the p-th percentile of n sorted values is the value at rank "
        "ceil(p/100 x n). With fewer than 100 runs the p99 is the maximum of the runs.",
        "- Medians are `statistics.median` (mean of the two middle values for an even count).",
        "- Times are wall-clock: the benchmark takes `time.time()` right before the signal or spawn, and "
        "the end is the daemon's own JSON log `timestamp` (ISO UTC, microseconds) or, for etcd, the "
        "`date +%s.%N` its CMD wrote, or (peers) the `time.time()` line each system's CMD journals as its "
        "first act. All are the same host clock.",
        "- Every daemon is a real `python -m elector run` process against a private redis-server on a "
        "free 127.0.0.1 port; each lock is seeded as already used (its fencing counter and the "
        "server's run_id set, as after a grant), because a brand-new lock waits one ttl by design.",
        "",
        summary.render(),
        "",
    ]
    return "\n".join(lines)


def update_docs(path: Path, results: Sequence[BenchResult], run: RunInfo, order: Sequence[str]) -> None:
    sections: dict[str, str] = {}
    if path.exists():
        for match in _SECTION.finditer(path.read_text()):
            sections[match.group(1)] = match.group(0)
    for result in results:
        sections[result.name] = render_section(result, run, docs_dir=path.parent)
    body = [sections[name] for name in order if name in sections]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_header(run, results) + "\n" + "\n".join(body))
