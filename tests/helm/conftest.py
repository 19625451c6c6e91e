"""Fixtures for the Helm chart: its directory, and rendering it with the real Helm engine (helm-python-sdk).

Test modules cannot import this file (tests/conftest.py shadows the name): everything is a fixture.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_python.chart import Chart

CHART_DIR = Path(__file__).resolve().parents[2] / "helm" / "elector"
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
