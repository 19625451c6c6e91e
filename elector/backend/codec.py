"""What elector stores and publishes in Redis, read back into domain values (and written).

The lease value and the announcements are JSON (their shapes: lua/lease.py). Only elector's own
shape is parsed; anything else, however it came there, is "not elector's" (None), never an error
and never a guess. Version facts of the stored value (`v`, `ttl_ms`) are protocol.py's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from elector.backend.protocol import MAX_VALUE_BYTES
from elector.lease import Holder, LeaseEvent, LeaseEventKind

__all__ = ["parse_event_message", "parse_holder", "release_announcement", "remaining_ms"]


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


def release_announcement(*, identity: str, fencing_token: int, to: str | None = None) -> str:
    """The `released` announcement RELEASE publishes; `to` names the handoff target, if any
    (the target need not wait for its next look)."""
    announcement: dict[str, object] = {
        "event": "released",
        "identity": identity,
        "fencing_token": fencing_token,
    }
    if to is not None:
        announcement["to"] = to
    return json.dumps(announcement, separators=(",", ":"))


def remaining_ms(pttl: int) -> int | None:
    """A PTTL reply as the time a key has left: None for a key without expiry (-1) or none (-2)."""
    return None if pttl < 0 else pttl
