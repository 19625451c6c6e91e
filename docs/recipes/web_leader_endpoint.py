"""Recipe: a web app that contends in its lifespan and says who leads on /leader.

    python web_leader_endpoint.py REDIS_URL LOCK PORT

The test's stand-in for FastAPI: aiohttp's `cleanup_ctx` is the same lifespan pattern (FastAPI's
`lifespan=` async context manager, see web-app.md), and aiohttp is already in elector's dev
extra. `GET /leader` answers 200 with the fencing token while this process leads, else 503 with
the current leader's identity.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator

from aiohttp import web

import elector


async def lifespan(app: web.Application) -> AsyncIterator[None]:
    async with elector.Elector(app["lock"], redis=app["redis_url"], ttl_s=2.0) as e:
        app["elector"] = e
        work = asyncio.create_task(leader_loop(e))
        yield  # the app serves requests meanwhile
        work.cancel()
        await asyncio.gather(work, return_exceptions=True)
    # Leaving the `async with` released the lease (SIGTERM included: aiohttp stops gracefully).


async def leader_loop(e: elector.Elector) -> None:
    while True:
        try:
            async with e.leadership(resign_on_exit=False):
                await asyncio.Event().wait()  # the app's leader-only work goes here
        except elector.LeadershipLost:
            continue


async def leader(request: web.Request) -> web.Response:
    e: elector.Elector = request.app["elector"]
    status = e.status()
    if status.is_leader:
        return web.json_response({"leader": True, "fencing_token": status.fencing_token})
    holder = status.holder.identity if status.holder else None
    return web.json_response({"leader": False, "holder": holder}, status=503)


def main() -> None:
    url, lock, port = sys.argv[1:4]
    app = web.Application()
    app["redis_url"], app["lock"] = url, lock
    app.cleanup_ctx.append(lifespan)
    app.router.add_get("/leader", leader)
    web.run_app(app, host="127.0.0.1", port=int(port), print=lambda *_: print("READY", flush=True))


if __name__ == "__main__":
    main()
