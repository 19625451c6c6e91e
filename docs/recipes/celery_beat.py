"""Recipe: one scheduler across Celery workers (what beat does), kept single by the lock.

    celery -A celery_beat worker --pool prefork --concurrency 2

Every worker node contends from its main process: `worker_ready` (after the pool's processes
were forked, so none inherits it) starts an `elector.sync.Elector` and a scheduler thread, and
`worker_shutdown` (SIGTERM: Celery's warm shutdown) stops them, releasing the lease. Only the
leader's scheduler sends the periodic task, with its fencing token; any worker runs it.
(Per pool process instead: make the Elector in `worker_process_init`, never before the fork.)

Settings from the environment: RECIPE_REDIS_URL (the lock, and Celery's broker here),
RECIPE_LOCK, RECIPE_JOURNAL: `sent <pid> <token> <t>` per task sent, `ran <pid> <token> <t>`
per task run, t on CLOCK_BOOTTIME; RECIPE_TTL_S.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from celery import Celery
from celery.signals import worker_ready, worker_shutdown

import elector
import elector.sync

app = Celery("celery_beat", broker=os.environ["RECIPE_REDIS_URL"])
app.conf.broker_connection_retry_on_startup = True
#: This process's Elector, the stop flag of its leader work, and that work's thread.
_running: list[tuple[elector.sync.Elector, threading.Event, threading.Thread]] = []


def journal(line: str) -> None:
    with open(os.environ["RECIPE_JOURNAL"], "a") as out:
        out.write(f"{line} {time.clock_gettime(time.CLOCK_BOOTTIME):.6f}\n")


@app.task
def tick(fencing_token: int) -> None:
    journal(f"ran {os.getpid()} {fencing_token}")


def schedule(e: elector.sync.Elector, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            with e.leadership(resign_on_exit=False, timeout=1.0) as lease:
                while not stop.is_set():
                    lease.check()  # only the current leader sends
                    journal(f"sent {os.getpid()} {lease.fencing_token}")
                    tick.delay(lease.fencing_token)
                    stop.wait(0.1)  # the schedule's period
        except (elector.LeadershipTimeout, elector.LeadershipLost):
            continue


@worker_ready.connect
def start_scheduler(**kwargs: Any) -> None:
    e = elector.sync.Elector(
        os.environ["RECIPE_LOCK"],
        redis=os.environ["RECIPE_REDIS_URL"],
        ttl_s=float(os.environ.get("RECIPE_TTL_S", "10")),
    )
    e.start()
    stop = threading.Event()
    thread = threading.Thread(target=schedule, args=(e, stop), name="scheduler", daemon=True)
    thread.start()
    _running.append((e, stop, thread))


@worker_shutdown.connect
def stop_scheduler(**kwargs: Any) -> None:
    while _running:
        e, stop, thread = _running.pop()
        stop.set()
        thread.join(timeout=5)
        e.close()  # released: another worker's scheduler takes over at once
