"""The charts' READMEs, generated from Chart.yaml and the values' comments by scripts/chart_readme.py.

Issue 17, problem 9: a README per chart that cannot drift from its values. The checked-in READMEs
must be exactly what the generator writes now, and the generator must read the comment convention
(`# --` above a key, `##` above a section) the way the values files use it.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHARTS = sorted(path.parent for path in (ROOT / "helm").glob("*/Chart.yaml"))


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chart_readme", ROOT / "scripts" / "chart_readme.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("chart_readme", module)
    spec.loader.exec_module(module)
    return module


chart_readme = _load_script()


def test_every_chart_is_covered() -> None:
    assert {path.name for path in CHARTS} >= {"elector"}
    assert all(path.name.startswith("elector") for path in CHARTS)


@pytest.mark.parametrize("chart_dir", CHARTS, ids=lambda path: path.name)
def test_the_checked_in_readme_is_up_to_date(chart_dir: Path) -> None:
    readme = chart_dir / "README.md"
    assert readme.exists(), f"{readme} is missing: run `python scripts/chart_readme.py`"
    assert readme.read_text() == chart_readme.render(chart_dir), (
        f"{readme.relative_to(ROOT)} is out of date: run `python scripts/chart_readme.py`"
    )


@pytest.mark.parametrize("chart_dir", CHARTS, ids=lambda path: path.name)
def test_the_readme_documents_every_value(chart_dir: Path) -> None:
    """Every top-level value has a row; a chart's description and version head the README."""
    text = (chart_dir / "README.md").read_text()
    meta = yaml.safe_load((chart_dir / "Chart.yaml").read_text())
    assert text.startswith(chart_readme.MARKER)
    assert f"# {meta['name']}\n" in text
    assert f"| Chart version | {meta['version']} |" in text
    values_file = chart_dir / "values.yaml"
    values = yaml.safe_load(values_file.read_text()) if values_file.exists() else None
    for key in values or {}:
        assert f"| `{key}" in text, f"{key} has no row in {chart_dir.name}/README.md"
    if meta.get("type") == "library":
        assert "## Named templates" in text
    for dependency in meta.get("dependencies") or []:
        assert f"`{dependency['name']}`" in text


SAMPLE = """\
# A file comment, not a key's.

# -- Plain scalar, with <release> in it
# and a second line | with a pipe.
name: ""
## The image.
## Second line of the section.
image:
  # -- Repository.
  repository: ghcr.io/x
  # -- A mapping documented as a whole: its keys get no rows.
  resources:
    requests:
      cpu: 10m
ports:
  # -- Ports: list items are values, not keys.
  list:
    - name: http
      containerPort: 8000
undocumented: 3
# -- Documented mapping with documented keys.
nested:
  # -- Inner.
  inner: true
  plain: 1
"""


def test_the_generator_reads_the_comment_convention() -> None:
    sections = chart_readme.sections_of(SAMPLE)
    by_path = {row.path: (section.key, row) for section in sections for row in section.rows}
    assert list(by_path) == [
        "name",
        "undocumented",
        "image.repository",
        "image.resources",
        "ports.list",
        "nested",
        "nested.inner",
        "nested.plain",
    ]
    assert by_path["name"][0] is None  # no section: the "General" table
    name = by_path["name"][1]
    assert (name.type, name.default) == ("string", '`""`')
    assert name.description == "Plain scalar, with <release> in it and a second line | with a pipe."
    image = next(section for section in sections if section.key == "image")
    assert image.intro == "The image. Second line of the section."
    assert by_path["image.resources"][1].default == '`{"requests": {"cpu": "10m"}}`'
    assert by_path["ports.list"][1].default == '`[{"name": "http", "containerPort": 8000}]`'
    assert by_path["nested"][1].default == ""  # its keys have rows of their own
    assert by_path["undocumented"][1].description == ""
    assert by_path["nested.plain"][1].description == ""
    row = chart_readme._table([name])[2]
    assert "&lt;release&gt;" in row and "\\| with a pipe" in row


def test_check_mode_names_a_stale_readme(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    chart = tmp_path / "demo"
    chart.mkdir()
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: demo\nversion: 1.0.0\ntype: application\n")
    (chart / "values.yaml").write_text(SAMPLE)
    assert chart_readme.main(["--check", str(chart)]) == 1
    assert "out of date" in capsys.readouterr().err
    assert chart_readme.main([str(chart)]) == 0
    assert chart_readme.main(["--check", str(chart)]) == 0
    assert (
        '| `image.repository` | string | `"ghcr.io/x"` | Repository. |' in (chart / "README.md").read_text()
    )
