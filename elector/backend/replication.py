"""`--min-replicas-ack`: a grant or renewal counts only once N replicas have it.

Redis replicates asynchronously: a master that fails right after granting a lease may not have
passed the grant on, and the replica promoted in its place then knows nothing of it. WAIT
narrows that window: it blocks until N replicas acknowledged every write THE SAME CONNECTION
made so far (or a timeout passes) and says how many did. So the script and its WAIT go out on
one connection, as one non-transactional pipeline [EVALSHA ..., WAIT n timeout]: one round trip
plus the replicas' acknowledgement. With the ScriptBatcher a single WAIT at the end of a batch
covers every script of the batch.

WAIT is not consensus: a write acknowledged by N replicas can still be lost if the failover
promotes a replica that was not among them, and an unacknowledged write may still have reached
some. It turns "lost whenever the master dies within a replication lag" into "lost only when
the replicas that had it are not the one promoted". The fencing token stays the protection.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import redis.asyncio
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, ResponseError
from redis.typing import EncodableT, KeyT

from elector.lease import BackendErrorKind, LeaseBackendError


@dataclasses.dataclass(frozen=True, slots=True)
class ReplicaAck:
    """WAIT `replicas` `timeout_ms` after a write that must survive a failover."""

    replicas: int
    timeout_ms: int

    def __post_init__(self) -> None:
        if self.replicas < 1 or self.timeout_ms < 1:
            raise ValueError("a replica acknowledgement needs at least 1 replica and 1 ms")

    def widest(self, other: ReplicaAck | None) -> ReplicaAck:
        """One WAIT that satisfies both (a batch mixing settings waits for the stricter)."""
        if other is None:
            return self
        return ReplicaAck(
            replicas=max(self.replicas, other.replicas), timeout_ms=max(self.timeout_ms, other.timeout_ms)
        )


class ReplicationAckError(LeaseBackendError):
    """Fewer replicas than asked for acknowledged a grant or renewal in time.

    A SERVER-kind backend error, so the election treats it like any failed request: an
    acquisition that is not acknowledged was released and counts as failed, a renewal that is
    not acknowledged counts as a failed renewal (the renew deadline applies as usual).
    """

    def __init__(self, what: str, *, acked: int, ack: ReplicaAck, released: bool | None = None) -> None:
        message = (
            f"{what}: only {acked} of {ack.replicas} replicas acknowledged the write within "
            f"{ack.timeout_ms} ms (--min-replicas-ack)"
        )
        if isinstance(acked, WaitFailed):
            message = (
                f"{what}: WAIT was refused ({acked.reason}), so no replica acknowledged (--min-replicas-ack)"
            )
        if released is True:
            message += "; the grant was released"
        elif released is False:
            message += "; the grant could not be released (it lapses with its ttl)"
        super().__init__(message, kind=BackendErrorKind.SERVER)
        self.acked = acked
        self.wanted = ack.replicas


class WaitFailed(int):
    """No acknowledgement because WAIT itself was refused (an ACL without +wait, a replica).

    Counted as 0 replicas, so that a grant the script already made is released like any other
    unacknowledged one, instead of the error leaving it held by nobody for a ttl.
    """

    reason: str

    def __new__(cls, reason: str) -> WaitFailed:
        failed = super().__new__(cls, 0)
        failed.reason = reason
        return failed


def acknowledged(reply: Any) -> int:
    """WAIT's answer: the number of replicas that acknowledged (WaitFailed when it was refused)."""
    if isinstance(reply, ResponseError):
        return WaitFailed(str(reply))
    if isinstance(reply, Exception):
        raise reply
    if isinstance(reply, bool) or not isinstance(reply, int):
        raise TypeError(f"WAIT answered {type(reply).__name__}, not an integer")
    return reply


async def run_script_acked(
    client: redis.asyncio.Redis,
    script: AsyncScript,
    *,
    keys: Sequence[KeyT],
    args: Sequence[EncodableT],
    ack: ReplicaAck,
) -> tuple[Any, int]:
    """Run `script`, then WAIT on the same connection; its reply and the replicas that acked.

    Raises what the script raised (a redis-py error) exactly as a plain script call would. On
    NOSCRIPT (a restarted or flushed server) the script is loaded and run once more, with its own
    WAIT: the first WAIT covered no write of the script.
    """
    for attempt in range(2):
        pipe = client.pipeline(transaction=False)
        if attempt:
            pipe.script_load(script.script)
        pipe.evalsha(script.sha, len(keys), *keys, *args)
        pipe.execute_command("WAIT", ack.replicas, ack.timeout_ms)
        replies: list[Any] = await pipe.execute(raise_on_error=False)
        reply, wait_reply = replies[-2], replies[-1]
        if isinstance(reply, NoScriptError) and attempt == 0:
            continue
        if isinstance(reply, Exception):
            raise reply
        return reply, acknowledged(wait_reply)
    raise AssertionError("unreachable")
