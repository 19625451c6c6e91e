"""A shape check for PromQL that must count every pod once, however often it is scraped.

With the chart's ServiceMonitor and PodMonitor both on, Prometheus scrapes each pod twice: the same
series arrive under two `job`s, with the same `pod`. A query that sums or counts across pods must
therefore reduce to one value per pod first: `sum by (namespace, lock) (max by (namespace, lock,
pod) (...))`. Used by test_alerts.py and test_dashboard.py (the semantic check, a doubled scrape
fed to promtool, lives in those tests).
"""

from __future__ import annotations

import re

#: Aggregations across series that a second copy of every series would change.
ADDING = {"sum", "count"}
#: Aggregations a second, identical copy cannot change: the per-pod step itself.
IDEMPOTENT = {"max", "min"}
_AGGREGATION = re.compile(
    r"\b(sum|count|avg|group|stddev|stdvar|topk|bottomk|quantile|count_values|max|min)\s*"
    r"(?:(by|without)\s*\(([^)]*)\)\s*)?\("
)


def _closing(expr: str, opening: int) -> int:
    """The index of the parenthesis that closes the one at `opening` (string literals skipped)."""
    depth = 0
    index = opening
    while index < len(expr):
        char = expr[index]
        if char == '"':
            index = expr.index('"', index + 1)
            while expr[index - 1] == "\\":
                index = expr.index('"', index + 1)
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth == 0:
                return index
        index += 1
    raise ValueError(f"unbalanced parentheses in {expr!r}")


def _labels(grouping: str | None) -> set[str]:
    return {label.strip() for label in (grouping or "").split(",") if label.strip()}


def per_pod_problems(expr: str) -> list[str]:
    """What in `expr` could count a pod twice; empty when every sum/count goes over one value per pod.

    Every `sum`/`count` must be written `sum by (L) (max by (L', pod) (...))` (or `min`) with L' a
    superset of L, the inner aggregation spanning the whole argument.
    """
    problems = []
    for match in _AGGREGATION.finditer(expr):
        name, clause, grouping = match.groups()
        if name in IDEMPOTENT:
            continue
        outer = _labels(grouping)
        where = f"{name} at {match.start()} of {expr!r}"
        if name not in ADDING:
            problems.append(f"{where}: {name} is not allowed, use sum/count over max by (..., pod)")
            continue
        if clause != "by":
            problems.append(f"{where}: aggregate with a prefix `by (...)`")
            continue
        opening = match.end() - 1
        argument = expr[opening + 1 : _closing(expr, opening)].strip()
        inner = _AGGREGATION.match(argument)
        if inner is None or inner.group(1) not in IDEMPOTENT or inner.group(2) != "by":
            problems.append(f"{where}: its argument is not `max by (..., pod) (...)`")
            continue
        if _closing(argument, inner.end() - 1) != len(argument) - 1:
            problems.append(f"{where}: the per-pod {inner.group(1)} does not span the whole argument")
            continue
        labels = _labels(inner.group(3))
        if "pod" not in labels or not outer <= labels:
            problems.append(f"{where}: the inner grouping {sorted(labels)} lacks pod or {sorted(outer)}")
    return problems


def without_per_pod(expr: str) -> str:
    """`expr` with the per-pod step of every sum/count removed: the naive query, for mutation tests."""
    while True:
        for match in _AGGREGATION.finditer(expr):
            if match.group(1) not in ADDING or match.group(2) != "by":
                continue
            opening = match.end() - 1
            start = opening + 1
            while expr[start].isspace():
                start += 1
            inner = _AGGREGATION.match(expr, start)
            if inner is None or inner.group(1) not in IDEMPOTENT:
                continue
            inner_close = _closing(expr, inner.end() - 1)
            body = expr[inner.end() : inner_close]
            expr = expr[:start] + body + expr[inner_close + 1 :]
            break
        else:
            return expr
