"""Assemble a chart with its `file://` dependencies, as `helm dependency build` would.

helm/elector depends on the library chart helm/elector-sidecar (`repository: file://../elector-sidecar`)
and there is no helm binary here: the chart tests (tests/helm/conftest.py) and the image tests
(tests/image/test_dockerfile.py) render a copy with the dependency under charts/.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml


def assemble_chart(source: Path, into: Path) -> Path:
    """Copy the chart directory `source` to `into/<its name>`, with every `file://` dependency of its
    Chart.yaml assembled the same way under charts/ (what `helm dependency build` unpacks)."""
    target = into / source.name
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("charts", "Chart.lock"))
    metadata = yaml.safe_load((source / "Chart.yaml").read_text())
    for dependency in metadata.get("dependencies") or []:
        repository = str(dependency.get("repository", ""))
        if not repository.startswith("file://"):
            raise ValueError(f"{source.name}: dependency {dependency['name']} is not file://; fetch it first")
        assemble_chart((source / repository.removeprefix("file://")).resolve(), target / "charts")
    return target
