"""`elector demo`: a failover you can watch (the show itself is in failover_demo.py)."""

from __future__ import annotations

import sys

import click

from elector.cli.options import CONTEXT, TTL, options

# help= and not a docstring: the image runs with PYTHONOPTIMIZE=2, which strips docstrings.
HELP = "Watch a failover: a private Redis, several replicas, the leader killed, the takeover timed."


@click.command(context_settings=CONTEXT, help=HELP)
@click.option("--replicas", type=click.IntRange(2, 9), default=3, show_default=True)
@options(TTL.but(default="3s", help="Lease ttl of the demo replicas.", from_env=False))
@click.option(
    "--rounds", type=click.IntRange(1, 20), default=2, show_default=True, help="Leader kills to show."
)
@click.option(
    "--redis-server", "redis_server", envvar="ELECTOR_REDIS_SERVER", help="redis-server binary to use."
)
def demo(*, replicas: int, ttl: float, rounds: int, redis_server: str | None) -> None:
    # The redis-server helper: imported only when the demo runs.
    from elector.cli.failover_demo import run_demo

    sys.exit(run_demo(replicas=replicas, ttl_s=ttl, rounds=rounds, redis_server=redis_server))
