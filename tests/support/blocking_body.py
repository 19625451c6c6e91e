"""An asyncio program whose leader body blocks the loop past the ttl once (a common bug).

    python -m tests.support.blocking_body URL LOCK TTL_S JOURNAL

The documented loop (`leadership(resign_on_exit=False)`, `lease.check()` first, `except
LeadershipLost`); in its first term the body calls `time.sleep(1.5 * ttl)` (blocking, in async
code). Journal lines, `t` on CLOCK_BOOTTIME: `step <token> <t>` for each step of leader work,
`lost <reason> <t>` for each `LeadershipLost` caught (at most 1000 of them: the file stays small
when the program spins). Runs under `elector.run`: SIGTERM ends it (exit 143). Logs go to stderr.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time

import elector
from elector.election.clock import boottime


async def main(url: str, lock: str, *, ttl_s: float, journal_path: str) -> None:
    blocked = False
    lost = 0
    with open(journal_path, "a", buffering=1) as journal:  # noqa: ASYNC230 (tiny appends)
        async with elector.Elector(lock, redis=url, ttl_s=ttl_s) as e:
            print("READY", flush=True)
            while True:
                try:
                    async with e.leadership(resign_on_exit=False) as lease:
                        lease.check()
                        await asyncio.sleep(0.01)
                        journal.write(f"step {lease.fencing_token} {boottime():.6f}\n")
                        if not blocked:
                            blocked = True
                            time.sleep(1.5 * ttl_s)  # noqa: ASYNC251 (the bug this program shows)
                except elector.LeadershipLost as exc:
                    lost += 1
                    if lost <= 1000:
                        journal.write(f"lost {exc.reason} {boottime():.6f}\n")


if __name__ == "__main__":
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
    url, lock, ttl, path = sys.argv[1:5]
    elector.run(main(url, lock, ttl_s=float(ttl), journal_path=path))
