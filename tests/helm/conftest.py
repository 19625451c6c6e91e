"""Fixtures for the Helm chart: its directory, and rendering it with the real Helm engine (helm-python-sdk).

Test modules cannot import this file (tests/conftest.py shadows the name): everything is a fixture.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from helm_python.chart import Chart

CHART_DIR = Path(__file__).resolve().parents[2] / "helm" / "elector"
CRD_PATH = CHART_DIR / "crds" / "leaderelection.yaml"
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
RELEASE = "demo"
NAMESPACE = "apps"

Render = Callable[[dict[str, Any]], list[dict[str, Any]]]


def render_documents(chart: Chart, values: dict[str, Any], *, name: str = RELEASE) -> list[dict[str, Any]]:
    """Render the chart and parse every manifest (NOTES.txt excluded) into its YAML documents."""
    manifests = chart.render(values, name=name, namespace=NAMESPACE)
    documents: list[dict[str, Any]] = []
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            continue
        documents.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return documents


@pytest.fixture(scope="session")
def chart_dir() -> Path:
    return CHART_DIR


@pytest.fixture(scope="session")
def chart(chart_dir: Path) -> Chart:
    return Chart.load(chart_dir)


@pytest.fixture(scope="session")
def render_chart() -> Callable[..., list[dict[str, Any]]]:
    """render_chart(chart, values, name=...) -> parsed documents, for other charts or release names."""
    return render_documents


@pytest.fixture(scope="session")
def render(chart: Chart) -> Render:
    """render(values) -> the parsed documents of a release "demo" in namespace "apps"."""

    def _render(values: dict[str, Any]) -> list[dict[str, Any]]:
        return render_documents(chart, values)

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
def promtool() -> str:
    """The promtool binary (Debian's prometheus package), for the alerting rules' tests."""
    path = shutil.which("promtool")
    if path is None:
        pytest.fail(
            "promtool is missing: run `bash scripts/system-deps.sh` (as root; installs Debian's prometheus)"
        )
    return path
