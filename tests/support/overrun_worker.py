"""A sync worker whose body holds the GIL in C, for tests of `on_overrun="exit"` (judged on journals).

    python -m tests.support.overrun_worker URL LOCK IDENTITY TTL_S JOURNAL MODE [GO_FILE]

Every line it appends to JOURNAL is `<identity> <event> <fencing token> <t>`, `t` on
CLOCK_BOOTTIME (one clock for every process of the host). From its start a heartbeat thread (a
plain Python thread, like the guard thread `on_overrun="exit"` had) journals `beat` every 5 ms:
while anything holds the GIL, it stops. MODE:

* `hold-sleep`, `hold-regex` (with `on_overrun="exit"`): leads, journals `grant`, then `work`
  every 5 ms until GO_FILE exists, then journals `hold` and calls C code that holds the GIL for
  about 10 s: `sleep(10)` of the C library through `ctypes.PyDLL` (which, unlike `ctypes.CDLL`,
  keeps the GIL during the call), or a regex that backtracks (`(a+)+$` on 27 a's and a b).
* `follow`: contends and, once granted, journals `grant` and goes on leading (`work` lines, each
  after `lease.check()`).

`READY` is printed once the Elector is started.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
import threading
import time
from pathlib import Path

import elector
import elector.sync
from elector.election.clock import boottime

HOLD_S = 10


def hold_the_gil(mode: str) -> None:
    if mode == "hold-sleep":
        ctypes.PyDLL(None).sleep(HOLD_S)
    else:
        re.match(r"(a+)+$", "a" * 27 + "b")


def main(url: str, lock: str, identity: str, *, ttl_s: float, journal_path: str, mode: str, go: str) -> None:
    journal = os.open(journal_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def note(event: str, token: int = 0) -> None:
        os.write(journal, f"{identity} {event} {token} {boottime():.6f}\n".encode())

    def heartbeat() -> None:
        while True:
            note("beat")
            time.sleep(0.005)

    threading.Thread(target=heartbeat, daemon=True).start()
    on_overrun = "withhold" if mode == "follow" else "exit"
    with elector.sync.Elector(lock, redis=url, identity=identity, ttl_s=ttl_s, on_overrun=on_overrun) as e:
        print("READY", flush=True)
        while True:
            try:
                with e.leadership(resign_on_exit=False) as lease:
                    note("grant", lease.fencing_token)
                    while mode == "follow" or not Path(go).exists():
                        lease.check()
                        note("work", lease.fencing_token)
                        time.sleep(0.005)
                    note("hold", lease.fencing_token)
                    hold_the_gil(mode)
                    note("held", lease.fencing_token)  # only if nothing ended the process
            except elector.LeadershipLost:
                pass


if __name__ == "__main__":
    url, lock, identity, ttl, path, mode = sys.argv[1:7]
    go = sys.argv[7] if len(sys.argv) > 7 else ""
    main(url, lock, identity, ttl_s=float(ttl), journal_path=path, mode=mode, go=go)
