"""Batch script calls packed by elector instead of redis-py, and sent on a pooled connection.

redis-py packs each argument of a command on its own (an `encode` and a few checks each): a
RENEW_BATCH of 100 leases has 1,100 arguments, and packing them is a large share of a renewal's
CPU in a daemon of many locks (docs/design.md, "Measured figures behind the code"). Yet a
lease's renewal sends the very same keys and arguments every time, so its caller encodes them
once (`resp_bulks`) and a batch is the join of those pieces (`pack_batch`). `round_trip` writes
such payloads on one pooled connection and reads one reply each, as redis-py's own pipeline does
(a reply that is an error is that command's error; a failing connection is closed, never given
back half-read).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import redis.asyncio
from redis.exceptions import ResponseError


def _bulk(value: bytes | str | int) -> bytes:
    data = value if isinstance(value, bytes) else str(value).encode("utf-8")
    return b"$%d\r\n%s\r\n" % (len(data), data)


def resp_bulks(values: Iterable[bytes | str | int]) -> bytes:
    """`values` as RESP bulk strings, as redis-py sends them (str in UTF-8, int in decimal)."""
    return b"".join(_bulk(value) for value in values)


def pack_batch(
    sha: str, *, keys_per_call: int, args_per_call: int, packed: Sequence[tuple[bytes, bytes]]
) -> bytes:
    """One EVALSHA of a batch form (lua/batch.py's calling convention) carrying the calls whose
    keys and arguments `packed` holds, each as `resp_bulks` encoded them."""
    count = len(packed)
    total = 3 + count * keys_per_call + 2 + count * args_per_call
    head = b"*%d\r\n$7\r\nEVALSHA\r\n%s%s" % (total, _bulk(sha), _bulk(count * keys_per_call))
    return b"".join(
        [
            head,
            *(keys for keys, _ in packed),
            _bulk(keys_per_call),
            _bulk(args_per_call),
            *(args for _, args in packed),
        ]
    )


async def round_trip(client: redis.asyncio.Redis, payloads: Sequence[bytes]) -> list[Any]:
    """Send the packed commands in one write on one pooled connection and read a reply for each:
    the reply, or the ResponseError that was the reply. Raises what a failing connection raised
    (the client's socket timeout bounds every read)."""
    pool = client.connection_pool
    connection = await pool.get_connection()  # type: ignore[no-untyped-call]
    try:
        await connection.send_packed_command(b"".join(payloads))
        replies: list[Any] = []
        for _ in payloads:
            try:
                replies.append(await connection.read_response())
            except ResponseError as exc:  # this command's error reply, read whole
                replies.append(exc)
        return replies
    except BaseException:
        await connection.disconnect(nowait=True)
        raise
    finally:
        await pool.release(connection)
