"""docs/image.md states what the Dockerfile, the package and the charts do (issue 42: its ports and
dependencies had gone stale): the port row, the base, the user, the entrypoint, the dependencies,
the image tags."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
import yaml
from dockerfile_parse import DockerfileParser

from elector._version import __version__

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "image.md").read_text()


def _instructions(name: str) -> list[str]:
    parser = DockerfileParser(path=str(REPO / "Dockerfile"))
    return [i["value"] for i in parser.structure if i["instruction"] == name]


def _row(name: str) -> str:
    (row,) = re.findall(rf"^\| {name} \| (.*) \|$", DOC, re.MULTILINE)
    return row


def test_the_port_row_names_the_exposed_port_the_sidecars_and_the_operators() -> None:
    (expose,) = _instructions("EXPOSE")
    row = _row("port")
    assert f"`{expose}`" in row and f"`EXPOSE {expose.split('/')[0]}`" in row
    library = (REPO / "helm" / "elector-sidecar" / "templates" / "_defaults.tpl").read_text()
    (sidecar,) = re.findall(r"^port: (\d+)$", library, re.MULTILINE)
    assert f"sidecar listens on `{sidecar}`" in row
    operator = (REPO / "helm" / "elector-operator" / "templates" / "deployment.yaml").read_text()
    (operator_port,) = set(re.findall(r"containerPort: (\d+)", operator))
    assert f"operator on `{operator_port}`" in row


def test_the_base_user_and_entrypoint_are_the_dockerfiles() -> None:
    base = next(v for v in _instructions("ARG") if v.startswith("PYTHON_IMAGE="))
    assert f"`{base.split('=', 1)[1]}`" in DOC
    (user,) = _instructions("USER")
    uid = user.split(":")[0]
    assert _row("user").startswith(f"UID {uid}, GID {user.split(':')[1]}")
    (entrypoint,) = _instructions("ENTRYPOINT")
    (cmd,) = _instructions("CMD")
    row = _row("entrypoint")
    assert f"`{json.dumps(json.loads(entrypoint))}`" in row
    assert f"`CMD {json.dumps(json.loads(cmd))}`" in row


@pytest.mark.parametrize("extra", [None, "kube"])
def test_the_dependencies_named_are_the_packages(extra: str | None) -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
    names = {re.split(r"[<>=\[ ]", requirement)[0] for requirement in declared}
    row = next(line for line in DOC.splitlines() if line.startswith("| `builder` |"))
    if extra is None:
        (listed,) = re.findall(r"each runtime dependency \(([^)]*) and theirs\)", row)
    else:
        (listed,) = re.findall(rf"The `{extra}` extra \(([^)]*)\)", row)
    assert set(re.split(r",\s*", listed)) == names


def test_the_tags_and_labels_are_this_release() -> None:
    assert set(re.findall(r"elector-dev/elector:([\w.\-]+)", DOC)) == {__version__}
    assert set(re.findall(r"VERSION=([\w.\-]+)", DOC)) == {__version__}
    charts = [yaml.safe_load(path.read_text()) for path in (REPO / "helm").glob("*/Chart.yaml")]
    assert {chart["appVersion"] for chart in charts} == {__version__}  # "the chart's appVersion is the tag"
