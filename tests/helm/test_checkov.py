"""checkov (a security scanner for Kubernetes manifests) over every rendered value set of the charts: 0 failed
checks. A check the charts skip is skipped inline, in the template, with its reason (annotations
`checkov.io/skipN: ID=reason`); this test also refuses a skip without a reason.

helm/elector and helm/elector-operator are rendered with each of their ci/*-values.yaml; the library
elector-sidecar renders only inside a chart, and helm/elector includes it exactly as any chart does.
checkov lives in a virtualenv of its own, in the user cache (~/.cache/elector/checkov-VERSION, made
by scripts/checkov-venv.sh on first use): its pinned dependencies conflict with the project's.
When it cannot be had, the test fails saying why.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_python.chart import Chart

from tests.helm.operator_support import OPERATOR_CHART_DIR, render_operator
from tests.support.tiers import CHECKOV, needs

REPO = Path(__file__).resolve().parents[2]
#: The first use builds checkov's virtualenv (2-4 min on a quiet machine, over 120 s on a loaded
#: one) inside the test's set-up, and one checkov run per value set follows: the suite's default
#: timeout of 120 s is for our own code, not for a pip install; the script's own 900 s bounds it.
pytestmark = pytest.mark.timeout(900 + 300)
RenderChart = Callable[..., list[dict[str, Any]]]
SKIP = re.compile(r"^(CKV2?_K8S_\d+)=(.{20,})$")


@pytest.fixture(scope="module")
@needs(CHECKOV)
def checkov() -> str:
    try:
        result = subprocess.run(
            ["bash", str(REPO / "scripts" / "checkov-venv.sh")],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(
            "scripts/checkov-venv.sh did not finish within 900 s "
            "(pip install checkov into its own venv in ~/.cache/elector)"
        )
    if result.returncode != 0:
        pytest.fail(
            "checkov is missing and scripts/checkov-venv.sh could not install it "
            "into its own venv in ~/.cache/elector "
            f"(PyPI reachable?):\n{result.stderr[-2000:]}"
        )
    return str(REPO / result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def rendered(chart: Chart, render_chart: RenderChart, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One file of manifests per chart and value set."""
    into = tmp_path_factory.mktemp("checkov")
    for values_file in sorted((REPO / "helm" / "elector" / "ci").glob("*-values.yaml")):
        docs = render_chart(chart, yaml.safe_load(values_file.read_text()) or {})
        (into / f"elector-{values_file.stem}.yaml").write_text(yaml.safe_dump_all(docs))
    for values_file in sorted((OPERATOR_CHART_DIR / "ci").glob("*-values.yaml")):
        docs = render_operator(yaml.safe_load(values_file.read_text()) or {})
        (into / f"elector-operator-{values_file.stem}.yaml").write_text(yaml.safe_dump_all(docs))
    return into


def test_checkov_finds_no_failed_check(checkov: str, rendered: Path) -> None:
    result = subprocess.run(
        [checkov, "--directory", str(rendered), "--framework", "kubernetes", "--quiet", "--output", "json"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    reports = json.loads(result.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    failed = [
        f"{check['check_id']} {check['check_name']}: {check['resource']} ({Path(check['file_path']).name})"
        for report in reports
        for check in report["results"]["failed_checks"]
    ]
    passed = sum(report["summary"]["passed"] for report in reports)
    assert passed > 100, result.stdout[-2000:] + result.stderr[-2000:]  # checkov did look at them
    assert failed == []


def test_every_skip_names_its_check_and_reason(rendered: Path) -> None:
    skips = 0
    for manifest in rendered.glob("*.yaml"):
        for doc in yaml.safe_load_all(manifest.read_text()):
            for key, value in ((doc or {}).get("metadata", {}).get("annotations") or {}).items():
                if key.startswith("checkov.io/skip"):
                    skips += 1
                    assert SKIP.match(value), (
                        f"{manifest.name} {doc['kind']}: {key}: {value!r} needs ID=reason"
                    )
    assert skips > 0
