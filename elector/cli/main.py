"""The command line: `elector run`, `status`, `handoff`, `demo`, `leader-file check`, `operator`.

One module per command under elector/cli/, their settings declared once in options.py. Every
option that reads an `ELECTOR_*` environment variable shows it in --help. Invalid settings exit
with code 2 and a message naming the setting.

Importing this module loads click and the commands' declarations only: each command imports what
it needs (the daemon, redis, aiohttp, structlog; kopf) when it runs, since
`elector leader-file check`, run every second by a probe, must not pay for them.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from typing import NoReturn

import click

from elector._version import __version__
from elector.cli.demo import demo
from elector.cli.handoff import handoff
from elector.cli.leader_file import leader_file
from elector.cli.operator import operator
from elector.cli.options import CONTEXT
from elector.cli.run import run
from elector.cli.status import status

# Every command's help is a module constant passed as help=, never the function's docstring: the
# image runs with PYTHONOPTIMIZE=2, which strips docstrings (tests/cli/test_help_optimized.py).
HELP = "Leader election for Kubernetes workloads on a Redis lease."


@click.group(context_settings=CONTEXT, help=HELP)
@click.version_option(__version__, prog_name="elector")
def cli() -> None:
    pass


for _command in (run, status, handoff, demo, leader_file, operator):
    cli.add_command(_command)


def main() -> None:
    """The `elector` program. A command that ends with no thread left to join (daemon threads
    only, which the teardown would not wait for either) leaves without the interpreter's teardown
    (see `_leave`)."""
    try:
        cli(prog_name="elector")
    except SystemExit as exc:
        main_thread = threading.main_thread()
        if all(thread.daemon for thread in threading.enumerate() if thread is not main_thread):
            _leave(exc.code)
        raise


def _leave(code: object) -> NoReturn:
    """Exit with `code` as SystemExit would, minus the interpreter's teardown: atexit handlers
    (logging's flush among them) and the standard streams' flush run, then os._exit.

    The teardown (freeing every module and object) costs a stopped daemon CPU after its release,
    just when a co-located new leader's command starts (bench/execmode/handoff_trace.py traces
    it). Only when no thread needs joining.
    """
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:
        print(code, file=sys.stderr)
        status = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)
