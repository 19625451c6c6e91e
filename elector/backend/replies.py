"""Replies from Redis translated into domain values and errors: the lease value, announcements,
and every client failure as the one `LeaseBackendError` (shared by every module of the backend).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import redis.exceptions

from elector.lease import BackendErrorKind, Holder, LeaseBackendError, LeaseEvent, LeaseEventKind

#: Values longer than this are not elector's; don't try to parse them.
MAX_VALUE_BYTES = 4096


def parse_holder(raw: bytes) -> Holder | None:
    """The holder named by a stored lease value or an announcement; None if not elector's."""
    # Only elector's own shape is parsed: a foreign value (even deeply nested JSON, which would
    # exhaust the parser's recursion) is simply "not elector's".
    if not raw or len(raw) > MAX_VALUE_BYTES or not raw.startswith(b'{"'):
        return None
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    identity = data.get("identity")
    token = data.get("fencing_token")
    if not isinstance(identity, str) or not isinstance(token, int) or isinstance(token, bool):
        return None
    return Holder(identity=identity, fencing_token=token)


def parse_event_message(message: Mapping[str, Any]) -> LeaseEvent | None:
    """The announcement in a pub/sub message (redis-py's dict shape); None if there is none.

    Shared by the per-lock subscription and the multiplexing `EventHub`.
    """
    if message.get("type") != "message":
        return None  # subscribe confirmations, PONGs: signs of life only
    data = message.get("data")
    if not isinstance(data, bytes):
        return None
    holder = parse_holder(data)
    if holder is None:
        return None
    try:
        kind = LeaseEventKind(json.loads(data).get("event"))
    except (ValueError, AttributeError, UnicodeDecodeError, RecursionError):
        return None
    return LeaseEvent(kind=kind, holder=holder)


def _remaining(pttl: int) -> int | None:
    # PTTL: -1 no expiry, -2 no key.
    return None if pttl < 0 else pttl


def _translate(exc: Exception, *, what: str, keys: str = "") -> LeaseBackendError:
    """One domain error for every client failure; redis-py messages carry no passwords."""
    if isinstance(exc, TimeoutError | redis.exceptions.TimeoutError):
        return LeaseBackendError(f"{what}: Redis did not answer in time", kind=BackendErrorKind.TIMEOUT)
    if isinstance(exc, redis.exceptions.AuthenticationError | redis.exceptions.NoPermissionError):
        return LeaseBackendError(f"{what}: Redis refused access: {exc}", kind=BackendErrorKind.AUTH)
    if isinstance(exc, redis.exceptions.ConnectionError | OSError):
        return LeaseBackendError(f"{what}: cannot reach Redis: {exc}", kind=BackendErrorKind.CONNECTION)
    if isinstance(exc, redis.exceptions.ResponseError):
        text = str(exc)
        # Drop the script-call noise ("Error running script (call to f_...): @user_script:6: ").
        text = re.sub(r"^Error running script \(call to f_[0-9a-f]+\): @user_script:\d+: ", "", text)
        if text.startswith("NOPERM") or "NOPERM" in text[:40]:
            return LeaseBackendError(f"{what}: Redis refused access: {text}", kind=BackendErrorKind.AUTH)
        if "WRONGTYPE" in text:
            return LeaseBackendError(
                f"{what}: a key of this lock ({keys}) is not a string (the meta key: not a hash): "
                "something other than elector wrote it; delete it to let elector use the lock",
                kind=BackendErrorKind.DATA,
            )
        if "elector:" in text:
            return LeaseBackendError(f"{what}: {text.removeprefix('ERR ')}", kind=BackendErrorKind.DATA)
        if text.startswith(("NOAUTH", "WRONGPASS", "NOPERM")):
            return LeaseBackendError(f"{what}: Redis refused access: {text}", kind=BackendErrorKind.AUTH)
        return LeaseBackendError(f"{what}: Redis answered an error: {text}", kind=BackendErrorKind.SERVER)
    if isinstance(exc, redis.exceptions.RedisError):
        return LeaseBackendError(f"{what}: {type(exc).__name__}: {exc}", kind=BackendErrorKind.SERVER)
    if isinstance(exc, redis.exceptions.RedisClusterException):
        # The cluster client's own state errors (no node serves the slot, a failed topology
        # refresh) are not RedisErrors, but neither are they garbage data: a server-side state.
        return LeaseBackendError(f"{what}: Redis Cluster: {exc}", kind=BackendErrorKind.SERVER)
    return LeaseBackendError(
        f"{what}: unexpected reply from Redis ({type(exc).__name__}: {exc})", kind=BackendErrorKind.DATA
    )
