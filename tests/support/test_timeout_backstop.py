"""The timeout backstop's report survives the worker it ends (pytest-xdist drops its stderr)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import timeout_backstop

REPO = Path(__file__).resolve().parents[2]


def test_a_backstop_exit_leaves_its_report_in_the_runs_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {**os.environ, timeout_backstop.REPORT_DIR_ENV: str(tmp_path), "PYTEST_XDIST_WORKER": "gw7"}
    code = "from tests.support.timeout_backstop import _give_up; _give_up('tests/x.py::test_stuck', 150.0)"
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    assert "tests/x.py::test_stuck still running 150 s" in result.stderr  # as before, on stderr
    monkeypatch.setenv(timeout_backstop.REPORT_DIR_ENV, str(tmp_path))
    [(name, text)] = timeout_backstop.reports()
    assert name == f"gw7-{name.split('-')[1]}" and name.endswith(".txt")
    assert "tests/x.py::test_stuck still running 150 s" in text
    assert "Current thread" in text  # every thread's stack, the one that gave up among them


def test_no_directory_no_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(timeout_backstop.REPORT_DIR_ENV, raising=False)
    assert timeout_backstop.reports() == []
