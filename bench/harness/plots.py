"""PNG plots for docs/benchmarks.md (matplotlib with the Agg backend: no display needed).

matplotlib is a bench-only dependency (the `bench` extra); it is imported inside the functions so
that `python -m bench` and its pure helpers still import without it. A missing matplotlib makes
the plot functions raise PlotsUnavailable, which a benchmark turns into a note.

Images go under docs/img/bench/ and are referenced from the module's section through
BenchResult.images as (path, caption).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.harness.common import REPO

IMG_DIR = REPO / "docs" / "img" / "bench"
#: Small enough for a README-sized page, sharp enough to read the tick labels.
_SIZE_IN = (7.0, 4.0)
_DPI = 110


class PlotsUnavailable(RuntimeError):
    """matplotlib is not installed (the `bench` extra); the tables are still written."""


def image_path(name: str) -> Path:
    """docs/img/bench/NAME.png, its directory created."""
    IMG_DIR.mkdir(parents=True, exist_ok=True)
    return IMG_DIR / f"{name}.png"


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise PlotsUnavailable("matplotlib is not installed (pip install '.[bench]')") from exc
    # Agg before pyplot is imported: the bench runs headless.
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_vs_locks(
    path: Path,
    *,
    locks: list[int],
    series: dict[str, list[float]],
    ylabel: str,
    title: str,
    dashed: frozenset[str] = frozenset(),
) -> None:
    """One line per series against the number of locks (log x axis when the counts span 10x);
    the series named in `dashed` (an earlier run's, for before/after) are drawn dashed."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=_SIZE_IN)
    try:
        for label, values in series.items():
            if len(values) != len(locks):
                raise ValueError(f"series {label!r} has {len(values)} values for {len(locks)} lock counts")
            # NaN marks a scale that was not measured: matplotlib leaves a gap there.
            style = "--" if label in dashed else "-"
            ax.plot(locks, values, style, marker="o", label=label)
        if locks and min(locks) > 0 and max(locks) / min(locks) >= 10:
            ax.set_xscale("log")
        if _spans_decades([v for values in series.values() for v in values]):
            ax.set_yscale("log")  # 3 ms and 300 ms on one plot: both readable
        ax.set_xticks(locks)
        ax.set_xticklabels([f"{n:,}" for n in locks])
        ax.set_xlabel("locks per daemon")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        if len(series) > 1:
            ax.legend()
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=_DPI)
    finally:
        plt.close(fig)


def plot_distributions(path: Path, *, samples: dict[str, list[float]], xlabel: str, title: str) -> None:
    """One horizontal row per system: a box plot (quartiles, whiskers at min/max) with every sample
    drawn over it as a dot, so that 20 runs are seen as 20 runs and not only as a box.

    Systems without samples (skipped) get an empty row labelled "skipped"."""
    plt = _pyplot()
    labels = list(samples)
    fig_height = max(_SIZE_IN[1], 1.0 + 0.55 * len(labels))
    fig, ax = plt.subplots(figsize=(_SIZE_IN[0], fig_height))
    try:
        present = [(i, samples[label]) for i, label in enumerate(labels) if samples[label]]
        positions = [i + 1 for i, _ in present]
        if present:
            ax.boxplot(
                [values for _, values in present],
                positions=positions,
                orientation="horizontal",
                whis=(0, 100),
                widths=0.5,
                showfliers=False,
            )
            for position, (_, values) in zip(positions, present, strict=True):
                # A fixed spread (not random) keeps the image identical for identical data.
                offsets = [((k % 7) - 3) * 0.04 for k in range(len(values))]
                ax.scatter(values, [position + o for o in offsets], s=10, alpha=0.6, zorder=3)
        ax.set_yticks(range(1, len(labels) + 1))
        ax.set_yticklabels([label if samples[label] else f"{label} (skipped)" for label in labels])
        ax.invert_yaxis()  # the first system on top, as in the table
        all_values = [v for values in samples.values() for v in values]
        if all_values and _spans_decades(all_values):
            ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_title(title)
        ax.grid(True, axis="x", alpha=0.3)
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=_DPI)
    finally:
        plt.close(fig)


def _spans_decades(values: Sequence[float]) -> bool:
    positive = [v for v in values if v > 0 and math.isfinite(v)]
    return bool(positive) and max(positive) / min(positive) >= 30
