"""`elector handoff`: ask a lock's leader to hand its lease over, and wait until it has."""

from __future__ import annotations

import sys

import click

from elector.cli.options import (
    CONTEXT,
    DURATION,
    RedisConnection,
    control_options,
    control_url,
    in_flags,
    invalid_setting,
)

# help= and not a docstring: the image runs with PYTHONOPTIMIZE=2, which strips docstrings.
HELP = """Ask the leader of LOCK to stop its work and hand the lease over, and wait until it has.

Exit codes: 0 handed over within --timeout, 1 not handed over (no leader, unknown or
current --to, timeout) or Redis unreachable, 2 invalid settings.
"""


@click.command(context_settings=CONTEXT, help=HELP)
@control_options
@click.option(
    "--to",
    "to",
    metavar="IDENTITY",
    help="The candidate to hand over to (it must be a live candidate). Default: anyone but the leader.",
)
@click.option(
    "--timeout",
    type=DURATION,
    default="30s",
    show_default=True,
    help="How long to wait for the handoff to complete.",
)
@click.option(
    "--window",
    type=DURATION,
    help="How long the old leader (and with --to, every other candidate) stands back. "
    "Default: 10s, or --timeout if shorter.",
)
def handoff(
    *, redis: RedisConnection, lock: str, to: str | None, timeout: float, window: float | None
) -> None:
    from elector.control.handoff import MAX_WINDOW_S, HandoffError, run_handoff
    from elector.lease import InvalidValueError, check_identity

    url = control_url(redis, lock=lock)
    if to is not None:
        try:
            check_identity(to)
        except InvalidValueError as exc:
            from elector.daemon.settings import SettingsError

            # The identity rule, for the candidate this command names with --to.
            raise invalid_setting(SettingsError("to", str(exc))) from None
    if timeout <= 0:
        raise click.BadParameter("must be positive", param_hint="'--timeout'")
    if window is not None and not 0 < window <= MAX_WINDOW_S:
        raise click.BadParameter(f"must be positive and at most {MAX_WINDOW_S:g}s", param_hint="'--window'")
    try:
        result = run_handoff(
            url,
            password_file=redis.password_file,
            lock=lock,
            to=to,
            timeout_s=timeout,
            window_s=window,
            progress=click.echo,
        )
    except HandoffError as exc:
        if exc.usage:
            raise click.UsageError(in_flags(str(exc))) from None
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    if not result.done:
        click.echo(f"error: {result.message}", err=True)
        sys.exit(1)
    click.echo(result.message)
