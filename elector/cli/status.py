"""`elector status`: who holds a lock, read without contending (once, or --watch)."""

from __future__ import annotations

import sys

import click

from elector.cli.options import CONTEXT, DURATION, RedisConnection, control_options, control_url, in_flags

# help= and not a docstring: the image runs with PYTHONOPTIMIZE=2, which strips docstrings.
HELP = """Show who holds LOCK, its fencing token and remaining TTL, and the registered candidates.

Read without contending. Exit codes: 0 read (held or free; with --watch: interrupted by
SIGINT/SIGTERM), 1 Redis unreachable or unreadable, 2 invalid settings.
"""


@click.command(context_settings=CONTEXT, help=HELP)
@control_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (one per line with --watch).")
@click.option("--timeout", type=DURATION, default="2s", show_default=True, help="Redis request timeout.")
@click.option(
    "--watch",
    is_flag=True,
    help="Follow the lock: print one line per transition (acquired, released, handoff, "
    "candidates joining or leaving) until interrupted.",
)
def status(*, redis: RedisConnection, lock: str, as_json: bool, timeout: float, watch: bool) -> None:
    import json

    from elector.control.status import StatusError, read_status, watch_status

    url = control_url(redis, lock=lock)
    if timeout <= 0:
        raise click.BadParameter("must be positive", param_hint="'--timeout'")
    try:
        if watch:
            watch_status(
                url,
                password_file=redis.password_file,
                lock=lock,
                timeout_s=timeout,
                as_json=as_json,
                emit=click.echo,
            )
            return
        click.echo(
            read_status(url, password_file=redis.password_file, lock=lock, timeout_s=timeout, as_json=as_json)
        )
    except StatusError as exc:
        if exc.usage:
            raise click.UsageError(in_flags(str(exc))) from None
        if as_json:
            click.echo(json.dumps({"lock": lock, "error": str(exc)}))
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
