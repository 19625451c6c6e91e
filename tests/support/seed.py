"""Make a lock look already used, so a test does not wait out the quiet period of a new lock.

A lock is "already used" on this server when its fencing counter exists and the run_id recorded
at its last grant is this server's (see the ACQUIRE script): exactly what these helpers write.
"""

from __future__ import annotations

import redis
import redis.asyncio

from elector.backend.lua.lease import LockKeys


def seed_used_lock(client: redis.Redis, lock: str = "jobs", *, counter: int = 1) -> None:
    keys = LockKeys(lock)
    client.set(keys.fencing, counter)
    client.set(keys.server, client.info("server")["run_id"])


async def seed_used_lock_async(client: redis.asyncio.Redis, lock: str = "jobs", *, counter: int = 1) -> None:
    keys = LockKeys(lock)
    await client.set(keys.fencing, counter)
    await client.set(keys.server, (await client.info("server"))["run_id"])
