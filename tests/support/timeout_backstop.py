"""A backstop behind pytest-timeout: no test, fixture set-up or teardown runs for ever.

pytest-timeout leaves two holes that a loaded CI run fell into (a worker hung 22 minutes in a
fixture's teardown):

- It cancels its timer as soon as a test fails (its `pytest_exception_interact` hook, meant for
  pdb), so the teardown of a failed test runs with no timeout at all.
- Its default "signal" method raises `Failed` from the SIGALRM handler inside whatever Python code
  runs at that moment. Inside an asyncio callback the event loop catches that exception, logs it
  and runs on; the one-shot alarm never fires again.

The backstop is a plain timer thread armed for each test's whole protocol (set-up, call and
teardown) at the test's own timeout plus a grace. When it fires it dumps every thread's stack to the
real stderr and ends the process: a stuck test becomes a crashed worker (pytest-xdist reports it
and starts another) or a failed run, never a hang. pytest-timeout still fires first in every case
it handles, with its better report.

pytest-xdist drops what a worker writes to its stderr: two loaded runs showed only "node down: Not
properly terminated". So the report also goes to a file in `REPORT_DIR_ENV`'s directory, which the
controller makes at start-up (`make_report_dir`) and prints at the end (`reports`).

A thread dump shows nothing of an asyncio test's hang: every await of the test, its fixtures and
kopf's loop is one thread sitting in select(). A loaded run's hang (test_operator_lease.py) left only
that. So, `TASKS_LEAD_S` before the test's own timeout, a second timer writes every running event
loop's tasks with the chain of awaits each is suspended in (`describe_tasks`), to the same places;
the test goes on, and pytest-timeout and the backstop fire as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import gc
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TextIO

import pytest

from elector.tasks import await_chain

#: Beyond the test's own timeout: pytest-timeout's report comes first when it can fire at all.
GRACE_S = 30.0


def timeout_of(item: pytest.Item) -> float:
    """The item's timeout in seconds as pytest-timeout reads it (marker, else the ini value); 0 = none."""
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        value = marker.args[0] if marker.args else marker.kwargs.get("timeout")
        if value is not None:
            return float(value)
    configured = item.config.getoption("timeout", None) or item.config.getini("timeout")
    return float(configured or 0)


#: Before the test's own timeout (so the awaits are shown before pytest-timeout's exception unwinds
#: them): when the running event loops' tasks are written.
TASKS_LEAD_S = 1.0

#: The directory the backstop's reports go to; inherited by the workers from the controller.
REPORT_DIR_ENV = "ELECTOR_TEST_BACKSTOP_DIR"


def make_report_dir() -> str | None:
    """In the controller (or a run without workers): a fresh directory for the workers' reports,
    returned so the caller can remove it; None if the environment names one already (the
    workers, or a user who wants the reports kept elsewhere): not ours to remove."""
    if REPORT_DIR_ENV in os.environ:
        return None
    os.environ[REPORT_DIR_ENV] = directory = tempfile.mkdtemp(prefix="elector-backstop-")
    return directory


def remove_report_dir_if_empty(directory: str | None) -> None:
    """At the end of the run: a directory with reports stays for reading; an empty one goes."""
    if directory is not None:
        with contextlib.suppress(OSError):
            os.rmdir(directory)  # fails, as it should, while it holds a report


def reports() -> list[tuple[str, str]]:
    """(file name, text) of every report written in this run."""
    directory = os.environ.get(REPORT_DIR_ENV)
    if not directory or not os.path.isdir(directory):
        return []
    return [(path.name, path.read_text(errors="replace")) for path in sorted(Path(directory).iterdir())]


def _write_report(stream: TextIO, nodeid: str, budget_s: float) -> None:
    stream.write(
        f"\ntimeout backstop: {nodeid} still running {budget_s:.0f} s after it started "
        "(its timeout was cancelled or swallowed); every thread's stack follows, then this "
        "process exits\n"
    )
    stream.flush()
    faulthandler.dump_traceback(file=stream, all_threads=True)
    stream.flush()


def _running_loops() -> list[asyncio.AbstractEventLoop]:
    """Every running event loop of the process: the test's, and any in other threads (kopf's)."""
    loops = (obj for obj in gc.get_objects() if isinstance(obj, asyncio.AbstractEventLoop))
    return [loop for loop in loops if loop.is_running()]


def describe_tasks() -> str:
    """Every running loop's tasks and the awaits each is suspended in. Read from another thread
    while the loops run: a task may finish meanwhile; it is a report, not a snapshot."""
    out: list[str] = []
    for loop in _running_loops():
        tasks = sorted(asyncio.all_tasks(loop), key=lambda t: t.get_name())
        out.append(f"event loop {loop!r}: {len(tasks)} tasks")
        for task in tasks:
            out.append(f"task {task.get_name()!r} done={task.done()}")
            out.extend(f"  {where}" for where in await_chain(task))
    return "\n".join(out) + "\n"


def _report_file(suffix: str) -> str | None:
    directory = os.environ.get(REPORT_DIR_ENV)
    if not directory:
        return None
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    return os.path.join(directory, f"{worker}-{os.getpid()}{suffix}.txt")


def _report_tasks(nodeid: str, after_s: float) -> None:
    try:
        text = (
            f"\ntimeout backstop: {nodeid} still running {after_s:.1f} s after it started, "
            f"{TASKS_LEAD_S:.0f} s before its timeout; the event loops' tasks follow (it goes on)\n"
            + describe_tasks()
        )
    except Exception as exc:  # a report must never take the test down with it
        text = f"\ntimeout backstop: {nodeid}: could not describe the tasks: {exc!r}\n"
    if sys.__stderr__ is not None:
        sys.__stderr__.write(text)
        sys.__stderr__.flush()
    path = _report_file(f"-tasks-{time.monotonic_ns()}")
    if path:
        with contextlib.suppress(OSError), open(path, "w", encoding="utf-8") as report:
            report.write(text)


def _give_up(nodeid: str, budget_s: float) -> None:
    if sys.__stderr__ is not None:
        _write_report(sys.__stderr__, nodeid, budget_s)
    path = _report_file("")
    if path:
        with contextlib.suppress(OSError), open(path, "w", encoding="utf-8") as report:
            _write_report(report, nodeid, budget_s)
    os._exit(1)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):  # type: ignore[no-untyped-def]
    timeout_s = timeout_of(item)
    if timeout_s <= 0:
        yield
        return
    budget_s = timeout_s + GRACE_S
    tasks_at_s = max(timeout_s - TASKS_LEAD_S, 0.9 * timeout_s)
    timers = [
        threading.Timer(tasks_at_s, _report_tasks, args=(item.nodeid, tasks_at_s)),
        threading.Timer(budget_s, _give_up, args=(item.nodeid, budget_s)),
    ]
    for timer in timers:
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        for timer in timers:
            timer.cancel()
