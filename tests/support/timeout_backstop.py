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
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading

import pytest

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


def _give_up(nodeid: str, budget_s: float) -> None:
    stream = sys.__stderr__
    if stream is not None:
        stream.write(
            f"\ntimeout backstop: {nodeid} still running {budget_s:.0f} s after it started "
            "(its timeout was cancelled or swallowed); every thread's stack follows, then this "
            "process exits\n"
        )
        stream.flush()
        faulthandler.dump_traceback(file=stream, all_threads=True)
        stream.flush()
    os._exit(1)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):  # type: ignore[no-untyped-def]
    timeout_s = timeout_of(item)
    if timeout_s <= 0:
        yield
        return
    budget_s = timeout_s + GRACE_S
    timer = threading.Timer(budget_s, _give_up, args=(item.nodeid, budget_s))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
