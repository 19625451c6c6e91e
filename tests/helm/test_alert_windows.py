"""The alerts at their exact thresholds, evaluated between scrapes (promtool, alerts_windows.test.yaml).

alerts.test.yaml steps in aligned 30 s intervals, where increase() never extrapolates; a real
Prometheus evaluates between scrapes, where it does. These cases pin each threshold that is too
long to reach in a live CI run to the evaluation where it must flip, and mutants prove that a
threshold or `for:` off by one step (or a `> 2` of ElectorLeadershipFlapping, which would fire
on the second loss) makes them fail.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
RULES = HERE.parents[1] / "helm" / "elector" / "files" / "alerts.rules.yaml"
WINDOWS = HERE / "alerts_windows.test.yaml"


def _run(promtool: str, directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, "test", "rules", WINDOWS.name],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_thresholds_hold_between_scrapes(promtool: str) -> None:
    result = _run(promtool, HERE)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("alert", "old", "new"),
    [
        # The defect of a whole-number threshold: increase() reads 2 losses as 2.0x between scrapes.
        ("ElectorLeadershipFlapping", "> 2.5", "> 2"),
        ("ElectorLeadershipFlapping", "> 2.5", "> 3.5"),
        ("ElectorRedisUnreachable", "for: 2m", "for: 110s"),
        ("ElectorRedisUnreachable", "for: 2m", "for: 130s"),
        ("ElectorRenewalsFailing", "for: 10m", "for: 590s"),
        ("ElectorRenewalsFailing", "for: 10m", "for: 610s"),
    ],
)
def test_a_threshold_one_step_off_fails(
    promtool: str, tmp_path: Path, alert: str, old: str, new: str
) -> None:
    text = RULES.read_text()
    start = text.index(f"- alert: {alert}\n")
    end = text.find("- alert:", start + 1)
    end = len(text) if end < 0 else end
    rule = text[start:end]
    assert rule.count(old) == 1, f"{alert} no longer has {old!r}: update this test"
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / RULES.name).write_text(text[:start] + rule.replace(old, new) + text[end:])
    tests = WINDOWS.read_text().replace("../../helm/elector/files/alerts.rules.yaml", f"rules/{RULES.name}")
    (tmp_path / WINDOWS.name).write_text(tests)
    result = _run(promtool, tmp_path)
    assert result.returncode != 0, f"the window tests still pass with {alert} {new}"
    assert f"alertname: {alert}," in result.stdout + result.stderr
