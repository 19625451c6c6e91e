"""A WSGI app that makes (and starts) its sync Elector at import: the mistake `--preload` punishes.

    RECIPE_REDIS_URL=... RECIPE_LOCK=... gunicorn --preload tests.support.preload_mistake:app

Under `--preload` the master imports this module, so the Elector and its election belong to the
master; each request asks the worker's copy to lead (timeout 2 s) and answers what happened:
200 `led`, 504 `timeout`, or 500 with the error's type and message.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

import elector
import elector.sync

ELECTOR = elector.sync.Elector(os.environ["RECIPE_LOCK"], redis=os.environ["RECIPE_REDIS_URL"], ttl_s=10)
ELECTOR.start()


def app(environ: dict[str, Any], start_response: Callable[..., object]) -> Iterable[bytes]:
    try:
        ELECTOR.wait_for_leadership(timeout=2)
    except elector.LeadershipTimeout:
        start_response("504 Gateway Timeout", [])
        return [b"timeout"]
    except Exception as exc:
        start_response("500 Internal Server Error", [])
        return [f"{type(exc).__name__}: {exc}".encode()]
    start_response("200 OK", [])
    return [b"led"]
