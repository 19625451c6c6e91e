"""What `elector operator` runs: its settings checked, then the operator until a signal.

The command line (options, help) is `elector.cli.operator`, which imports this module only when
the command is invoked. This module imports the operator (and so kopf) only after the settings
are checked; `kopf_missing` lets the command say how to install kopf instead.
"""

from __future__ import annotations

import asyncio
import importlib.util
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from elector.backend import InvalidRedisSettingsError, RedisSettings
from elector.daemon.http import parse_http_address
from elector.daemon.logs import LogSettings, configure_logging
from elector.daemon.settings import SettingsError, invalid
from elector.lease import InvalidValueError, check_identity, check_lock_name, default_identity

if TYPE_CHECKING:
    from elector.kube.operator.runner import OperatorSettings

INSTALL_HINT = "the operator needs kopf: pip install 'elector[kube]'"


def kopf_missing() -> bool:
    return importlib.util.find_spec("kopf") is None


def operator_settings(
    *,
    redis: RedisSettings,
    lock: str | None,
    identity: str | None,
    ttl: float,
    namespace: Sequence[str],
    all_namespaces: bool,
    http_address: str,
) -> OperatorSettings:
    """The operator's settings, checked; raises SettingsError naming the first bad one.

    The keywords are the command's settings, named as `elector run` names the same ones.
    """
    from elector.kube.operator.runner import OperatorSettings, default_operator_lock

    # A variable's blanks separate namespaces; so may a flag's.
    flat = tuple(ns for value in namespace for ns in value.split() if ns)
    if lock is None:
        lock = default_operator_lock(flat, clusterwide=all_namespaces)
    try:
        check_lock_name(lock)
        who = check_identity(identity if identity is not None else default_identity())
        redis.validate()
    except (InvalidValueError, InvalidRedisSettingsError) as exc:
        raise invalid(exc) from None
    try:
        http = parse_http_address(http_address)
    except ValueError as exc:
        raise SettingsError("http_address", str(exc)) from None
    try:
        return OperatorSettings(
            redis=redis,
            identity=who,
            lock=lock,
            ttl_s=ttl,
            namespaces=flat,
            clusterwide=all_namespaces,
            http=http,
        )
    except ValueError as exc:
        raise SettingsError(("namespace", "all_namespaces"), str(exc)) from None


def run_operator_command(settings: OperatorSettings, *, log_format: str, log_level: str) -> int:
    """Run the operator until SIGTERM or SIGINT; the process's exit code."""
    configure_logging(LogSettings(format=log_format, level=log_level))  # type: ignore[arg-type]
    return asyncio.run(_main(settings))


async def _main(settings: OperatorSettings) -> int:
    from elector.kube.operator.runner import run_operator
    from elector.library.elector import ElectorConfigError

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await run_operator(settings, stop_flag=stop)
    except ElectorConfigError as exc:  # e.g. a ttl too short to stop kopf inside the lease
        print(f"Error: invalid setting {exc}", file=sys.stderr)
        return 2
    return 0
