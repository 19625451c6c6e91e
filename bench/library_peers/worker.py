"""One scheduler on one lock library, for bench/library_peers/benchmark.py.

    python -m bench.library_peers.worker LIBRARY REDIS_URL WHO TTL_S

The same scheduler on each library: wait for the lock, then every 10 ms write one entry
`<who> <term>` to the shared resource (a Redis list, `RPUSH`), keeping the lock alive the way the
library's docs say, until the lock is seen lost; then wait for it again. LIBRARY:

* `elector-async`, `elector-sync`: the body looks (`lease.check()` before each write) and writes
  are unfenced: what the lease alone gives;
* `elector-async-cancel-only`: the async body relies on its cancellation alone (no check): a
  cancellation that lands inside a redis-py asyncio command can be swallowed by redis-py
  (redis/redis-py#2028; seen with redis 8.1.0), and the body writes on;
* `elector-async-fenced`, `elector-sync-fenced`: the same, and every write carries the fencing
  token: the resource refuses a token lower than one it accepted (FENCED_RPUSH below, the pattern
  of docs/fencing.md applied to a list);
* `redis-py`: `redis.lock.Lock`, extended every ttl/3 (`extend(replace_ttl=True)`), no fencing;
* `python-redis-lock`: `redis_lock.Lock(auto_renewal=True)`, no fencing;
* `pottery`: `pottery.Redlock` on one master, extended every ttl/3, no fencing.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable

import redis
import redis.asyncio
from redis.lock import Lock

import elector
import elector.sync

LOCK = "bench-sched"
RESOURCE = "{bench}:resource"
FENCE = "{bench}:resource:fence"
PERIOD_S = 0.01

#: KEYS[1] the list, KEYS[2] its fence; ARGV[1] token, ARGV[2] entry. 1 appended, 0 refused.
FENCED_RPUSH = """
local fence = tonumber(redis.call('GET', KEYS[2]) or '0')
local token = tonumber(ARGV[1])
if token < fence then return 0 end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('RPUSH', KEYS[1], ARGV[2])
return 1
"""


def elector_sync(url: str, who: str, ttl_s: float, *, fenced: bool) -> None:
    client = redis.Redis.from_url(url)
    push = client.register_script(FENCED_RPUSH)
    with elector.sync.Elector(LOCK, redis=url, identity=who, ttl_s=ttl_s) as e:
        while True:
            try:
                with e.leadership(resign_on_exit=False) as lease:
                    while True:
                        lease.check()
                        entry = f"{who} {lease.fencing_token}"
                        if fenced:
                            if not push(keys=[RESOURCE, FENCE], args=[lease.fencing_token, entry]):
                                break  # refused: a newer leader has written
                        else:
                            client.rpush(RESOURCE, entry)
                        time.sleep(PERIOD_S)
            except elector.LeadershipLost:
                pass


async def elector_async(url: str, who: str, ttl_s: float, *, fenced: bool, check: bool = True) -> None:
    client = redis.asyncio.Redis.from_url(url)
    push = client.register_script(FENCED_RPUSH)
    async with elector.Elector(LOCK, redis=url, identity=who, ttl_s=ttl_s) as e:
        while True:
            try:
                async with e.leadership(resign_on_exit=False) as lease:
                    while True:
                        if check:
                            lease.check()
                        entry = f"{who} {lease.fencing_token}"
                        if fenced:
                            if not await push(keys=[RESOURCE, FENCE], args=[lease.fencing_token, entry]):
                                break
                        else:
                            await client.rpush(RESOURCE, entry)
                        await asyncio.sleep(PERIOD_S)
            except elector.LeadershipLost:
                pass


def renewing_loop(client: redis.Redis, who: str, term: str, renew: Callable[[], bool], ttl_s: float) -> None:
    """Write every PERIOD_S, renewing every ttl/3, until a renewal says the lock is gone."""
    next_renew = time.monotonic() + ttl_s / 3
    while True:
        client.rpush(RESOURCE, f"{who} {term}")
        time.sleep(PERIOD_S)
        if time.monotonic() >= next_renew:
            next_renew = time.monotonic() + ttl_s / 3
            try:
                if not renew():
                    return
            except Exception:
                return


def redis_py(url: str, who: str, ttl_s: float) -> None:
    client = redis.Redis.from_url(url)
    term = 0
    while True:
        lock = client.lock(LOCK, timeout=ttl_s, blocking=True)
        lock.acquire()
        term += 1

        def extend(lock: Lock = lock) -> bool:
            return bool(lock.extend(ttl_s, replace_ttl=True))

        renewing_loop(client, who, str(term), extend, ttl_s)


def python_redis_lock(url: str, who: str, ttl_s: float) -> None:
    import redis_lock

    client = redis.Redis.from_url(url)
    term = 0
    while True:
        lock = redis_lock.Lock(client, LOCK, expire=max(1, round(ttl_s)), auto_renewal=True)
        lock.acquire(blocking=True)
        term += 1
        # The library renews in a thread of its own; its docs give no way to see the lock lost.
        while True:
            client.rpush(RESOURCE, f"{who} {term}")
            time.sleep(PERIOD_S)


def pottery_redlock(url: str, who: str, ttl_s: float) -> None:
    import pottery

    client = redis.Redis.from_url(url)
    term = 0
    while True:
        lock = pottery.Redlock(key=LOCK, masters={client}, auto_release_time=ttl_s, num_extensions=10**9)
        lock.acquire(blocking=True)
        term += 1

        def extend(lock: pottery.Redlock = lock) -> bool:
            lock.extend()
            return True

        renewing_loop(client, who, str(term), extend, ttl_s)


def main() -> None:
    library, url, who, ttl = sys.argv[1:5]
    ttl_s = float(ttl)
    print("READY", flush=True)
    if library.startswith("elector-sync"):
        elector_sync(url, who, ttl_s, fenced=library.endswith("fenced"))
    elif library.startswith("elector-async"):
        check = library != "elector-async-cancel-only"
        asyncio.run(elector_async(url, who, ttl_s, fenced=library.endswith("fenced"), check=check))
    elif library == "redis-py":
        redis_py(url, who, ttl_s)
    elif library == "python-redis-lock":
        python_redis_lock(url, who, ttl_s)
    elif library == "pottery":
        pottery_redlock(url, who, ttl_s)
    else:
        raise SystemExit(f"unknown library {library!r}")


if __name__ == "__main__":
    main()
