"""`elector leader-file check`: the exec probe of a sidecar, on the file `elector run` keeps.

Run every second: it imports a few standard-library modules only (no redis, aiohttp, structlog).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from elector.cli.options import CONTEXT

# help= and not docstrings: the image runs with PYTHONOPTIMIZE=2, which strips docstrings.
HELP = "Read the file `elector run --leader-file` keeps (from any container sharing its volume)."
CHECK_HELP = """Exit 0 only if PATH says this replica leads and its validity end is still ahead.

`is_leader: true` alone is not enough: a daemon killed by SIGKILL leaves it behind while
another replica leads. The file's `valid_until_ms` (wall clock) ends before the lease can
expire on Redis, so two replicas never pass this check at once. Cheap enough for an exec
probe every second.

Exit codes: 0 leading (one line on stdout), 1 not leading or its validity ended (the reason,
one line on stderr), 2 bad usage, or PATH unreadable or not a leader file.
"""


@click.group("leader-file", context_settings=CONTEXT, help=HELP)
def leader_file() -> None:
    pass


@leader_file.command("check", context_settings=CONTEXT, help=CHECK_HELP)
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
def check(path: Path) -> None:
    from elector.daemon.leader_file_check import LeaderFileUnusable, check_leader_file

    try:
        verdict = check_leader_file(path)
    except LeaderFileUnusable as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    if not verdict.leading:
        click.echo(verdict.reason, err=True)
        sys.exit(1)
    click.echo(verdict.reason)
