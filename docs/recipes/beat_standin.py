"""Recipe: the stand-in for `celery beat` under exec mode (`elector run --lock beat -- ...`).

    elector run --redis-url URL --lock beat -- python beat_standin.py JOURNAL

Celery itself is not installed for the test; this program does what beat does for the recipe:
it "sends" a scheduled task every 20 ms, journaling `<pid> <ELECTOR_FENCING_TOKEN> <t>` with t on
CLOCK_BOOTTIME (the clock every process of the host shares), until it is stopped.
"""

from __future__ import annotations

import os
import sys
import time


def main() -> None:
    token = os.environ.get("ELECTOR_FENCING_TOKEN", "?")
    with open(sys.argv[1], "a", buffering=1) as journal:
        while True:
            journal.write(f"{os.getpid()} {token} {time.clock_gettime(time.CLOCK_BOOTTIME):.6f}\n")
            time.sleep(0.02)


if __name__ == "__main__":
    main()
