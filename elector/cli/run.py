"""`elector run`: the daemon. Its settings are declared in elector/cli/options.py."""

from __future__ import annotations

import sys
from typing import Any

import click
from click.core import ParameterSource

from elector.cli.options import CONTEXT, RUN_OPTIONS, invalid_setting, options, refuse_unknown_variables

# help= and not a docstring: the image runs with PYTHONOPTIMIZE=2, which strips docstrings.
HELP = """Compete for each LOCK; lead while holding it; publish the role over HTTP and metrics.

\b
Exec mode:  elector run --lock NAME [options] -- COMMAND [ARGS...]
runs COMMAND only while this replica leads, with ELECTOR_LOCK, ELECTOR_IDENTITY,
ELECTOR_FENCING_TOKEN and ELECTOR_LEASE_TTL_MS in its environment, and stops its whole
process group before the lease could expire.

Exit codes: 0 stopped by SIGTERM/SIGINT (lease released), 1 fatal error or a second signal,
2 invalid settings, 3 leadership lost with --exit-on-loss; with --on-child-exit exit, the
command's own exit code.
"""


@click.command(context_settings=CONTEXT, help=HELP)
@options(*RUN_OPTIONS)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run(*, command: tuple[str, ...], **params: Any) -> None:
    # The daemon pulls in redis, asyncio and structlog: imported only when it runs.
    from elector.daemon.settings import SettingsError, build_settings

    refuse_unknown_variables()
    if not params["lock"] and params["locks_file"] is None:
        raise click.UsageError("invalid setting --lock: missing (give --lock NAME or set ELECTOR_LOCK)")
    # Two rules about where a value came from, which only the command line knows.
    context = click.get_current_context()
    if params["redlock_url"] and context.get_parameter_source("redis_url") is not ParameterSource.DEFAULT:
        raise invalid_setting(
            SettingsError("redlock_url", "replaces --redis-url: give the Redlock servers only")
        )
    if not command and context.get_parameter_source("on_child_exit") is not ParameterSource.DEFAULT:
        # A policy for a command that is not there is a misunderstanding, not a no-op.
        raise invalid_setting(
            SettingsError("on_child_exit", "only applies to exec mode (elector run ... -- COMMAND)")
        )
    try:
        settings = build_settings(command=command, **params)
    except SettingsError as exc:
        raise invalid_setting(exc) from None
    from elector.daemon.service import run_daemon

    sys.exit(run_daemon(settings))
