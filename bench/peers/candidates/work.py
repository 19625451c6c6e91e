"""The work command of the peers benchmark: `python -I -S work.py JOURNAL CANDIDATE`.

Its first act appends `<time.time()> <pid> <candidate>` to JOURNAL in one O_APPEND write (atomic
for a short line, so candidates of one system can share the journal); then it sleeps until
terminated and exits at once on SIGTERM (the default action, nothing to clean up). Only the
standard library, and `-S` skips site, so that the spawn floor is what a tiny command costs.
"""

import os
import sys
import time

line = f"{time.time():.6f} {os.getpid()} {sys.argv[2]}\n".encode()
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
os.write(fd, line)
os.close(fd)
while True:
    time.sleep(3600)
