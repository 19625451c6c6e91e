"""What the control commands (`elector status`, `elector handoff`) share: their error, their
Redis settings and client, and how they print names read from Redis.

Both read a lock without contending for it, through a client of their own that lives as long as
the command; the CLI turns `ControlError` into exit 2 (`usage`) or exit 1.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from elector.backend import (
    InvalidRedisSettingsError,
    RedisLeaseBackend,
    RedisSettings,
    make_client,
    redact_url,
)
from elector.lease import Holder, LeaseBackendError

_T = TypeVar("_T")


class ControlError(Exception):
    """A control command could not do its job. `usage` marks bad settings (exit 2) apart from
    Redis errors (exit 1)."""

    def __init__(self, message: str, *, usage: bool = False) -> None:
        super().__init__(message)
        self.usage = usage


def printable(text: str) -> str:
    """A name read from Redis, safe for a terminal: control characters escaped."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def who(holder: Holder) -> str:
    return f"{printable(holder.identity)} (fencing token {holder.fencing_token})"


def redis_settings(
    redis_url: str,
    *,
    password_file: Path | None,
    request_timeout_s: float,
    timeout_flag: str | None,
    error: type[ControlError],
) -> RedisSettings:
    """Checked settings, or `error(usage=True)` naming the flag at fault. `timeout_flag`: the
    command's flag for the request timeout (None: not a flag of this command)."""
    settings = RedisSettings(url=redis_url, password_file=password_file, request_timeout_s=request_timeout_s)
    try:
        settings.validate()
    except InvalidRedisSettingsError as exc:
        flags = {"password_file": "--redis-password-file"}
        if timeout_flag is not None:
            flags["request_timeout"] = timeout_flag
        flag = flags.get(exc.setting, "--redis-url")
        raise error(f"invalid setting {flag}: {exc}", usage=True) from None
    return settings


@contextlib.asynccontextmanager
async def lock_backend(
    settings: RedisSettings, *, lock: str, purpose: str
) -> AsyncIterator[RedisLeaseBackend]:
    """The lock's backend on a client of its own (named `elector:<lock>:<purpose>`), closed after."""
    client = make_client(settings, client_name=f"elector:{lock}:{purpose}")
    try:
        yield RedisLeaseBackend(client, lock=lock, key_prefix=settings.key_prefix)
    finally:
        await client.aclose()


def run_command(main: Coroutine[Any, Any, _T], *, redis_url: str, error: type[ControlError]) -> _T:
    """Run a command's coroutine; a Redis failure becomes `error`, naming the server (redacted)."""
    try:
        return asyncio.run(main)
    except LeaseBackendError as exc:
        raise error(f"{redact_url(redis_url)}: {exc}") from None
