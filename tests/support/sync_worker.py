"""A worker program on the sync API, for tests judged on its own journal.

    python -m tests.support.sync_worker URL LOCK IDENTITY TTL_S JOURNAL MODE

It leads again and again; while leading, its body appends `<identity> <fencing token> <t>` to
JOURNAL every 5 ms, `t` on CLOCK_BOOTTIME (one clock for every process of the host). MODE:

* `check`: `t` is read, then `lease.check()`, then the line is written: a line says "at t this
  worker had checked it may act" (a pause between the check and the write delays the write, not
  `t`, which stays inside the validity the check saw).
* `exit`: work that never looks (no check at all), with `on_overrun="exit"`: only the hard stop
  keeps it from writing past its term.
* `blind`: the same work without the hard stop (what `exit` protects from: it overlaps).
* `sigterm`: `check`, run under `elector.sync.run`: SIGTERM releases the lease.

`READY` is printed once the Elector is started.
"""

from __future__ import annotations

import os
import sys
import time

import elector
import elector.sync
from elector.election.clock import boottime


def main(url: str, lock: str, identity: str, *, ttl_s: float, journal_path: str, mode: str) -> None:
    on_overrun = "exit" if mode == "exit" else "withhold"
    journal = os.open(journal_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    with elector.sync.Elector(lock, redis=url, identity=identity, ttl_s=ttl_s, on_overrun=on_overrun) as e:
        print("READY", flush=True)
        while True:
            try:
                with e.leadership(resign_on_exit=False) as lease:
                    while True:
                        t = boottime()
                        if mode not in ("exit", "blind"):
                            lease.check()
                        os.write(journal, f"{identity} {lease.fencing_token} {t:.6f}\n".encode())
                        time.sleep(0.005)
            except elector.LeadershipLost:
                pass


if __name__ == "__main__":
    url, lock, identity, ttl, path, mode = sys.argv[1:7]
    if mode == "sigterm":
        elector.sync.run(lambda: main(url, lock, identity, ttl_s=float(ttl), journal_path=path, mode=mode))
    else:
        main(url, lock, identity, ttl_s=float(ttl), journal_path=path, mode=mode)
