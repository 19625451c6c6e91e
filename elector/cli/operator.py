"""`elector operator`: the Kubernetes operator for LeaderElection resources (needs elector[kube]).

Its options are the shared declarations of options.py; the operator itself (and kopf with it) is
imported only when the command runs, so that `elector` works without the kube extra.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from elector.cli.options import (
    CONTEXT,
    HTTP_ADDRESS,
    IDENTITY,
    LOCK,
    LOG_FORMAT,
    LOG_LEVEL,
    REDIS_PASSWORD_FILE,
    REDIS_TLS_CA,
    REDIS_TLS_CERT,
    REDIS_TLS_KEY,
    REDIS_URL,
    TTL,
    Option,
    RedisConnection,
    invalid_setting,
    options,
    redis_connection,
    refuse_unknown_variables,
)

#: The Redis of the operator's own lease, as `elector run` takes its Redis.
OPERATOR_REDIS = (
    REDIS_URL.but(help="Redis of the operator's own hot-standby lease."),
    REDIS_PASSWORD_FILE.but(help="File holding that Redis's password."),
    REDIS_TLS_CA,
    REDIS_TLS_CERT,
    REDIS_TLS_KEY,
)
OPERATOR_OPTIONS = (
    LOCK.but(
        required=False,
        default=None,
        help="The operator replicas' own lock (default: derived from what they watch, "
        "elector-operator/namespaces/NS1.NS2 or elector-operator/cluster-wide).",
    ),
    IDENTITY,
    TTL.but(help="The operator lease's time to live: a follower takes over within it."),
    Option("namespace", multiple=True, help="Watch LeaderElections in this namespace (repeat for several)."),
    Option(
        "all_namespaces",
        is_flag=True,
        help="Watch LeaderElections in every namespace (needs cluster-wide RBAC).",
    ),
    HTTP_ADDRESS.but(help="Where /healthz and /metrics listen."),
    LOG_FORMAT.but(help=None),
    # The operator's logs know one level more than the daemon's.
    LOG_LEVEL.but(type=click.Choice(["debug", "info", "warning", "error", "critical"], case_sensitive=False)),
)


# help= and not a docstring: the image runs with PYTHONOPTIMIZE=2, which strips docstrings.
HELP = """Run the LeaderElection operator: leader pod labels, Events, status, handoffs.

Several replicas run in hot standby: only the holder of --lock runs the operator.
"""


@click.command(
    "operator",
    context_settings=CONTEXT,
    help=HELP,
    short_help="Run the Kubernetes operator for LeaderElection resources (needs elector[kube]).",
)
@redis_connection(*OPERATOR_REDIS)
@options(*OPERATOR_OPTIONS)
def operator(*, redis: RedisConnection, log_format: str, log_level: str, **params: Any) -> None:
    # Not kopf yet: command.py imports the operator (and kopf) only once the settings are checked.
    from elector.daemon.settings import SettingsError
    from elector.kube.operator import command

    refuse_unknown_variables()
    if command.kopf_missing():
        raise click.UsageError(command.INSTALL_HINT)
    try:
        settings = command.operator_settings(redis=redis.settings(), **params)
    except SettingsError as exc:
        raise invalid_setting(exc) from None
    sys.exit(command.run_operator_command(settings, log_format=log_format, log_level=log_level))
