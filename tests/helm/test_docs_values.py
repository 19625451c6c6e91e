"""Docs that cannot go stale: every values path and `--set` key that README.md, docs/ and the rendered
NOTES.txt name exists in the schema of the chart it belongs to, and every link of CHANGELOG.md resolves.

- `--set KEY=...` in a `helm install|upgrade|template` command: KEY against the schema of the chart the
  command names (`helm/elector`, `helm/elector-operator`, a parent chart with the library under `leader`).
- a backticked dotted path (`elector.gateOnLeadership`, `rbac.secretNames`) whose first part is a top-level
  value of a chart: it must exist in one of the charts that have that top-level value (helm/elector's
  values.schema.json, helm/elector-operator's, or the library's defaults). Template names
  (`elector-sidecar.container`) and the 0.1.0 names of the upgrade table are not values.
- the NOTES of both charts, rendered for several value sets: every `key.path=` they tell the user to set.
"""

from __future__ import annotations

import json
import pkgutil
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_python.chart import Chart

from tests.helm.operator_support import notes as operator_notes

REPO = Path(__file__).resolve().parents[2]
HELM = REPO / "helm"
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted(HELM.glob("*/README.md"))]
#: Sections that name values of chart 0.1.0 on purpose (the migration table).
HISTORICAL = re.compile(r"^## Upgrading from chart 0\.1\.0$.*?(?=^## )", re.S | re.M)
TEMPLATE_NAMESPACES = {"elector-sidecar", "elector-operator"}
PATH = re.compile(r"`([A-Za-z][A-Za-z0-9_-]*(?:\.[A-Za-z0-9_-]+)+)(?:=[^`]*)?`")
SET = re.compile(r"--set(?:-string)?[ =]'?([A-Za-z][A-Za-z0-9_.-]*)(?:\[\d+\])?=")
HELM_COMMAND = re.compile(
    r"helm (?:install|upgrade|template)\b(?:[^\n\\]|\\(?!\n))*(?:\\\n(?:[^\n\\]|\\(?!\n))*)*"
)
NotesRender = Callable[..., str]


def _library_schema() -> dict[str, Any]:
    """A schema-like tree of the library's defaults (every key, no types)."""
    text = (HELM / "elector-sidecar" / "templates" / "_defaults.tpl").read_text()
    body = text[text.index('{{- define "elector-sidecar.defaults" -}}') :].split("\n", 1)[1]
    defaults = yaml.safe_load(body[: body.index("{{- end }}")])

    def tree(node: Any) -> dict[str, Any]:
        if isinstance(node, dict):
            return {"type": "object", "properties": {k: tree(v) for k, v in node.items()}}
        return {}

    return tree(defaults)


SCHEMAS: dict[str, dict[str, Any]] = {
    "helm/elector": json.loads((HELM / "elector" / "values.schema.json").read_text()),
    "helm/elector-operator": json.loads((HELM / "elector-operator" / "values.schema.json").read_text()),
    "elector-sidecar": _library_schema(),
}


def resolves(schema: dict[str, Any], path: str) -> bool:
    node = schema
    for part in path.split("."):
        properties = node.get("properties")
        if properties is None:
            # a free-form map (labels, annotations, resources...) takes any key below it
            return node.get("type") == "object" and node.get("additionalProperties", True) is not False
        if part not in properties:
            return False
        node = properties[part]
    return True


def _chart_of(command: str) -> str:
    if "elector-operator" in command:
        return "helm/elector-operator"
    if re.search(r"helm/elector\b", command):
        return "helm/elector"
    if re.search(r" \./(?!helm/)[\w-]+", command):
        return "parent"  # the docs' own parent chart (./billing)
    return "any"  # a command in prose that names no chart


def _text(path: Path) -> str:
    return HISTORICAL.sub("", path.read_text())


def set_keys() -> Iterator[tuple[str, str, str]]:
    """(file, chart, key) of every --set in a helm command of the docs."""
    for doc in DOCS:
        for command in HELM_COMMAND.findall(_text(doc)):
            for key in SET.findall(command):
                yield doc.relative_to(REPO).as_posix(), _chart_of(command), key


#: Loggers the docs name (the library logs under `elector.api`, a name kept for its users' logging
#: configuration though no module of that name exists any more).
LOGGER_NAMES = {"elector.api", "elector.http", "elector.supervisor"}


def _python_or_api_name(path: str) -> bool:
    """A Python name (`elector.FencedStore`, `redis.asyncio.Redis`), a module's file name
    (`elector.py`), a logger's name (`elector.api`) or an API group (`elector.io`)."""
    if path.rsplit(".", 1)[-1] in {"io", "com", "org", "dev", "py"} or path in LOGGER_NAMES:
        return True
    try:
        pkgutil.resolve_name(path)
    except (ImportError, AttributeError, ValueError):
        return False
    return True


def value_paths() -> Iterator[tuple[str, str]]:
    for doc in DOCS:
        for path in PATH.findall(_text(doc)):
            if path.split(".")[0] not in TEMPLATE_NAMESPACES and not _python_or_api_name(path):
                yield doc.relative_to(REPO).as_posix(), path


def owners(path: str) -> list[str]:
    first = path.split(".", maxsplit=1)[0]
    return [name for name, schema in SCHEMAS.items() if first in schema.get("properties", {})]


def test_every_set_key_of_a_helm_command_is_in_the_charts_schema() -> None:
    found = list(set_keys())
    assert len(found) >= 5  # the extraction works
    stale = []
    for doc, chart, key in found:
        if chart == "parent":  # the docs' parent charts keep the library under `leader`
            ok = key.startswith("leader.") and resolves(
                SCHEMAS["elector-sidecar"], key.removeprefix("leader.")
            )
        elif chart == "any":
            ok = any(resolves(schema, key) for name, schema in SCHEMAS.items() if name != "elector-sidecar")
        else:
            ok = resolves(SCHEMAS[chart], key)
        if not ok:
            stale.append(f"{doc}: --set {key} ({chart})")
    assert stale == []


def test_every_values_path_the_docs_name_exists() -> None:
    checked, stale = 0, []
    for doc, path in value_paths():
        charts = owners(path)
        if not charts:
            continue  # not a value: a field of a Kubernetes object, a file name, a metric...
        checked += 1
        if not any(resolves(SCHEMAS[chart], path) for chart in charts):
            stale.append(f"{doc}: `{path}` ({', '.join(charts)})")
    assert checked >= 50  # the extraction works
    assert stale == []


NOTES_VALUE = re.compile(r"(?<![\w./-])([a-z][A-Za-z]*(?:\.[A-Za-z]+)+)=")


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"leaderElection": {"enabled": False}},
        {"elector": {"readinessProbe": {"enabled": False}}},
        {"elector": {"gateOnRedis": True}},
        {
            "serviceMonitor": {"enabled": True},
            "podMonitor": {"enabled": True},
            "prometheusRule": {"enabled": True},
        },
    ],
)
def test_the_elector_notes_name_only_real_values(
    chart: Chart, render_notes: NotesRender, values: dict[str, Any]
) -> None:
    notes = render_notes(chart, values)
    for line in notes.splitlines():
        # a command for the operator's chart takes its values
        schema = SCHEMAS["helm/elector-operator" if "elector-operator" in line else "helm/elector"]
        for key in NOTES_VALUE.findall(line):
            assert resolves(schema, key), f"NOTES.txt names {key}= in {line.strip()!r}"


@pytest.mark.parametrize("values", [{}, {"clusterWide": True}, {"preDeleteHook": {"enabled": False}}])
def test_the_operator_notes_name_only_real_values(values: dict[str, Any]) -> None:
    for key in NOTES_VALUE.findall(operator_notes(values)):
        assert resolves(SCHEMAS["helm/elector-operator"], key), f"NOTES.txt names {key}="


def _anchors(markdown: str) -> set[str]:
    anchors = set()
    for heading in re.findall(r"^#+ (.+)$", markdown, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


def test_every_link_of_the_changelog_resolves() -> None:
    changelog = REPO / "CHANGELOG.md"
    links = re.findall(r"\]\(([^)\s]+)\)", changelog.read_text())
    assert links
    broken = []
    for link in links:
        if link.startswith(("http://", "https://")):
            continue
        target, _, anchor = link.partition("#")
        file = (changelog.parent / target) if target else changelog
        if not file.exists() or (anchor and anchor not in _anchors(file.read_text())):
            broken.append(link)
    assert broken == []


def test_every_section_the_changelog_names_exists() -> None:
    """`see docs/helm.md, "Some section"` in prose, not as a link: the section must exist under that name.
    (0.2.0's entry pointed to "Coming from the single chart", a section called otherwise.)"""
    changelog = (REPO / "CHANGELOG.md").read_text()
    references = re.findall(r"(docs/[\w-]+\.md)[^\"\n()]{0,4}\"([^\"]+)\"", changelog)
    assert references
    for doc, section in references:
        headings = re.findall(r"^#+ (.+)$", (REPO / doc).read_text(), re.M)
        found = any(heading.strip().startswith(section) for heading in headings)
        assert found, f"{doc}: no section {section!r}"
