"""`helm upgrade` from chart 0.1.0: the previous release's example values, moved by the table of docs/helm.md
("Upgrading from chart 0.1.0"), render a Deployment with the same name and selector (immutable in
Kubernetes: a changed selector makes the upgrade fail), Services with the same names, the same lock (or a
rolling update runs two leaders) and the same images (the `registry` trap: registry.k8s.io/ghcr.io/...).

The 0.1.0 chart comes from the repository's own history (`git archive` of the release commit); in a
shallow clone the commit is missing and the test fails saying so, it is never skipped.
"""

from __future__ import annotations

import copy
import io
import re
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_python.chart import Chart

from elector._version import __version__

REPO = Path(__file__).resolve().parents[2]
PREVIOUS_COMMIT = "cbaaac6"  # 0.1.0 (CHANGELOG.md)
DOC = REPO / "docs" / "helm.md"
RenderChart = Callable[..., list[dict[str, Any]]]


def _git(*args: str) -> bytes:
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, check=True, timeout=60).stdout
    except subprocess.CalledProcessError as exc:
        pytest.fail(
            f"git {' '.join(args)} failed ({exc.stderr.decode(errors='replace').strip()}): the 0.1.0 chart "
            f"comes from commit {PREVIOUS_COMMIT}; in a shallow clone run `git fetch --unshallow`"
        )


@pytest.fixture(scope="module")
def previous_chart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    into = tmp_path_factory.mktemp("chart-0.1.0")
    archive = _git("archive", "--format=tar", PREVIOUS_COMMIT, "helm/elector")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    chart = into / "helm" / "elector"
    assert yaml.safe_load((chart / "Chart.yaml").read_text())["version"] == "0.1.0"
    return chart


def previous_value_sets() -> dict[str, dict[str, Any]]:
    names = _git("ls-tree", "--name-only", f"{PREVIOUS_COMMIT}:helm/elector/ci").decode().split()
    sets = {"values.yaml": {}}
    for name in names:
        sets[name] = yaml.safe_load(_git("show", f"{PREVIOUS_COMMIT}:helm/elector/ci/{name}")) or {}
    return sets


def migration_table() -> list[tuple[str, str | None, str]]:
    """(old path, new path or None, step) from the documented table."""
    text = DOC.read_text()
    start = text.index("<!-- values-migration:")
    rows = []
    for line in text[start:].splitlines()[3:]:
        if not line.startswith("|"):
            break
        old, new, step = (cell.strip() for cell in line.strip("|").split("|", 2))
        (old_path,) = re.fullmatch(r"`([\w.]+)`", old).groups()  # type: ignore[union-attr]
        new_match = re.fullmatch(r"`([\w.]+)`", new)
        rows.append((old_path, new_match.group(1) if new_match else None, step.split(":")[0]))
    return rows


def _pop(values: dict[str, Any], path: str) -> Any:
    """Remove the value at `path`, and the maps it leaves empty."""
    key, _, rest = path.partition(".")
    if not rest:
        return values.pop(key, None)
    if not isinstance(values.get(key), dict):
        return None
    value = _pop(values[key], rest)
    if not values[key]:
        del values[key]
    return value


def _merge_into(values: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    node = values
    for key in parents:
        node = node.setdefault(key, {})
    if isinstance(value, dict) and isinstance(node.get(leaf), dict):
        node[leaf] = {**node[leaf], **value}
    else:
        node[leaf] = value


def migrate(old: dict[str, Any], *, old_lock: str) -> dict[str, Any]:
    """The documented migration: the table's moves, renames and deletes, then the lock step."""
    values = copy.deepcopy(old)
    for old_path, new_path, step in migration_table():
        value = _pop(values, old_path)
        if value is None:
            continue
        if step in ("move", "rename"):
            assert new_path, old_path
            _merge_into(values, new_path, value)
        else:
            assert step == "delete", step
    # "Set elector.lock to the old name" (the Lock: line of the 0.1.0 release's NOTES)
    values.setdefault("elector", {}).setdefault("lock", old_lock)
    # "set podDisruptionBudget.maxUnavailable: 100% ... with elector.gateOnLeadership"
    if values["elector"].get("gateOnLeadership") and values.get("podDisruptionBudget", {}).get(
        "enabled", True
    ):
        values["podDisruptionBudget"] = {**values.get("podDisruptionBudget", {}), "maxUnavailable": "100%"}
    return values


def _named(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {
        d["metadata"]["name"]: d
        for d in docs
        if d["kind"] == kind and "helm.sh/hook" not in (d["metadata"].get("annotations") or {})
    }


def _pod(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}


def _lock(container: dict[str, Any]) -> str:
    return next(e["value"] for e in container["env"] if e["name"] == "ELECTOR_LOCK")


def test_the_steps_the_migration_applies_are_documented() -> None:
    text = " ".join(DOC.read_text().split())
    assert "**Set `elector.lock` to the old name**" in text
    assert (
        "set `podDisruptionBudget.maxUnavailable: 100%` (or `enabled: false`) with `elector.gateOnLeadership`"
        in text
    )


def test_the_table_covers_every_removed_top_level_value(chart_dir: Path) -> None:
    """Every top-level key of 0.1.0's values that 0.2.0's schema refuses is in the table."""
    old_defaults = yaml.safe_load(_git("show", f"{PREVIOUS_COMMIT}:helm/elector/values.yaml"))
    new_keys = set(yaml.safe_load((chart_dir / "values.yaml").read_text()))
    documented = {old.split(".")[0] for old, _, _ in migration_table()}
    assert set(old_defaults) - new_keys <= documented


@pytest.mark.parametrize("value_set", sorted(previous_value_sets()))
def test_an_upgrade_keeps_the_deployment_selector_services_lock_and_images(
    previous_chart: Path, chart: Chart, render_chart: RenderChart, value_set: str
) -> None:
    old_values = previous_value_sets()[value_set]
    old_docs = render_chart(Chart.load(previous_chart), old_values, name="jobs")
    old_deployments = _named(old_docs, "Deployment")
    old_deployments = {n: d for n, d in old_deployments.items() if "operator" not in n}  # the operator moved
    old_lock = next((_lock(_pod(d)["elector"]) for d in old_deployments.values()), "")
    new_values = migrate(old_values, old_lock=old_lock or "unused")
    new_docs = render_chart(chart, new_values, name="jobs")
    new_deployments = _named(new_docs, "Deployment")

    assert new_deployments.keys() == old_deployments.keys()
    for name, old in old_deployments.items():
        new = new_deployments[name]
        assert new["spec"]["selector"] == old["spec"]["selector"], name
        old_pod, new_pod = _pod(old), _pod(new)
        assert _lock(new_pod["elector"]) == _lock(old_pod["elector"])
        assert new_pod["app"]["image"] == old_pod["app"]["image"]
        # The sidecar moves to this release's image (the chart's appVersion), unless a tag was pinned.
        old_image, _, old_tag = old_pod["elector"]["image"].rpartition(":")
        new_image, _, new_tag = new_pod["elector"]["image"].rpartition(":")
        assert new_image == old_image
        assert new_tag == (__version__ if old_tag == "0.1.0" else old_tag)
    old_services = {n for n in _named(old_docs, "Service") if "operator" not in n}
    assert set(_named(new_docs, "Service")) == old_services


def test_without_the_lock_step_the_lock_would_change(
    previous_chart: Path, chart: Chart, render_chart: RenderChart
) -> None:
    """Why the lock step is documented: the new default adds the namespace."""
    old = _lock(
        _pod(_named(render_chart(Chart.load(previous_chart), {}, name="jobs"), "Deployment")["jobs-elector"])[
            "elector"
        ]
    )
    new = _lock(_pod(_named(render_chart(chart, {}, name="jobs"), "Deployment")["jobs-elector"])["elector"])
    assert (old, new) == ("jobs-elector", "apps/jobs-elector")


def test_a_0_1_repository_naming_its_registry_is_not_prefixed(
    render_chart: RenderChart, chart: Chart
) -> None:
    """The upgrade trap: workload.image.registry (registry.k8s.io) put in front of ghcr.io/acme/orders."""
    values = {"workload": {"image": {"repository": "ghcr.io/acme/orders", "tag": "1.2"}}}
    deployment = _named(render_chart(chart, values, name="jobs"), "Deployment")["jobs-elector"]
    assert _pod(deployment)["app"]["image"] == "ghcr.io/acme/orders:1.2"
    values["global"] = {"imageRegistry": "mirror.example.com"}
    deployment = _named(render_chart(chart, values, name="jobs"), "Deployment")["jobs-elector"]
    assert _pod(deployment)["app"]["image"] == "mirror.example.com/acme/orders:1.2"
