"""The timeout backstop's report survives the worker it ends (pytest-xdist drops its stderr)."""

from __future__ import annotations

import os
import shutil
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


def test_a_directory_named_in_the_environment_is_used_and_never_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    given = tmp_path / "kept"
    given.mkdir()
    monkeypatch.setenv(timeout_backstop.REPORT_DIR_ENV, str(given))
    made = timeout_backstop.make_report_dir()
    assert made is None and os.environ[timeout_backstop.REPORT_DIR_ENV] == str(given)
    timeout_backstop.remove_report_dir_if_empty(made)
    assert given.is_dir()  # empty, but not ours to remove


def test_a_directory_made_here_goes_when_empty_and_stays_with_a_report(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(timeout_backstop.REPORT_DIR_ENV, raising=False)
    made = timeout_backstop.make_report_dir()
    assert made is not None and os.environ[timeout_backstop.REPORT_DIR_ENV] == made
    timeout_backstop.remove_report_dir_if_empty(made)
    assert not os.path.exists(made)
    monkeypatch.delenv(timeout_backstop.REPORT_DIR_ENV)
    made = timeout_backstop.make_report_dir()
    assert made is not None
    (Path(made) / "gw0-1.txt").write_text("timeout backstop: ...")
    timeout_backstop.remove_report_dir_if_empty(made)
    assert os.path.isdir(made)  # a report in it: kept for reading
    shutil.rmtree(made)
