"""The leader's threads as the sampler reads them: real /proc of this process, and the summary's sums."""

from __future__ import annotations

import os
import threading
import time

from tests.faults.thread_sampler import TaskSample, ThreadSampler, read_tasks, summarise


def test_every_thread_of_a_process_is_read_with_its_kernel_state() -> None:
    stop = threading.Event()
    sleeper = threading.Thread(target=stop.wait, name="sleeper")
    sleeper.start()
    try:
        # A thread just started may still be runnable (run #21, at load 10): wait until it sleeps.
        deadline = time.monotonic() + 10
        while True:
            samples = read_tasks(os.getpid(), at=time.time())
            asleep = [s for s in samples if s.tid == sleeper.native_id and s.state.startswith("S")]
            if asleep or time.monotonic() > deadline:
                break
            time.sleep(0.01)
    finally:
        stop.set()
        sleeper.join()
    by_tid = {sample.tid: sample for sample in samples}
    assert os.getpid() in by_tid and sleeper.native_id in by_tid
    assert by_tid[os.getpid()].state == "R"  # reading /proc right now
    assert by_tid[sleeper.native_id].state.startswith("S")  # asleep (":wchan" where the kernel shows it)
    assert by_tid[os.getpid()].cpu_ns > 0


def test_a_gone_process_reads_as_no_threads() -> None:
    assert read_tasks(2**22 + 1, at=0.0) == []  # above any pid_max: never a process


def test_the_summary_is_what_each_thread_did_inside_the_window() -> None:
    pid = 100
    samples = [
        TaskSample(at, tid, state, cpu_ns, delay_ns)
        for at, tid, state, cpu_ns, delay_ns in [
            (0.5, pid, "S:ep_poll", 0, 0),  # before the window: not counted
            (1.0, pid, "R", 10_000_000, 0),
            (1.5, pid, "R", 20_000_000, 400_000_000),
            (2.0, pid, "S:futex_wait_queue", 30_000_000, 900_000_000),
            (2.5, pid, "S:futex_wait_queue", 30_000_000, 900_000_000),
            (1.0, 101, "R", 0, 0),
            (2.5, 101, "R", 1_200_000_000, 100_000_000),
        ]
    ]
    summary = summarise(samples, pid=pid, start=1.0, end=2.5)
    assert summary == (
        "2 threads over 1.50s; main: cpu 0.02s, waited for a CPU 0.90s, R 50% S:futex_wait_queue 50%; "
        "thread 101: cpu 1.20s, waited for a CPU 0.10s, R 100%"
    )
    assert summarise(samples, pid=pid, start=5.0, end=6.0) == "no samples in 1.00s"


def test_the_sampler_collects_until_stopped() -> None:
    sampler = ThreadSampler(os.getpid(), period_s=0.01).start()
    time.sleep(0.1)
    sampler.stop()
    count = len(sampler.samples)
    assert count > 0 and {sample.tid for sample in sampler.samples} >= {os.getpid()}
    time.sleep(0.05)
    assert len(sampler.samples) == count
