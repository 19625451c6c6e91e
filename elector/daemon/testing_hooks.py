"""Fault-injection hooks of the daemon for the test suites; off unless deliberately enabled.

`ELECTOR_TESTING_BLOCK_LOOP_ON_SIGUSR2_S=<seconds>` (0 < seconds <= 600): each SIGUSR2 then blocks
the daemon's event loop with `time.sleep(seconds)`, as a stalled loop would (a CPU-bound bug, a
hung synchronous call): no renewal, no step-down, no HTTP answer meanwhile. The fault suite uses it
to show that exec mode's keeper stops the command by the lease's deadline all the same.

Not an option and not in `--help`: it takes the variable (whose name says what it is for) AND the
signal, and the daemon logs a warning at start when it is armed. Like every `ELECTOR_*` variable it
is never passed on to the command. Without the variable, SIGUSR2 keeps its default action.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import time
from collections.abc import Mapping
from typing import Any, Protocol

BLOCK_LOOP_ENV = "ELECTOR_TESTING_BLOCK_LOOP_ON_SIGUSR2_S"
MAX_BLOCK_S = 600.0


class _Logger(Protocol):
    def warning(self, event: str, *args: Any, **kw: Any) -> Any: ...
    def error(self, event: str, *args: Any, **kw: Any) -> Any: ...


def install_loop_block_hook(
    loop: asyncio.AbstractEventLoop, *, log: _Logger, environ: Mapping[str, str] | None = None
) -> bool:
    """Arm the hook if its variable asks for it; whether it was armed."""
    raw = (os.environ if environ is None else environ).get(BLOCK_LOOP_ENV)
    if raw is None:
        return False
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (0 < seconds <= MAX_BLOCK_S):
        log.error(
            "testing_hook_refused",
            variable=BLOCK_LOOP_ENV,
            value=raw,
            expected=f"seconds in (0, {MAX_BLOCK_S:g}]",
        )
        return False
    log.warning(
        "testing_hook_armed",
        variable=BLOCK_LOOP_ENV,
        effect=f"SIGUSR2 blocks the event loop for {seconds:g}s",
    )
    loop.add_signal_handler(signal.SIGUSR2, _block, seconds, log)
    return True


def remove_loop_block_hook(loop: asyncio.AbstractEventLoop) -> None:
    loop.remove_signal_handler(signal.SIGUSR2)


def _block(seconds: float, log: _Logger) -> None:
    log.warning("testing_hook_blocking_loop", seconds=seconds)
    time.sleep(seconds)  # deliberately blocking: this IS the fault
