"""The charts pass the lock's 0.1.0 name as ELECTOR_PREDECESSOR_LOCK (`predecessorLock: auto`).

Chart 0.1.0 named the lock `<full name>` (a chart that included its sidecar: the `elector` subchart's full
name); 0.2.0 names it `<namespace>/<full name>`. Whatever renders the chart (helm upgrade, helm template,
Argo CD, Flux), the new pods then lead only while they hold the old name too: the daemon's side is
tests/faults/test_predecessor_lock.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helm_python.chart import Chart

from tests.helm.test_parent_chart import build_parent
from tests.helm.test_upgrade_from_0_1 import _lock, _named, _pod, migrate, previous_chart, previous_value_sets

__all__ = ["previous_chart"]  # the fixture, imported for pytest

RenderChart = Callable[..., list[dict[str, Any]]]


def _env(docs: list[dict[str, Any]], deployment: str) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in _pod(_named(docs, "Deployment")[deployment])["elector"]["env"]}


#: 0.1.0's example value sets that left the lock to its default (the others keep their own name).
DEFAULT_LOCK_SETS = sorted(
    name
    for name, values in previous_value_sets().items()
    if not (values.get("elector") or {}).get("lock") and (values.get("workload") or {}).get("enabled", True)
)


@pytest.mark.parametrize("value_set", DEFAULT_LOCK_SETS)
def test_a_plain_upgrade_names_the_0_1_lock_as_the_predecessor(
    previous_chart: Path, chart: Chart, render_chart: RenderChart, value_set: str
) -> None:
    """Every 0.1.0 example value set without a lock: 0.2.0's predecessor is the lock 0.1.0 rendered."""
    old_values = previous_value_sets()[value_set]
    old_docs = render_chart(Chart.load(previous_chart), old_values, name="jobs")
    old_lock = _lock(_pod(_named(old_docs, "Deployment")["jobs-elector"])["elector"])
    # The documented moves of the values, and no lock step: `elector.lock` stays empty.
    new_values = migrate(old_values, old_lock="")
    env = _env(render_chart(chart, new_values, name="jobs"), "jobs-elector")
    assert (env["ELECTOR_LOCK"], env["ELECTOR_PREDECESSOR_LOCK"]) == ("apps/jobs-elector", old_lock)


@pytest.mark.parametrize(
    ("elector", "expected"),
    [
        ({"lock": "billing"}, None),  # a lock of one's own: nothing renamed
        ({"predecessorLock": ""}, None),  # the migration finished
        ({"predecessorLock": "{{ .Release.Name }}-v1"}, "jobs-v1"),  # a name of one's own, a template
        ({"lock": "billing-v2", "predecessorLock": "billing"}, "billing"),
    ],
)
def test_the_value_names_the_predecessor(
    chart: Chart, render_chart: RenderChart, elector: dict[str, Any], expected: str | None
) -> None:
    env = _env(render_chart(chart, {"elector": elector}, name="jobs"), "jobs-elector")
    assert env.get("ELECTOR_PREDECESSOR_LOCK") == expected


@pytest.mark.parametrize(
    ("elector", "message"),
    [
        ({"lock": "billing", "predecessorLock": "billing"}, "is the lock itself"),
        ({"predecessorLock": "{bad}"}, "is not a lock name"),
    ],
)
def test_a_predecessor_that_cannot_be_one_is_refused(
    chart: Chart, render_chart: RenderChart, elector: dict[str, Any], message: str
) -> None:
    with pytest.raises(Exception, match=message):
        render_chart(chart, {"elector": elector}, name="jobs")


@pytest.mark.parametrize(
    ("release", "expected"), [("shop", "shop-elector"), ("elector-shop", "elector-shop")]
)
def test_a_chart_that_included_the_0_1_sidecar_gets_the_elector_subcharts_name(
    tmp_path: Path, library_dir: Path, render_chart: RenderChart, release: str, expected: str
) -> None:
    """In 0.1.0 a parent chart depended on `elector`, whose full name named the lock."""
    parent = Chart.load(build_parent(tmp_path, library_dir))
    docs = render_chart(parent, {"leader": {"lock": ""}}, name=release)
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    env = {e["name"]: e.get("value") for e in _pod(deployment)["elector"]["env"]}
    assert env["ELECTOR_PREDECESSOR_LOCK"] == expected
