"""Recipe: worker processes of multiprocessing, each contending for one lock.

    python multiprocessing_workers.py REDIS_URL LOCK JOURNAL [fork|spawn]

Each process makes its own `elector.sync.Elector` in its target function, after it started: an
Elector made by the parent cannot be used by a child (a forked copy raises
`elector.ForkedElectorError`, a spawned child cannot unpickle one). Each child runs under
`elector.sync.run`, so SIGTERM (the parent's `terminate()`, or a signal from outside) releases
its lease; the parent stops its children that way when it gets SIGTERM itself.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
from types import FrameType

import elector
import elector.sync


def child(url: str, lock: str, journal: str) -> None:
    def main() -> None:
        with (
            elector.sync.Elector(lock, redis=url, ttl_s=float(os.environ.get("RECIPE_TTL_S", "10"))) as e,
            open(journal, "a", buffering=1) as out,
        ):
            while True:
                try:
                    with e.leadership(resign_on_exit=False) as lease:
                        while True:
                            t = time.clock_gettime(time.CLOCK_BOOTTIME)
                            lease.check()
                            out.write(f"{os.getpid()} {lease.fencing_token} {t:.6f}\n")
                            time.sleep(0.02)
                except elector.LeadershipLost:
                    continue

    elector.sync.run(main)


def main() -> None:
    url, lock, journal = sys.argv[1:4]
    context = multiprocessing.get_context(sys.argv[4] if len(sys.argv) > 4 else "spawn")
    children = [context.Process(target=child, args=(url, lock, journal)) for _ in range(2)]
    for process in children:
        process.start()
    print("READY", *(process.pid for process in children), flush=True)

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        for process in children:
            process.terminate()  # SIGTERM: each child releases on its way out

    signal.signal(signal.SIGTERM, on_sigterm)
    for process in children:
        process.join()


if __name__ == "__main__":
    main()
