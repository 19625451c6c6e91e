"""Domain types shared by the election and its lease backends, and the rules of their values.

This module is the bottom layer: it knows nothing about Redis. The election depends only on
the `LeaseBackend` protocol and these values; a backend translates its own client's errors into
`LeaseBackendError` so that no other exception type crosses the boundary.

The rules of lock names, identities, priorities and ttls live here too, so that the library
(`Elector`) and the daemon (`elector run`) refuse the same values with the same words; each
front end only names the setting its own way (`lock: ...`, `--lock: ...`).
"""

from __future__ import annotations

import dataclasses
import enum
import os
import re
import secrets
import socket
from collections.abc import Mapping
from typing import Protocol


@dataclasses.dataclass(frozen=True, slots=True)
class Holder:
    """Who holds a lock, as stored in the lease value. Never carries the secret owner token."""

    identity: str
    fencing_token: int


@dataclasses.dataclass(frozen=True, slots=True)
class Lease:
    """A lease this process was granted.

    `value` is the exact string stored in the backend; it embeds the secret owner token, so it
    is kept out of `repr()` and must never be logged or exposed.
    """

    lock: str
    identity: str
    fencing_token: int
    ttl_ms: int
    value: str = dataclasses.field(repr=False)

    @property
    def holder(self) -> Holder:
        return Holder(identity=self.identity, fencing_token=self.fencing_token)


@dataclasses.dataclass(frozen=True, slots=True)
class Candidate:
    """A registered candidate of a lock: it contends (or leads) and refreshed its entry recently.

    Entries are refreshed by every acquire attempt and every renewal, and lapse after three ttls
    without one, so a crashed replica drops out by itself.
    """

    identity: str
    #: Higher wins: a leader yields to a live candidate with a higher priority (with hysteresis).
    priority: int
    #: How long ago (server clock, ms) the candidate last refreshed its entry.
    last_seen_ms_ago: int


@dataclasses.dataclass(frozen=True, slots=True)
class Handoff:
    """A handoff in progress: the lease is being passed from `from_identity` to `to_identity`.

    While it lasts (`remaining_ms`), `from_identity` is never granted the lock, and when
    `to_identity` is set nobody but that candidate is. `to_identity` None means "anyone else".
    """

    from_identity: str
    to_identity: str | None
    remaining_ms: int


@dataclasses.dataclass(frozen=True, slots=True)
class Granted:
    """Acquire result: the lock was free and is now ours."""

    lease: Lease
    #: Set when our identity's live candidate entry was last registered by another instance
    #: (another Elector or daemon election, found by its nonce): two live processes report one
    #: identity. Never set on an instance's first registration, whose entry may be a restarted
    #: predecessor's (it lives on for 3 ttl), nor for an older daemon's entry (no nonce).
    identity_clash: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Held:
    """Acquire result: someone else holds the lock.

    `holder` is None when the stored value is not in elector's format (written by someone else).
    `remaining_ms` is the holder's remaining time to live, or None when the key has no expiry.
    """

    holder: Holder | None
    remaining_ms: int | None
    #: See `Granted.identity_clash`.
    identity_clash: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class QuietPeriod:
    """Acquire result: no grants until `remaining_ms` passes (the backend lost its data)."""

    remaining_ms: int
    #: See `Granted.identity_clash`.
    identity_clash: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class StandBack:
    """Acquire result: a handoff is in progress and this candidate is not the one it goes to."""

    handoff: Handoff
    #: See `Granted.identity_clash`.
    identity_clash: bool = False


AcquireResult = Granted | Held | QuietPeriod | StandBack


@dataclasses.dataclass(frozen=True, slots=True)
class Renewed:
    """Renew result: the TTL was replaced; the lease is ours for another ttl from the request.

    `handoff` is set when someone asked the holder to hand the lease over (the leader drains its
    work and releases). `best_rival` is the live candidate with the highest priority other than
    the renewing one (None when there is none), for priority pre-emption.
    """

    handoff: Handoff | None = None
    best_rival: Candidate | None = None
    #: See `Granted.identity_clash`.
    identity_clash: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Lost:
    """Renew result: the key is gone, expired or holds another value. Never retried."""

    holder: Holder | None
    remaining_ms: int | None
    #: See `Granted.identity_clash`.
    identity_clash: bool = False


RenewResult = Renewed | Lost


@dataclasses.dataclass(frozen=True, slots=True)
class Observation:
    """A read-only look at a lock, taken without contending."""

    holder: Holder | None
    #: True when a value exists but is not in elector's format.
    unrecognised_value: bool
    remaining_ms: int | None
    #: The highest fencing token ever issued for the lock (None: the counter is missing).
    last_fencing_token: int | None
    #: Milliseconds left in a data-loss quiet period (0 when none).
    quiet_remaining_ms: int
    #: Set when the lock holds data from an elector protocol this code does not speak (which
    #: key, which version): such data is left alone and the lock counts as held.
    unknown_protocol: str | None = None


class LeaseEventKind(enum.StrEnum):
    ACQUIRED = "acquired"
    RELEASED = "released"
    #: Someone asked the holder to hand the lease over (`elector handoff`); `holder` is the holder.
    HANDOFF = "handoff"


@dataclasses.dataclass(frozen=True, slots=True)
class LeaseEvent:
    """A change of a lock announced by the backend (Redis pub/sub)."""

    kind: LeaseEventKind
    holder: Holder


class BackendErrorKind(enum.StrEnum):
    CONNECTION = "connection"  # cannot reach the server, or the connection broke
    TIMEOUT = "timeout"  # no answer within the per-request timeout
    AUTH = "auth"  # authentication or permission refused
    DATA = "data"  # the data in the backend is not what elector wrote (wrong type, garbage)
    SERVER = "server"  # any other error answered by the server


class LeaseBackendError(Exception):
    """The one error type a lease backend raises. Its message never contains secrets."""

    def __init__(self, message: str, *, kind: BackendErrorKind) -> None:
        super().__init__(message)
        self.kind = kind


class LeaseEventSubscription(Protocol):
    """A live subscription to a lock's change announcements."""

    async def next_event(self, timeout_s: float) -> LeaseEvent | None:
        """Wait up to `timeout_s` for an event; None on timeout.

        Raises LeaseBackendError when the subscription is broken (the caller re-subscribes).
        Keep-alives are the subscription's own business.
        """
        ...

    async def close(self) -> None: ...


class LeaseBackend(Protocol):
    """The lease protocol of one named lock, as the election sees it.

    Every method is a single request with the backend's own per-request timeout; none retries.
    Every method raises only LeaseBackendError.
    """

    @property
    def lock(self) -> str: ...

    async def acquire(self, identity: str, *, ttl_ms: int, priority: int = 0) -> AcquireResult:
        """Grant the lock if free (with a new fencing token), else report holder and PTTL.

        Also registers (refreshes) `identity` as a candidate with `priority`.
        """
        ...

    async def renew(self, lease: Lease, *, priority: int = 0) -> RenewResult:
        """Replace the TTL if the lock still holds `lease`; never re-creates a lapsed key.

        Also refreshes the holder's candidate entry, and reports a requested handoff and the
        best live rival.
        """
        ...

    async def release(
        self, lease: Lease, *, handoff_to: str | None = None, handoff_window_ms: int = 0
    ) -> bool:
        """Delete the lock if it still holds `lease` and announce it; False if it was not ours.

        With `handoff_to`, atomically start a handoff to that candidate lasting
        `handoff_window_ms`: nobody else is granted the lock meanwhile.
        """
        ...

    async def withdraw(self, identity: str) -> None:
        """Remove `identity`'s candidate entry (a replica shutting down)."""
        ...

    async def observe(self) -> Observation:
        """Read the lock's state without contending."""
        ...

    async def subscribe(self, *, keepalive_s: float) -> LeaseEventSubscription:
        """Subscribe to the lock's change announcements; check the link after `keepalive_s` of silence."""
        ...


# --- the rules of the values ------------------------------------------------------------------

#: Lock names become part of Redis keys inside a {hash tag}: no braces, no blanks, no control chars.
LOCK_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@-]{0,199}$")
#: Longest identity accepted; it is stored in every lease value and published in every event.
MAX_IDENTITY_LENGTH = 253
#: Priorities of preferred leaders: far inside what the scripts accept, and any real ranking fits.
MIN_PRIORITY, MAX_PRIORITY = -(10**6), 10**6
#: Longest lease ttl: a leader that may vanish for more than a day without anyone taking over
#: is a misconfiguration, and the scripts' arithmetic (3 x ttl for candidates) must stay exact.
#: (The shortest is a timing rule: see `elector.election.timing`.)
MAX_TTL_S = 24 * 3600.0


class InvalidValueError(ValueError):
    """A value breaks a rule of the domain.

    `setting` is the domain's name of it: "lock", "identity", "priority" or "ttl". The message
    does not name the setting: each front end puts its own name of it in front.
    """

    def __init__(self, setting: str, message: str) -> None:
        super().__init__(message)
        self.setting = setting


def check_lock_name(name: object) -> str:
    if not isinstance(name, str) or not LOCK_NAME_PATTERN.fullmatch(name):
        raise InvalidValueError(
            "lock",
            f"{name!r} is not a valid lock name: 1-200 characters, letters, digits and . _ : / @ -, "
            "starting with a letter or digit",
        )
    return name


def check_identity(identity: object) -> str:
    if not isinstance(identity, str):
        raise InvalidValueError("identity", f"must be a str, got {identity!r}")
    if not identity or len(identity) > MAX_IDENTITY_LENGTH:
        raise InvalidValueError(
            "identity", f"must be 1-{MAX_IDENTITY_LENGTH} characters, got {len(identity)}"
        )
    if not identity.isprintable() or identity != identity.strip():
        raise InvalidValueError("identity", f"{identity!r} has control characters or surrounding blanks")
    return identity


def check_priority(priority: object) -> int:
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise InvalidValueError("priority", f"must be an int, got {priority!r}")
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise InvalidValueError(
            "priority", f"must be between {MIN_PRIORITY} and {MAX_PRIORITY}, got {priority}"
        )
    return priority


def check_ttl(ttl_s: float) -> float:
    """The upper bound of the ttl, seconds (the lower bound and the rest are timing rules)."""
    if ttl_s > MAX_TTL_S:
        raise InvalidValueError("ttl", f"ttl must be at most {MAX_TTL_S / 3600:g}h, got {ttl_s:g}s")
    return ttl_s


def default_identity(environ: Mapping[str, str] | None = None) -> str:
    """`$POD_NAME` (set from the downward API in Kubernetes), else the host name."""
    env = os.environ if environ is None else environ
    return env.get("POD_NAME") or socket.gethostname()


def default_library_identity(environ: Mapping[str, str] | None = None) -> str:
    """The library's default: `default_identity()`, the process id and a short random suffix.

    Several processes of one pod or host (workers of a web server, a test's subprocesses) each
    get their own identity; the suffix tells a restarted process that reused a pid from its
    predecessor. Example: `web-0-4711-3f9a2c`.
    """
    suffix = f"-{os.getpid()}-{secrets.token_hex(3)}"
    return default_identity(environ)[: MAX_IDENTITY_LENGTH - len(suffix)] + suffix
