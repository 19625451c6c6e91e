"""Recipe: a periodic job (what an APScheduler job does) that writes through `FencedStore`.

    python periodic_job.py REDIS_URL LOCK

Every 50 ms while leading, the job writes its report under the lease's fencing token. A write
refused by the fence (`StaleFencingTokenError`: a newer leader has written, we were paused) ends
the term's work; the loop then waits to lead again. After each accepted write the token is also
appended to the Redis list `<LOCK>:accepted`, for the recipe's test to read what was accepted.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time

import redis.asyncio

import elector

log = logging.getLogger("periodic-job")


async def main(url: str, lock: str) -> None:
    client = redis.asyncio.Redis.from_url(url)
    store = elector.FencedStore(client)
    key = f"{{{lock}}}:report"
    async with elector.Elector(lock, redis=url, ttl_s=2.0) as e:
        print("READY", flush=True)
        while True:
            try:
                async with e.leadership(resign_on_exit=False) as lease:
                    while True:
                        report = f"{e.identity} {time.time():.3f}"
                        await store.set_or_raise(key, report, fencing_token=lease.fencing_token)
                        await client.rpush(f"{lock}:accepted", lease.fencing_token)
                        await asyncio.sleep(0.05)
            except elector.LeadershipLost as exc:
                log.warning("lost the lead (%s)", exc.reason)
            except elector.StaleFencingTokenError as exc:
                log.warning("a newer leader has written: %s", exc)


if __name__ == "__main__":
    elector.run(main(*sys.argv[1:3]))
