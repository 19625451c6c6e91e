"""Recipe: a plain threaded worker on the sync API (a Django management command has the same shape).

    python threaded_worker.py REDIS_URL LOCK JOURNAL

A worker thread does the leader work in steps, looking at the lease before each; the main thread
only waits, under `elector.sync.run`, so that SIGTERM releases the lease. JOURNAL gets one line
per step: `<identity> <fencing token> <time.monotonic()>`.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import elector
import elector.sync


def work(e: elector.sync.Elector, journal: str, stop: threading.Event) -> None:
    with open(journal, "a", buffering=1) as out:
        while not stop.is_set():
            try:
                with e.leadership(timeout=1.0) as lease:
                    while not stop.is_set():
                        started = time.monotonic()
                        lease.check()  # the term may have ended: never step on a successor
                        out.write(f"{e.identity} {lease.fencing_token} {started:.6f}\n")
                        time.sleep(0.01)  # one step of real work
            except elector.LeadershipTimeout:
                continue  # someone else leads: keep waiting (and stay responsive to `stop`)
            except elector.LeadershipLost:
                continue  # our term ended: wait to lead again


def main() -> None:
    url, lock, journal = sys.argv[1:4]
    stop = threading.Event()
    with elector.sync.Elector(lock, redis=url, ttl_s=2.0) as e:
        worker = threading.Thread(target=work, args=(e, journal, stop), name="worker")
        worker.start()
        print("READY", os.getpid(), flush=True)
        try:
            while worker.is_alive():
                worker.join(timeout=0.5)
        finally:
            stop.set()  # SIGTERM (SystemExit) or Ctrl-C: stop the worker, then release
            worker.join()


if __name__ == "__main__":
    elector.sync.run(main)
