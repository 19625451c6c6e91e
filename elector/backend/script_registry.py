"""The lease scripts on a client: registered once per client and script, preloaded once per client.

The backends of one client (a daemon of many locks has one per lock) share what is here.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from typing import Any

import redis.asyncio
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript

from elector.backend.lua import lease as scripts

#: Clients whose server was sent the scripts of a term (`preload_scripts_soon`),
#: and the loads under way (referenced until done, as asyncio keeps only weak references to tasks).
_PRELOADED: weakref.WeakSet[Any] = weakref.WeakSet()
_PRELOADING: set[asyncio.Task[None]] = set()
#: The scripts of a term, each first run on a path that waits for it (the release: a handoff's).
_TERM_SCRIPTS = (scripts.ACQUIRE, scripts.RENEW, scripts.RELEASE, scripts.WITHDRAW)


async def _load_scripts(client: redis.asyncio.Redis) -> None:
    with contextlib.suppress(Exception):
        pipe = client.pipeline(transaction=False)
        for script in _TERM_SCRIPTS:
            pipe.script_load(script)
        await pipe.execute(raise_on_error=False)


#: The scripts registered on each client, by their source: the backends of one client (a daemon
#: of many locks has one per lock) share them. Registering hashes the script (SHA1 of a few KB):
#: seven per lock add up to a noticeable share of a large daemon's start-up CPU, and an object
#: each.
_REGISTERED: weakref.WeakKeyDictionary[object, dict[str, AsyncScript]] = weakref.WeakKeyDictionary()


def registered_script(client: redis.asyncio.Redis, script: str) -> AsyncScript:
    """`client.register_script(script)`, made once per client and script. An AsyncScript keeps
    no state of a call (its SHA1 only), so the backends of one client can share it."""
    on_client = _REGISTERED.setdefault(client, {})
    registered = on_client.get(script)
    if registered is None:
        registered = on_client[script] = client.register_script(script)
    return registered


def preload_scripts_soon(client: redis.asyncio.Redis) -> None:
    """SCRIPT LOAD, once per client, of the scripts of a term: in a task of its own, started by
    the first acquire that got an answer (the link works), and awaited by nobody.

    Without it a daemon's first release meets NOSCRIPT and costs two more round trips (SCRIPT
    LOAD, then the call again) on the path of a graceful handoff; a new leader's first renewal
    the same. Off every request's path, so it never eats a request's time budget. Best effort:
    a server that lost them later (restart, SCRIPT FLUSH), or never got them, is answered by
    the NOSCRIPT retry as before. A cluster client is left to that retry, as before.
    """
    if client in _PRELOADED or isinstance(client, RedisCluster):
        return
    _PRELOADED.add(client)
    task = asyncio.get_running_loop().create_task(_load_scripts(client), name="elector-preload-scripts")
    _PRELOADING.add(task)
    task.add_done_callback(_PRELOADING.discard)
