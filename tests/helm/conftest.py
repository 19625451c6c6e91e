"""Fixtures for the Helm chart: its directory, and rendering it with the real Helm engine (helm-python-sdk).

helm/elector depends on the library chart helm/elector-sidecar (`repository: file://../elector-sidecar`).
There is no `helm dependency build` here: `assemble` (scripts/chart_assembly.py) copies a chart with its
file:// dependencies under charts/, as that command would, and `chart` is helm/elector assembled that way.

Test modules cannot import this file (tests/conftest.py shadows the name): everything is a fixture.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from chart_assembly import assemble_chart  # scripts/chart_assembly.py
from helm_python import _native
from helm_python.chart import Chart

from tests.support.tiers import PROMETHEUS, needs

CHART_DIR = Path(__file__).resolve().parents[2] / "helm" / "elector"
LIBRARY_DIR = CHART_DIR.parent / "elector-sidecar"
CRD_PATH = CHART_DIR.parent / "elector-operator" / "files" / "leaderelection-crd.yaml"
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
RELEASE = "demo"
NAMESPACE = "apps"

Render = Callable[..., list[dict[str, Any]]]


def render_manifests(
    chart: Chart,
    values: dict[str, Any],
    *,
    name: str = RELEASE,
    namespace: str = NAMESPACE,
    kube_version: str | None = None,
    api_versions: list[str] | None = None,
) -> dict[str, str]:
    """chart.render, plus the engine's Capabilities (KubeVersion, APIVersions) that Chart.render does not
    expose: the native call takes them as render options (default: the engine's own Kubernetes version)."""
    if kube_version is None and api_versions is None:
        return chart.render(values, name=name, namespace=namespace)
    options: dict[str, Any] = {"name": name, "namespace": namespace}
    if kube_version is not None:
        options["kube_version"] = kube_version if kube_version.startswith("v") else f"v{kube_version}"
    if api_versions is not None:
        options["api_versions"] = api_versions
    rendered = _native.call_string("helm_render", chart._raw(), json.dumps(values), json.dumps(options))
    manifests: dict[str, str] = json.loads(rendered)
    return manifests


def render_documents(
    chart: Chart,
    values: dict[str, Any],
    *,
    name: str = RELEASE,
    namespace: str = NAMESPACE,
    **capabilities: Any,
) -> list[dict[str, Any]]:
    """Render the chart and parse every manifest (NOTES.txt excluded) into its YAML documents.
    `kube_version` ("1.30.0") and `api_versions` (["elector.io/v1alpha1"]) set the engine's Capabilities."""
    manifests = render_manifests(chart, values, name=name, namespace=namespace, **capabilities)
    documents: list[dict[str, Any]] = []
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            continue
        documents.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return documents


@pytest.fixture(scope="session")
def chart_dir() -> Path:
    """The source of helm/elector (read its files here; render and lint `built_chart_dir`)."""
    return CHART_DIR


@pytest.fixture(scope="session")
def library_dir() -> Path:
    """The source of the library chart helm/elector-sidecar."""
    return LIBRARY_DIR


@pytest.fixture(scope="session")
def assemble() -> Callable[[Path, Path], Path]:
    """assemble(source, into) -> a copy of the chart `source` in `into`, file:// dependencies in charts/."""
    return assemble_chart


@pytest.fixture(scope="session")
def built_chart_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """helm/elector with helm/elector-sidecar under charts/, as after `helm dependency build`."""
    return assemble_chart(CHART_DIR, tmp_path_factory.mktemp("built"))


@pytest.fixture(scope="session")
def chart(built_chart_dir: Path) -> Chart:
    return Chart.load(built_chart_dir)


@pytest.fixture(scope="session")
def render_chart() -> Callable[..., list[dict[str, Any]]]:
    """render_chart(chart, values, name=..., kube_version=..., api_versions=...) -> parsed documents, for
    other charts, release names or Capabilities."""
    return render_documents


@pytest.fixture(scope="session")
def render_notes() -> Callable[..., str]:
    """render_notes(chart, values, **capabilities) -> the rendered NOTES.txt of a release "demo"."""

    def _notes(chart: Chart, values: dict[str, Any], **capabilities: Any) -> str:
        manifests = render_manifests(chart, values, **capabilities)
        return next(text for path, text in manifests.items() if path.endswith("/templates/NOTES.txt"))

    return _notes


@pytest.fixture(scope="session")
def render(chart: Chart) -> Render:
    """render(values, kube_version=..., api_versions=...) -> the parsed documents of a release "demo" in
    namespace "apps" (Capabilities: the engine's defaults unless given)."""

    def _render(values: dict[str, Any], **capabilities: Any) -> list[dict[str, Any]]:
        return render_documents(chart, values, **capabilities)

    return _render


def _no_unknown_fields(node: Any) -> Any:
    """A copy of an OpenAPI schema in which every object with `properties` refuses other keys.

    The API server prunes unknown fields of a structural schema silently; a chart that renders one has a
    bug the cluster would hide, so the tests treat it as an error.
    """
    if isinstance(node, list):
        return [_no_unknown_fields(item) for item in node]
    if not isinstance(node, dict):
        return node
    copy = {key: _no_unknown_fields(value) for key, value in node.items()}
    if "properties" in copy and "additionalProperties" not in copy:
        copy["additionalProperties"] = False
    return copy


@pytest.fixture(scope="session")
def validate_leader_election() -> Callable[[dict[str, Any]], None]:
    """validate(doc): a rendered LeaderElection against the CRD's openAPIV3Schema, strictly (no unknown
    fields), plus the object envelope. Raises jsonschema.ValidationError."""
    crd = yaml.safe_load(CRD_PATH.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["served"]]
    schema = _no_unknown_fields(version["schema"]["openAPIV3Schema"])
    schema["required"] = ["apiVersion", "kind", "metadata", *schema.get("required", [])]
    schema["properties"] |= {
        "apiVersion": {"enum": [f"{crd['spec']['group']}/{version['name']}"]},
        "kind": {"enum": [crd["spec"]["names"]["kind"]]},
        "metadata": {
            "type": "object",
            "additionalProperties": False,
            "required": ["name", "namespace"],
            "properties": {
                "name": {"type": "string", "maxLength": 253, "pattern": _DNS_SUBDOMAIN},
                "namespace": {"type": "string", "pattern": _DNS_SUBDOMAIN},
                "labels": {"type": "object", "additionalProperties": {"type": "string", "maxLength": 63}},
                "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
    }
    # OpenAPI v3.0 (exclusiveMinimum as a boolean) is JSON Schema draft 4 in this respect.
    validator = jsonschema.Draft4Validator(schema)

    def _validate(doc: dict[str, Any]) -> None:
        validator.validate(doc)

    return _validate


@pytest.fixture(scope="session")
@needs(PROMETHEUS)
def promtool() -> str:
    """The promtool binary (Debian's prometheus package), for the alerting rules' tests."""
    path = shutil.which("promtool")
    if path is None:
        pytest.fail(
            "promtool is missing: run `bash scripts/system-deps.sh` (as root; installs Debian's prometheus)"
        )
    return path
