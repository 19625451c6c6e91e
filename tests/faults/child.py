"""The leader's command in the fault suite: journals its term and does fenced writes until SIGTERM.

Run by `elector run ... -- python tests/faults/child.py --journal FILE --resource-url URL --key K`.
Every record is one JSON line written with a single write() on an O_APPEND descriptor and fsynced,
so records of a SIGKILLed child are never torn and never lost. Times are time.monotonic():
CLOCK_MONOTONIC is one clock for every process on the machine, so the checker can compare the
records of all children and of the harness directly.

Records (`kind`):
- ``start``: written first thing, before any import that could delay it: from here on the child
  may act. Carries pid, identity, lock and fencing token from the daemon's environment.
- ``write``: one fenced write (``op`` ``raise`` for the fence raised at start, then ``set``),
  with its send time ``t`` and reply time ``t_reply``, ``accepted`` and the ``highest`` token the
  resource reports. A write whose reply never came (an error) is journaled with ``accepted``
  null: it may have landed, so the checker counts it as accepted at any later time.
- ``end``: written by the main loop after SIGTERM, after the last write's reply: nothing happens
  after it. A SIGKILLed child has none; the checker then bounds its term by the moment the
  harness saw the process gone.
"""

from __future__ import annotations

import json
import os
import sys
import time

_START = time.monotonic()  # before the heavier imports: the term is counted from the earliest moment


def _append(fd: int, record: dict[str, object]) -> None:
    os.write(fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())
    os.fsync(fd)


def _open(path: str) -> int:
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


def _argument(name: str) -> str:
    argv = sys.argv[1:]
    try:
        return argv[argv.index(name) + 1]
    except (ValueError, IndexError):
        raise SystemExit(f"child.py: {name} is required") from None


def main() -> None:
    import signal

    # Until asyncio's handlers are in place, a SIGTERM is remembered instead of killing the
    # child mid-import without its end record.
    early_stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: early_stop.append(signum))
    journal = _open(_argument("--journal"))
    identity = os.environ["ELECTOR_IDENTITY"]
    token = int(os.environ["ELECTOR_FENCING_TOKEN"])
    # The start time (clock ticks since boot, /proc/self/stat field 22) names this process for
    # good: the harness signals a pid only while it still has it, never a process that got the
    # pid after this one ended (pid_max can be 32768; a loaded suite recycles pids in minutes).
    # Read here rather than with proctree.read_proc: that module imports asyncio, and this record
    # is written before any import that could delay it.
    with open("/proc/self/stat") as stat:
        starttime = int(stat.read().rsplit(")", 1)[1].split()[19])
    base = {"identity": identity, "pid": os.getpid(), "token": token, "starttime": starttime}
    _append(journal, {"kind": "start", "t": _START, "lock": os.environ["ELECTOR_LOCK"], **base})

    import asyncio
    import contextlib

    import redis.asyncio

    from elector.library.fencing import FencedStore

    interval_s = float(os.environ.get("FAULTS_WRITE_INTERVAL_S", "0.05"))

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        if early_stop:
            stop.set()
        client = redis.asyncio.Redis.from_url(
            _argument("--resource-url"), socket_timeout=1.0, socket_connect_timeout=1.0
        )
        store = FencedStore(client)
        key = _argument("--key")
        seq = 0
        while not stop.is_set():
            op = "raise" if seq == 0 else "set"
            sent = time.monotonic()
            record: dict[str, object] = {"kind": "write", "op": op, "seq": seq, "t": sent, **base}
            try:
                if seq == 0:  # shut the previous leader out at once, before any real work
                    result = await store.raise_fence(key, fencing_token=token)
                else:
                    result = await store.set(key, f"{identity}:{token}:{seq}", fencing_token=token)
            except Exception as exc:  # the resource is not faulted; an error is journaled, not fatal
                record.update(t_reply=time.monotonic(), accepted=None, error=type(exc).__name__)
            else:
                record.update(
                    t_reply=time.monotonic(), accepted=result.accepted, highest=result.highest_token
                )
            _append(journal, record)
            seq += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=interval_s)
        _append(journal, {"kind": "end", "t": time.monotonic(), "writes": seq, **base})
        await client.aclose()

    asyncio.run(run())


if __name__ == "__main__":
    main()
