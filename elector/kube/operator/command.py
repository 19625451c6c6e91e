"""The `elector operator` click command. Imports kopf only when the command runs.

`elector.cli.main` imports this module only when `elector operator` is invoked; this module imports
the operator (and so kopf) only after parsing, and says how to install kopf when it is missing.
"""

from __future__ import annotations

import asyncio
import importlib.util
import signal
import sys
from pathlib import Path

import click

from elector.backend import InvalidRedisSettingsError, RedisSettings
from elector.daemon.http import parse_http_address
from elector.daemon.logs import LOG_FORMATS, LOG_LEVELS, LogSettings, configure_logging
from elector.daemon.settings import SettingsError, parse_duration, validate_identity, validate_lock_name

INSTALL_HINT = "the operator needs kopf: pip install 'elector[kube]'"


def _env(name: str) -> str:
    return f"ELECTOR_{name.upper().replace('-', '_')}"


def kopf_missing() -> bool:
    return importlib.util.find_spec("kopf") is None


@click.command("operator", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "--redis-url",
    envvar=_env("redis-url"),
    show_envvar=True,
    default="redis://localhost:6379/0",
    show_default=True,
    help="Redis of the operator's own hot-standby lease.",
)
@click.option(
    "--redis-password-file",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar=_env("redis-password-file"),
    show_envvar=True,
    help="File holding that Redis's password.",
)
@click.option(
    "--lock",
    envvar=_env("lock"),
    show_envvar=True,
    default="elector-operator",
    show_default=True,
    help="The operator replicas' own lock.",
)
@click.option(
    "--identity",
    envvar=_env("identity"),
    show_envvar=True,
    help="This replica's name in the lock. Default: $POD_NAME, else the host name.",
)
@click.option(
    "--ttl",
    envvar=_env("ttl"),
    show_envvar=True,
    default="10s",
    show_default=True,
    help="The operator lease's time to live: a follower takes over within it.",
)
@click.option(
    "--namespace",
    "namespaces",
    multiple=True,
    envvar=_env("namespace"),
    show_envvar=True,
    help="Watch LeaderElections in this namespace (repeat for several).",
)
@click.option(
    "--all-namespaces",
    is_flag=True,
    envvar=_env("all-namespaces"),
    show_envvar=True,
    help="Watch LeaderElections in every namespace (needs cluster-wide RBAC).",
)
@click.option(
    "--http-address",
    envvar=_env("http-address"),
    show_envvar=True,
    default="0.0.0.0:8080",
    show_default=True,
    help="Where /healthz and /metrics listen.",
)
@click.option(
    "--log-format",
    type=click.Choice(LOG_FORMATS),
    envvar=_env("log-format"),
    show_envvar=True,
    default="auto",
    show_default=True,
)
@click.option(
    "--log-level",
    type=click.Choice(list(LOG_LEVELS), case_sensitive=False),
    envvar=_env("log-level"),
    show_envvar=True,
    default="info",
    show_default=True,
)
def operator_command(
    *,
    redis_url: str,
    redis_password_file: Path | None,
    lock: str,
    identity: str | None,
    ttl: str,
    namespaces: tuple[str, ...],
    all_namespaces: bool,
    http_address: str,
    log_format: str,
    log_level: str,
) -> None:
    """Run the LeaderElection operator: leader pod labels, Events, status, handoffs.

    Several replicas run in hot standby: only the holder of --lock runs the operator.
    """
    if kopf_missing():
        raise click.UsageError(INSTALL_HINT)
    try:
        validate_lock_name(lock)
        from elector.kube.operator.runner import OperatorSettings, default_identity

        who = validate_identity(identity if identity is not None else default_identity())
        ttl_s = parse_duration(ttl)
    except SettingsError as exc:
        raise click.UsageError(f"invalid setting {exc}") from None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--ttl'") from None
    try:
        http = parse_http_address(http_address)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--http-address'") from None
    redis = RedisSettings(url=redis_url, password_file=redis_password_file)
    try:
        redis.validate()
    except InvalidRedisSettingsError as exc:
        flag = "--redis-password-file" if exc.setting == "password_file" else "--redis-url"
        raise click.BadParameter(str(exc), param_hint=f"'{flag}'") from None
    flat = tuple(ns for value in namespaces for ns in value.split() if ns)
    try:
        settings = OperatorSettings(
            redis=redis,
            identity=who,
            lock=lock,
            ttl_s=ttl_s,
            namespaces=flat,
            clusterwide=all_namespaces,
            http=http,
        )
    except ValueError as exc:
        raise click.UsageError(f"invalid setting --namespace/--all-namespaces: {exc}") from None
    configure_logging(LogSettings(format=log_format, level=log_level))  # type: ignore[arg-type]
    sys.exit(asyncio.run(_main(settings)))


async def _main(settings: object) -> int:
    from elector.api import ElectorConfigError
    from elector.kube.operator.runner import OperatorSettings, run_operator

    assert isinstance(settings, OperatorSettings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await run_operator(settings, stop_flag=stop)
    except ElectorConfigError as exc:  # e.g. a ttl too short to stop kopf inside the lease
        click.echo(f"Error: invalid setting {exc}", err=True)
        return 2
    return 0
