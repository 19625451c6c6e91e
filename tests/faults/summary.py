"""The summary table of a fault run (printed at the end of the session, and kept next to the journals)."""

from __future__ import annotations

from .checker import Report


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


def format_summary(report: Report, *, title: str) -> str:
    counts = report.fault_counts()
    rows = [("fault", "injected", "takeovers", "takeover p50", "takeover p99")]
    for kind in sorted(counts):
        taken = [s for k, s in report.takeovers if k == kind]
        rows.append((
            kind, str(counts[kind]), str(len(taken)),
            _seconds(report.takeover_percentile(0.5, kind=kind)),
            _seconds(report.takeover_percentile(0.99, kind=kind)),
        ))  # fmt: skip
    rows.append((
        "all", str(sum(counts.values())), str(len(report.takeovers)),
        _seconds(report.takeover_percentile(0.5)), _seconds(report.takeover_percentile(0.99)),
    ))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [title]
    for index, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
        if index in (0, len(rows) - 2):
            lines.append("  ".join("-" * width for width in widths))
    lines += [
        f"run window                         {report.window_s:.1f}s, {len(report.terms)} terms",
        f"overlaps (violations)              {len(report.overlaps)}",
        f"paused-process overlaps (fenced)   {len(report.covered_overlaps)}",
        f"token order violations             {len(report.token_violations)}",
        f"stale fenced writes accepted       {len(report.fence_violations)}",
        f"fenced writes accepted / rejected  {report.writes_accepted} / {report.writes_rejected}",
        f"availability (excused gaps out)    {100 * report.availability:.2f}%",
    ]
    return "\n".join(lines)
