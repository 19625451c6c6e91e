"""`elector status`: who holds a lock, read without contending."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from elector.backend import (
    InvalidRedisSettingsError,
    RedisLeaseBackend,
    RedisSettings,
    make_client,
    redact_url,
)
from elector.lease import LeaseBackendError, Observation


class StatusError(Exception):
    """The status could not be read. `usage` marks bad settings (exit 2) apart from Redis errors."""

    def __init__(self, message: str, *, usage: bool = False) -> None:
        super().__init__(message)
        self.usage = usage


async def observe(settings: RedisSettings, *, lock: str) -> Observation:
    client = make_client(settings, client_name=f"elector:{lock}:status")
    try:
        backend = RedisLeaseBackend(client, lock=lock, key_prefix=settings.key_prefix)
        return await backend.observe()
    finally:
        await client.aclose()


def status_document(observation: Observation, *, lock: str) -> dict[str, object]:
    holder = observation.holder
    return {
        "lock": lock,
        "held": holder is not None or observation.unrecognised_value,
        "holder": None if holder is None else holder.identity,
        "fencing_token": None if holder is None else holder.fencing_token,
        "remaining_ms": observation.remaining_ms,
        "unrecognised_value": observation.unrecognised_value,
        "last_fencing_token": observation.last_fencing_token,
        "quiet_period_remaining_ms": observation.quiet_remaining_ms,
    }


def _printable(text: str) -> str:
    """A name read from Redis, safe for a terminal: control characters escaped."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def format_status(observation: Observation, *, lock: str) -> str:
    holder = observation.holder
    remaining = observation.remaining_ms
    expiry = "no expiry" if remaining is None else f"expires in {remaining / 1000:.3f}s unless renewed"
    if holder is not None:
        who = f"{_printable(holder.identity)} (fencing token {holder.fencing_token})"
        lines = [f"lock {lock}: held by {who}, {expiry}"]
    elif observation.unrecognised_value:
        lines = [f"lock {lock}: held by a value elector did not write ({expiry})"]
    else:
        lines = [f"lock {lock}: free"]
    if observation.quiet_remaining_ms:
        lines.append(
            f"  quiet period: no grants for {observation.quiet_remaining_ms / 1000:.3f}s "
            "(Redis lost its data or the lock is new)"
        )
    last = observation.last_fencing_token
    counter = (
        "missing (a new lock, or Redis lost its data)"
        if last is None
        else f"{last} (the next grant gets more)"
    )
    lines.append(f"  fencing counter: {counter}")
    return "\n".join(lines)


def read_status(
    redis_url: str, *, password_file: Path | None, lock: str, timeout_s: float, as_json: bool
) -> str:
    settings = RedisSettings(url=redis_url, password_file=password_file, request_timeout_s=timeout_s)
    try:
        settings.validate()
    except InvalidRedisSettingsError as exc:
        flag = {"password_file": "--redis-password-file", "request_timeout": "--timeout"}.get(
            exc.setting, "--redis-url"
        )
        raise StatusError(f"invalid setting {flag}: {exc}", usage=True) from None
    try:
        observation = asyncio.run(observe(settings, lock=lock))
    except LeaseBackendError as exc:
        raise StatusError(f"{redact_url(redis_url)}: {exc}") from None
    if as_json:
        return json.dumps(status_document(observation, lock=lock))
    return format_status(observation, lock=lock)
