"""The timeout backstop's report survives the worker it ends (pytest-xdist drops its stderr)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import threading
import time
import types
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


def test_the_tasks_report_shows_the_awaits_a_hung_task_is_suspended_in() -> None:
    """What a thread dump cannot: the innermost await of a task in a loop of another thread."""
    ready = threading.Event()
    release: list[asyncio.Event] = []

    async def innermost_wait_here() -> None:
        release.append(asyncio.Event())
        ready.set()
        await release[0].wait()

    async def middle() -> None:
        await innermost_wait_here()

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(middle(),), daemon=True)
    thread.start()
    try:
        assert ready.wait(10)
        text = timeout_backstop.describe_tasks()
    finally:
        loop.call_soon_threadsafe(release[0].set)
        thread.join(10)
        loop.close()
    chain = [line for line in text.splitlines() if line.startswith("  ")]
    names = [line.rsplit(" in ", 1)[-1] for line in chain if not line.startswith("  awaiting")]
    assert names[:2] == ["middle", "innermost_wait_here"], text
    assert "wait" in names, text  # asyncio.Event.wait, where it actually sleeps
    assert any(line.startswith("  awaiting <Future") for line in chain), text


async def test_a_test_near_its_timeout_leaves_a_tasks_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hook's first timer fires before the test's own timeout (here 1 s: at 0.9 s) and the
    test goes on. Driven directly, so its budget does not bound this test's."""
    monkeypatch.setenv(timeout_backstop.REPORT_DIR_ENV, str(tmp_path))
    item = types.SimpleNamespace(
        nodeid="tests/x.py::test_near", get_closest_marker=lambda name: pytest.mark.timeout(1.0).mark
    )
    protocol = timeout_backstop.pytest_runtest_protocol(item, None)  # type: ignore[arg-type]
    next(protocol)  # the timers start

    def first_report() -> list[Path]:
        deadline = time.monotonic() + 30
        while not (found := list(tmp_path.iterdir())) and time.monotonic() < deadline:
            time.sleep(0.05)
        return found

    async def parked_here() -> list[Path]:
        return await asyncio.to_thread(first_report)

    try:
        [report] = await parked_here()
    finally:
        protocol.close()  # the timers stop; the backstop's exit never fires
    assert "-tasks-" in report.name
    text = report.read_text()
    assert "tests/x.py::test_near still running 0.9 s after it started" in text, text
    assert "in parked_here" in text, text  # this very test's loop, seen from the timer's thread
