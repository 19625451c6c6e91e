"""One exec-mode candidate built on a Python lock library, as its users would write it:

    python candidate.py KIND --id ID --ready FILE [options] -- CMD [ARGS...]

KIND is one of
- `kazoo`: ZooKeeper, `KazooClient(timeout=SESSION)` and `zk.Election(PATH, ID).run(func)`;
- `redis-lock`: python-redis-lock, `redis_lock.Lock(conn, NAME, expire=TTL, auto_renewal=True)`;
- `redis-py`: redis-py's `Lock` (`conn.lock(NAME, timeout=TTL)`, blocking with its default 0.1 s
  polling) plus a thread that calls `lock.reacquire()` every TTL/3.

It blocks until it holds the lock, then runs CMD and waits for it. SIGTERM while CMD runs
terminates CMD; the candidate then releases the lock (for kazoo: leaves the election) and closes
its connection. SIGTERM while waiting exits at once (a kazoo session close removes its node).
FILE is created once the client is connected, right before blocking on the lock: the bench's
sign that this candidate is a waiter. Losing a redis-py lock (reacquire refused) stops CMD and
exits 3, as an exec-mode wrapper must.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any


class Work:
    """CMD, run while the lock is held."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopping = False

    def run(self) -> None:
        if self.stopping:
            return
        self.proc = subprocess.Popen(self.argv)
        self.proc.wait()

    def stop(self) -> None:
        self.stopping = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" not in argv:
        raise SystemExit("usage: candidate.py KIND [options] -- CMD [ARGS...]")
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="candidate.py")
    parser.add_argument("kind", choices=["kazoo", "redis-lock", "redis-py"])
    parser.add_argument("--id", required=True)
    parser.add_argument("--ready", required=True, type=Path)
    parser.add_argument("--name", required=True, help="lock name (Redis) or election path (ZooKeeper)")
    parser.add_argument("--server", required=True, help="redis:// URL or ZooKeeper host:port")
    parser.add_argument("--ttl", type=float, default=2.0, help="lock expiry / ZooKeeper session timeout, s")
    return parser.parse_args(argv[:split]), argv[split + 1 :]


def run_kazoo(args: argparse.Namespace, work: Work) -> int:
    from kazoo.client import KazooClient  # type: ignore[import-untyped,unused-ignore]

    zk: Any = KazooClient(hosts=args.server, timeout=args.ttl)
    zk.start(timeout=15)
    try:
        election = zk.Election(args.name, args.id)
        args.ready.touch()
        # Election.run holds the lock for as long as work.run runs, then releases it.
        election.run(work.run)
    finally:
        zk.stop()
        zk.close()
    return 0


def run_redis_lock(args: argparse.Namespace, work: Work) -> int:
    import redis
    import redis_lock  # type: ignore[import-untyped,unused-ignore]

    conn = redis.Redis.from_url(args.server)
    lock: Any = redis_lock.Lock(conn, args.name, expire=int(args.ttl), auto_renewal=True)
    args.ready.touch()
    lock.acquire(blocking=True)
    try:
        work.run()
    finally:
        lock.release()  # also stops the renewal thread
        conn.close()
    return 0


def run_redis_py(args: argparse.Namespace, work: Work) -> int:
    import redis
    from redis.exceptions import LockError

    conn = redis.Redis.from_url(args.server)
    # thread_local=False: the token must be visible to the reacquire thread, as redis-py documents.
    lock = conn.lock(args.name, timeout=args.ttl, blocking=True, thread_local=False)
    args.ready.touch()
    lock.acquire()
    done = threading.Event()
    lost = threading.Event()

    def keep() -> None:
        while not done.wait(args.ttl / 3):
            try:
                lock.reacquire()
            except LockError:
                lost.set()
                work.stop()
                return

    keeper = threading.Thread(target=keep, name="reacquire", daemon=True)
    keeper.start()
    try:
        work.run()
    finally:
        done.set()
        keeper.join()
        if not lost.is_set():
            lock.release()
        conn.close()
    return 3 if lost.is_set() else 0


def main(argv: list[str]) -> int:
    args, cmd = parse(argv)
    work = Work(cmd)

    def on_term(signum: int, frame: FrameType | None) -> None:
        if work.proc is None:
            raise SystemExit(0)  # still waiting: nothing held, nothing to stop
        work.stop()  # the main thread returns from CMD's wait and releases the lock

    signal.signal(signal.SIGTERM, on_term)
    runner = {"kazoo": run_kazoo, "redis-lock": run_redis_lock, "redis-py": run_redis_py}[args.kind]
    return runner(args, work)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
