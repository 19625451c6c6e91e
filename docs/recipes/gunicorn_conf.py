"""Recipe: gunicorn's hooks for wsgi_leader.py and asgi_leader.py (`gunicorn -c gunicorn_conf.py ...`).

The sync app contends from `post_fork` (each worker, after the fork, whether `--preload` is on or
not) and releases in `worker_exit` (gunicorn's graceful stop: SIGTERM to the master). The ASGI
app contends in its lifespan instead (uvicorn's worker runs it), so its hooks do nothing.
"""

from __future__ import annotations

from typing import Any


def post_fork(server: Any, worker: Any) -> None:
    if worker.__class__.__module__.startswith("gunicorn."):  # a sync (or gthread) worker
        import wsgi_leader

        wsgi_leader.start()


def worker_exit(server: Any, worker: Any) -> None:
    import sys

    wsgi_leader = sys.modules.get("wsgi_leader")
    if wsgi_leader is not None:
        wsgi_leader.stop()
