"""Assemble a chart with its `file://` dependencies, as `helm dependency build` would.

helm/elector depends on the library chart helm/elector-sidecar (`repository: file://../elector-sidecar`)
and there is no helm binary here. The one copy of that step, used by scripts/render_kustomize.py, the
chart tests (tests/helm/conftest.py), the docs example (tests/helm/test_docs_example.py) and the image
tests: a copy of the chart with each dependency under charts/. Standalone (no elector, no test code) so a
script can import it; the tests have scripts/ on their path (pyproject.toml, pytest `pythonpath`).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml


def assemble_chart(source: Path, into: Path) -> Path:
    """Copy the chart directory `source` to `into/<its name>`, with every `file://` dependency of its
    Chart.yaml assembled the same way under charts/ (what `helm dependency build` unpacks). A charts/
    or Chart.lock already in `source` is left out: the copy holds what the sources say now."""
    target = into / source.name
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("charts", "Chart.lock"))
    metadata = yaml.safe_load((source / "Chart.yaml").read_text())
    for dependency in metadata.get("dependencies") or []:
        repository = str(dependency.get("repository", ""))
        if not repository.startswith("file://"):
            raise ValueError(f"{source.name}: dependency {dependency['name']} is not file://; fetch it first")
        location = (source / repository.removeprefix("file://")).resolve()
        if not (location / "Chart.yaml").is_file():
            raise ValueError(
                f"{source.name}: dependency {dependency['name']} names {repository}, "
                f"and {location} holds no Chart.yaml"
            )
        assemble_chart(location, target / "charts")
    return target


@contextmanager
def assembled_chart(source: Path) -> Iterator[Path]:
    """A temporary assembled copy of the chart `source` (see `assemble_chart`), removed on exit."""
    with tempfile.TemporaryDirectory(prefix=f"{source.name}-assembled-") as tmp:
        yield assemble_chart(source, Path(tmp))
