"""Replies of the candidate-registry and handoff scripts, translated into domain values.

The scripts (see lua/lease.py) already skip garbage entries and normalise the handoff value, so
a reply that does not have the documented shape means the server is not running our script:
it is reported as a DATA error, never guessed at.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any

from elector.backend.errors import invalid_request
from elector.lease import BackendErrorKind, Candidate, Handoff, LeaseBackendError

#: Priorities are bounded so that they stay exact in Lua numbers and in the stored JSON.
MAX_PRIORITY = 10**9


def check_priority(priority: int, *, what: str) -> int:
    """`priority` if the scripts accept it; else the LeaseBackendError (DATA) they would answer,
    raised before anything is sent (a backend raises nothing else)."""
    if isinstance(priority, bool) or not isinstance(priority, int) or abs(priority) > MAX_PRIORITY:
        raise invalid_request(what, f"priority must be an integer between -10^9 and 10^9, got {priority!r}")
    return priority


@functools.lru_cache(maxsize=256)
def encode_identity(identity: str | None) -> str:
    """An identity as the scripts take it: a JSON string literal, or `null` for none. Cached:
    every acquire and renewal encodes the same few identities (json.dumps is ~3 us)."""
    return json.dumps(identity)


def handoff_value(*, from_identity: str, to_identity: str | None) -> str:
    """The stored handoff value, as the scripts write it."""
    return json.dumps({"from": from_identity, "to": to_identity}, separators=(",", ":"))


def _text(raw: Any) -> str:
    if isinstance(raw, str):
        return raw
    # A name someone else stored may not be UTF-8: show it rather than fail the whole reply.
    return bytes(raw).decode("utf-8", "replace")


def parse_handoff(raw: Any, pttl: Any, *, what: str) -> Handoff:
    """A handoff from a script's normalised JSON value and its remaining ms."""
    try:
        data = json.loads(_text(raw))
        from_identity, to_identity = data["from"], data["to"]
        remaining_ms = int(pttl)
    except (KeyError, TypeError, ValueError, RecursionError) as exc:
        raise LeaseBackendError(
            f"{what}: unexpected handoff in the reply ({type(exc).__name__})", kind=BackendErrorKind.DATA
        ) from None
    if not isinstance(from_identity, str) or not isinstance(to_identity, str | None):
        raise LeaseBackendError(f"{what}: unexpected handoff in the reply", kind=BackendErrorKind.DATA)
    return Handoff(from_identity=from_identity, to_identity=to_identity, remaining_ms=max(0, remaining_ms))


def parse_renewed(reply: Sequence[Any]) -> tuple[Handoff | None, Candidate | None]:
    """(handoff, best rival) from RENEW's {1, handoff_json, pttl, rival, priority, seen_ago}."""
    try:
        raw_handoff, pttl, raw_rival, priority, seen_ago = reply[1:6]
        rival_name = _text(raw_rival)
        rival_priority, rival_seen_ago = int(priority), int(seen_ago)
    except (TypeError, ValueError) as exc:
        raise LeaseBackendError(
            f"renew: unexpected reply from Redis ({type(exc).__name__}: {exc})", kind=BackendErrorKind.DATA
        ) from None
    handoff = parse_handoff(raw_handoff, pttl, what="renew") if raw_handoff else None
    rival = None
    if rival_name:
        rival = Candidate(identity=rival_name, priority=rival_priority, last_seen_ms_ago=rival_seen_ago)
    return handoff, rival


def parse_candidates(reply: Any) -> list[Candidate]:
    """CANDIDATES' flat {identity, priority, seen_ms_ago, ...}, by priority (desc) then identity."""
    try:
        if not isinstance(reply, list) or len(reply) % 3:
            raise ValueError(f"a list of triples expected, got {type(reply).__name__}")
        found = [
            Candidate(
                identity=_text(reply[i]), priority=int(reply[i + 1]), last_seen_ms_ago=int(reply[i + 2])
            )
            for i in range(0, len(reply), 3)
        ]
    except (TypeError, ValueError) as exc:
        raise LeaseBackendError(
            f"candidates: unexpected reply from Redis ({exc})", kind=BackendErrorKind.DATA
        ) from None
    return sorted(found, key=lambda c: (-c.priority, c.identity))


class HandoffRefusedError(Exception):
    """A handoff was refused: its target already holds the lock."""

    def __init__(self, holder: str) -> None:
        super().__init__(f"{holder!r} already holds the lock: there is nothing to hand over")
        self.holder = holder
