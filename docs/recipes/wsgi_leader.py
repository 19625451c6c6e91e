"""Recipe: a WSGI app whose worker processes contend for one lock (gunicorn sync workers, uWSGI).

    gunicorn -c gunicorn_conf.py wsgi_leader:app            # --preload or not: both work
    uwsgi --http-socket :8000 --module wsgi_leader:app --master --processes 2 \
          --enable-threads --die-on-term

Each worker process makes its own `elector.sync.Elector` AFTER the fork (gunicorn's `post_fork`
hook, uWSGI's `postfork`), never at import: with `--preload` (uWSGI's default) the app module is
imported by the master, and an Elector made there would belong to the master (a worker using it
gets `elector.ForkedElectorError`). A thread of the worker does the leader work while this
worker leads; `stop()` (gunicorn's `worker_exit`, uWSGI's `atexit`) releases the lease, so a
graceful stop hands over at once instead of after the ttl.

Settings from the environment: RECIPE_REDIS_URL, RECIPE_LOCK, RECIPE_JOURNAL (each step of
leader work appends `<pid> <fencing token> <t>`, t on CLOCK_BOOTTIME), RECIPE_TTL_S.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import elector
import elector.sync

#: This process's Elector, the stop flag of its leader work, and that work's thread.
_running: list[tuple[elector.sync.Elector, threading.Event, threading.Thread]] = []


def leader_work(e: elector.sync.Elector, stop: threading.Event) -> None:
    with open(os.environ["RECIPE_JOURNAL"], "a", buffering=1) as journal:
        while not stop.is_set():
            try:
                with e.leadership(resign_on_exit=False, timeout=1.0) as lease:
                    while not stop.is_set():
                        t = time.clock_gettime(time.CLOCK_BOOTTIME)
                        lease.check()  # the term may have ended: never step on a successor
                        journal.write(f"{os.getpid()} {lease.fencing_token} {t:.6f}\n")
                        time.sleep(0.02)  # one step of the real work
            except (elector.LeadershipTimeout, elector.LeadershipLost):
                continue  # someone else leads, or our term ended: wait to lead again


def start() -> None:
    """In each worker process, after the fork: contend, and do the leader work on a thread."""
    e = elector.sync.Elector(
        os.environ["RECIPE_LOCK"],
        redis=os.environ["RECIPE_REDIS_URL"],
        ttl_s=float(os.environ.get("RECIPE_TTL_S", "10")),
    )
    e.start()
    stop = threading.Event()
    thread = threading.Thread(target=leader_work, args=(e, stop), name="leader-work", daemon=True)
    thread.start()
    _running.append((e, stop, thread))


def stop() -> None:
    """At the worker's exit: stop the leader work, then release the lease."""
    while _running:
        e, stop_work, thread = _running.pop()
        stop_work.set()
        thread.join(timeout=5)
        e.close()


def app(environ: dict[str, Any], start_response: Callable[..., object]) -> Iterable[bytes]:
    leading = bool(_running) and _running[0][0].is_leader
    start_response("200 OK" if leading else "503 Service Unavailable", [("Content-Type", "application/json")])
    return [json.dumps({"leader": leading, "pid": os.getpid()}).encode()]


try:  # under uWSGI: the same hooks, by its own means
    import uwsgi  # type: ignore[import-not-found]
    from uwsgidecorators import postfork  # type: ignore[import-not-found]
except ImportError:
    pass
else:
    postfork(start)
    uwsgi.atexit = stop
