"""Recipe: an ASGI app whose worker processes contend for one lock (uvicorn, under gunicorn or not).

    gunicorn -c gunicorn_conf.py -k uvicorn.workers.UvicornWorker asgi_leader:app  # --preload or not
    uvicorn asgi_leader:app --workers 2

The Elector is made in the lifespan's startup, in the worker process and on its loop, and
closed at its shutdown (SIGTERM: uvicorn and gunicorn stop gracefully), which releases the
lease. Settings and journal as in wsgi_leader.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import elector

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
#: This worker's Elector, while its lifespan runs.
_electors: list[elector.Elector] = []


async def leader_work(e: elector.Elector) -> None:
    with open(os.environ["RECIPE_JOURNAL"], "a", buffering=1) as journal:  # noqa: ASYNC230
        while True:
            try:
                async with e.leadership(resign_on_exit=False) as lease:
                    while True:
                        t = time.clock_gettime(time.CLOCK_BOOTTIME)
                        lease.check()
                        journal.write(f"{os.getpid()} {lease.fencing_token} {t:.6f}\n")
                        await asyncio.sleep(0.02)
            except elector.LeadershipLost:
                continue


async def lifespan(receive: Receive, send: Send) -> None:
    await receive()  # lifespan.startup
    async with elector.Elector(
        os.environ["RECIPE_LOCK"],
        redis=os.environ["RECIPE_REDIS_URL"],
        ttl_s=float(os.environ.get("RECIPE_TTL_S", "10")),
    ) as e:
        _electors.append(e)
        work = asyncio.create_task(leader_work(e))
        await send({"type": "lifespan.startup.complete"})
        await receive()  # lifespan.shutdown
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work
        _electors.remove(e)
    # the `async with` released the lease here
    await send({"type": "lifespan.shutdown.complete"})


async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        await lifespan(receive, send)
        return
    leading = bool(_electors) and _electors[0].is_leader
    await send({"type": "http.response.start", "status": 200 if leading else 503,
                "headers": [(b"content-type", b"application/json")]})  # fmt: skip
    await send({"type": "http.response.body", "body": json.dumps({"leader": leading}).encode()})
