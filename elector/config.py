"""The daemon's settings, grouped by the part they configure, and their validation.

Each group is owned by its layer (RedisSettings by the backend, ElectionTiming by the election,
HttpSettings and LogSettings by their adapters); this module only assembles and checks them, so
that every bad value is reported up front with the setting's name.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path

from elector.backend import InvalidRedisSettingsError, RedisSettings
from elector.backend.redis_lease import MAX_IDENTITY_LENGTH
from elector.election import ElectionTiming, InvalidTimingError
from elector.http import HttpSettings, parse_http_address
from elector.logs import LogSettings

#: Lock names become part of Redis keys inside a {hash tag}: no braces, no blanks, no control chars.
LOCK_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@-]{0,199}$")

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?|\.\d+)(ms|us|µs|s|m|h)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6, "µs": 1e-6}


class SettingsError(ValueError):
    """A setting is invalid. `setting` names it as the user wrote it (e.g. `--ttl`)."""

    def __init__(self, setting: str, message: str) -> None:
        super().__init__(f"{setting}: {message}")
        self.setting = setting


def parse_duration(text: str) -> float:
    """Seconds from a Go-style duration: `10s`, `500ms`, `1m`, `1m30s`, `1.5s`.

    A bare number is refused (except 0): `10` could mean seconds or milliseconds.
    """
    cleaned = text.strip().replace(" ", "")
    if re.fullmatch(r"0+(\.0*)?", cleaned):
        return 0.0
    if not cleaned:
        raise ValueError("empty duration; write e.g. 10s or 500ms")
    if re.fullmatch(r"\d+(\.\d+)?", cleaned):
        raise ValueError(f"{text!r} has no unit; write e.g. {cleaned}s or {cleaned}ms")
    position, total = 0, 0.0
    for match in _DURATION_PART.finditer(cleaned):
        if match.start() != position:
            break
        total += float(match.group(1)) * _UNIT_S[match.group(2)]
        position = match.end()
    if position != len(cleaned):
        raise ValueError(f"{text!r} is not a duration; write e.g. 10s, 500ms, 1m or 1m30s")
    return total


def validate_lock_name(name: str) -> str:
    if not LOCK_NAME_PATTERN.fullmatch(name):
        raise SettingsError(
            "--lock",
            f"{name!r} is not a valid lock name: 1-200 characters, letters, digits and . _ : / @ -, "
            "starting with a letter or digit",
        )
    return name


def validate_identity(identity: str) -> str:
    if not identity or len(identity) > MAX_IDENTITY_LENGTH:
        raise SettingsError("--identity", f"must be 1-{MAX_IDENTITY_LENGTH} characters, got {len(identity)}")
    if not identity.isprintable() or identity != identity.strip():
        raise SettingsError("--identity", f"{identity!r} has control characters or surrounding blanks")
    return identity


def default_identity(environ: Mapping[str, str] | None = None) -> str:
    """`$POD_NAME` (set from the downward API in Kubernetes), else the host name."""
    env = os.environ if environ is None else environ
    return env.get("POD_NAME") or socket.gethostname()


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    """Everything `elector run` needs, validated."""

    lock: str
    identity: str
    redis: RedisSettings
    timing: ElectionTiming
    http: HttpSettings
    logs: LogSettings
    #: Exit (code 3) after losing leadership instead of contending again.
    exit_on_loss: bool = False


def build_settings(
    *,
    lock: str,
    identity: str | None,
    redis_url: str,
    redis_password_file: Path | None = None,
    ttl_s: float = 10.0,
    renew_interval_s: float | None = None,
    renew_deadline_s: float | None = None,
    request_timeout_s: float | None = None,
    http_address: str = "0.0.0.0:8080",
    log_format: str = "auto",
    log_level: str = "info",
    exit_on_loss: bool = False,
) -> Settings:
    """Assemble and check every setting; raises SettingsError naming the first bad one."""
    validate_lock_name(lock)
    identity = validate_identity(identity if identity is not None else default_identity())
    try:
        timing = ElectionTiming.from_ttl(
            ttl_s,
            renew_interval_s=renew_interval_s,
            renew_deadline_s=renew_deadline_s,
            request_timeout_s=request_timeout_s,
        )
    except InvalidTimingError as exc:
        flags = ", ".join(f"--{name.replace('_', '-')}" for name in exc.settings)
        raise SettingsError(flags, str(exc)) from None
    redis_settings = RedisSettings(
        url=redis_url, password_file=redis_password_file, request_timeout_s=timing.request_timeout_s
    )
    try:
        redis_settings.validate()
    except InvalidRedisSettingsError as exc:
        flag = {"password_file": "--redis-password-file", "request_timeout": "--request-timeout"}
        raise SettingsError(flag.get(exc.setting, "--redis-url"), str(exc)) from None
    try:
        http = parse_http_address(http_address)
    except ValueError as exc:
        raise SettingsError("--http-address", str(exc)) from None
    try:
        logs = LogSettings(format=log_format, level=log_level)  # type: ignore[arg-type]
    except ValueError as exc:
        raise SettingsError("--log-format/--log-level", str(exc)) from None
    return Settings(
        lock=lock,
        identity=identity,
        redis=redis_settings,
        timing=timing,
        http=http,
        logs=logs,
        exit_on_loss=exit_on_loss,
    )
