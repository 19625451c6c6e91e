"""scripts/chart_assembly.py: the one `helm dependency build` stand-in of the renderer, the tests and the
docs example -- what the copy holds, and a clear error for a dependency it cannot assemble."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from chart_assembly import assemble_chart, assembled_chart

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "elector"
LIBRARY = ROOT / "helm" / "elector-sidecar"


def write_chart(directory: Path, *, dependencies: list[dict[str, str]]) -> Path:
    directory.mkdir(parents=True)
    metadata = {"apiVersion": "v2", "name": directory.name, "version": "1.0.0", "dependencies": dependencies}
    (directory / "Chart.yaml").write_text(yaml.safe_dump(metadata))
    return directory


def test_the_copy_holds_the_library_and_no_stale_build(tmp_path: Path) -> None:
    source = write_chart(
        tmp_path / "src" / "app",
        dependencies=[{"name": "elector-sidecar", "repository": f"file://{LIBRARY}"}],
    )
    (source / "charts" / "old").mkdir(parents=True)  # what an earlier `helm dependency build` left
    (source / "Chart.lock").write_text("stale\n")
    built = assemble_chart(source, tmp_path / "out")
    assert built == tmp_path / "out" / "app"
    assert sorted(p.name for p in (built / "charts").iterdir()) == ["elector-sidecar"]
    assert not (built / "Chart.lock").exists()
    library = yaml.safe_load((built / "charts" / "elector-sidecar" / "Chart.yaml").read_text())
    assert library["type"] == "library"


def test_the_temporary_copy_is_removed_on_exit() -> None:
    with assembled_chart(CHART) as built:
        assert (built / "charts" / "elector-sidecar" / "Chart.yaml").is_file()
    assert not built.exists()


@pytest.mark.parametrize(
    ("repository", "message"),
    [
        ("https://charts.example.com", "dependency lib is not file://; fetch it first"),
        ("file://../nowhere", "dependency lib names file://../nowhere, and "),
    ],
)
def test_a_dependency_it_cannot_assemble_is_named(tmp_path: Path, repository: str, message: str) -> None:
    source = write_chart(tmp_path / "app", dependencies=[{"name": "lib", "repository": repository}])
    with pytest.raises(ValueError, match=message):
        assemble_chart(source, tmp_path / "out")
