"""Where the leader's threads were while it did not renew: their kernel states, sampled from outside.

An HTTP attack that costs the leader a renewal leaves one question the lease's figures cannot
answer: was the election's thread waiting for the CPU (a loaded machine), for the GIL or a lock
(another thread of the daemon), for the disk, or idle with its timer not yet due? Loaded run #20's
soak lost a lease to slowloris with no renewal attempted for 2.3 s, and nothing in the daemon's log
or the witnesses said which. This sampler reads, every `period_s` and from this process (so the
daemon pays nothing), each of the leader's threads' /proc/<pid>/task/<tid>/{stat,wchan,schedstat}:

- the state (R running or runnable, S sleeping, D in uninterruptible disk wait) and the kernel
  function it sleeps in (`wchan`: `ep_poll` is an event loop waiting for I/O or its timer,
  `futex_wait_queue` a thread waiting for the GIL or a lock, `do_sys_poll`, `pipe_write`, ...);
- CPU time and run delay (time spent runnable but waiting for a CPU) from schedstat.

`summary(start=, end=)` says, per thread, what it did in a window: the CPU it used, how long it
waited for a CPU, and its states by share of samples.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections import Counter

#: Threads shown per summary: the election's (main) thread, then the busiest others.
THREADS_SHOWN = 3
#: States shown per thread, the most frequent first.
STATES_SHOWN = 3


@dataclasses.dataclass(frozen=True)
class TaskSample:
    at: float  # time.time(), the clock the lease monitor's server times are compared with
    tid: int
    state: str  # e.g. "S:ep_poll", "R", "D:io_schedule"
    cpu_ns: int
    run_delay_ns: int


def read_tasks(pid: int, *, at: float) -> list[TaskSample]:
    """One sample of every thread of `pid`; threads that end while being read are left out."""
    found: list[TaskSample] = []
    base = f"/proc/{pid}/task"
    with contextlib.suppress(OSError):
        tids = os.listdir(base)
        for name in tids:
            with contextlib.suppress(OSError, ValueError, IndexError):
                path = f"{base}/{name}"
                with open(f"{path}/stat") as file:
                    state = file.read().rsplit(")", 1)[1].split()[0]
                with open(f"{path}/wchan") as file:
                    wchan = file.read().strip()
                with open(f"{path}/schedstat") as file:
                    cpu_ns, run_delay_ns, *_ = (int(word) for word in file.read().split())
                label = f"{state}:{wchan}" if wchan and wchan != "0" else state
                found.append(TaskSample(at, int(name), label, cpu_ns, run_delay_ns))
    return found


def summarise(samples: list[TaskSample], *, pid: int, start: float, end: float) -> str:
    """Per thread in [start, end]: CPU used, run delay, states by share of samples."""
    by_tid: dict[int, list[TaskSample]] = {}
    for sample in samples:
        if start <= sample.at <= end:
            by_tid.setdefault(sample.tid, []).append(sample)
    if not by_tid:
        return f"no samples in {end - start:.2f}s"

    def cpu_ns(tid: int) -> int:
        return by_tid[tid][-1].cpu_ns - by_tid[tid][0].cpu_ns

    order = sorted(by_tid, key=lambda tid: (tid != pid, -cpu_ns(tid)))[:THREADS_SHOWN]
    parts = []
    for tid in order:
        seen = by_tid[tid]
        delay_s = (seen[-1].run_delay_ns - seen[0].run_delay_ns) / 1e9
        states = Counter(sample.state for sample in seen).most_common(STATES_SHOWN)
        shares = " ".join(f"{state} {100 * count / len(seen):.0f}%" for state, count in states)
        name = "main" if tid == pid else f"thread {tid}"
        parts.append(f"{name}: cpu {cpu_ns(tid) / 1e9:.2f}s, waited for a CPU {delay_s:.2f}s, {shares}")
    return f"{len(by_tid)} threads over {end - start:.2f}s; " + "; ".join(parts)


class ThreadSampler:
    """Samples every thread of `pid` every `period_s`, in a thread of this process."""

    def __init__(self, pid: int, *, period_s: float = 0.02) -> None:
        self.pid = pid
        self._period_s = period_s
        self.samples: list[TaskSample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="thread-sampler", daemon=True)

    def start(self) -> ThreadSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def summary(self, *, start: float, end: float) -> str:
        return summarise(list(self.samples), pid=self.pid, start=start, end=end)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.extend(read_tasks(self.pid, at=time.time()))
            self._stop.wait(self._period_s)
