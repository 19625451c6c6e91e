"""`elector.run(main())`: asyncio.run, with SIGTERM unwinding the program as Ctrl-C does.

A plain `asyncio.run(main())` dies on SIGTERM (what Kubernetes, systemd and Docker send) with its
lease held: the successor waits for the ttl. Here SIGTERM cancels the main task, so the
`async with` blocks of the Elector and of `leadership()` release the lease on their way out, and
the process then exits with status 143 (128 + SIGTERM). SIGINT keeps asyncio's own handling.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

#: The exit status after SIGTERM (128 + 15, as a shell reports a process killed by it).
SIGTERM_EXIT_CODE = 128 + signal.SIGTERM


def run(main: Coroutine[Any, Any, T], *, debug: bool | None = None) -> T:
    """Run `main` to completion like `asyncio.run`; SIGTERM cancels it, then exits with 143.

    The handler is installed on the loop for the duration of the run only (main thread).
    """
    received: list[int] = []

    async def guarded() -> T:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None

        def on_sigterm() -> None:
            received.append(signal.SIGTERM)
            task.cancel(msg="SIGTERM")

        loop.add_signal_handler(signal.SIGTERM, on_sigterm)
        try:
            return await main
        finally:
            loop.remove_signal_handler(signal.SIGTERM)

    with asyncio.Runner(debug=debug) as runner:
        try:
            return runner.run(guarded())
        except asyncio.CancelledError:
            if received:
                raise SystemExit(SIGTERM_EXIT_CODE) from None
            raise
