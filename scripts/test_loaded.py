"""`make test-loaded`: the whole suite (`make test`) while a CPU and I/O load of our own runs beside it.

A CI machine is often shared and busy; the suite must hold there too (a flaky test is a failed
test). This reproduces such a machine on any machine: for the suite's whole length it runs

- two busy processes (a spinning loop each: on two cores, every test competes for the CPU),
- a disk writer (rewrites a 64 MiB file at up to 32 MiB/s, fsyncing every 8 MiB: page cache and
  I/O pressure), and
- the fault suite's soak (tests/faults/test_mix.py, plain-Redis mix, --faults-profile=soak) in
  back-to-back runs: redis-servers, daemons, proxies and their faults, a realistic neighbour.

The soak runs without pytest-xdist, so its ports come from the OS (elector.testing.redis_server):
never from the blocks 20000-32000 that the suite's xdist workers walk.

The load stops when the suite ends, passes, fails, or is interrupted (Ctrl-C, SIGTERM): each part
runs in a session of its own, the soak is interrupted first (so its fixtures stop their Redis and
daemons), then every process of every part that is still alive is killed by its PID. The busy
processes and the writer also stop by themselves if this script disappears (SIGKILL).

Exit status: the suite's; if the suite passed, 1 when a soak run that finished failed (the fault
suite found something under load: its log is kept and named). Only stdlib: runs before .venv exists.

    python3 scripts/test_loaded.py                   # make test, loaded
    python3 scripts/test_loaded.py -- pytest tests/daemon -q   # another command, loaded
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTEST = ROOT / ".venv" / "bin" / "pytest"

#: A spinning loop that ends when its parent (this script) is gone, even after a SIGKILL of it.
BUSY = "import os, sys\nparent = int(sys.argv[1])\nwhile os.getppid() == parent:\n    pass\n"

#: Rewrites a 64 MiB file in place, fsyncing every 8 MiB, at up to 32 MiB/s, until its parent is gone.
#: In place and paced: writing and unlinking whole files as fast as the disk takes them turned every
#: unlink into a discard of 64 MiB on a disk mounted with `discard`, and every other process's rmdir
#: (pytest's temporary directories) then waited seconds to minutes in the kernel: a load that stalls
#: the disk for everyone, not the busy neighbour a CI machine has.
WRITER = """\
import os, sys, time
parent, path = int(sys.argv[1]), sys.argv[2]
block = os.urandom(1 << 20)
fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
offset, started, written = 0, time.monotonic(), 0
while os.getppid() == parent:
    os.pwrite(fd, block, offset)
    offset = (offset + len(block)) % (64 << 20)
    written += 1
    if written % 8 == 0:
        os.fsync(fd)
    ahead = written / 32 - (time.monotonic() - started)
    if ahead > 0:
        time.sleep(ahead)
os.close(fd)
os.unlink(path)
"""

#: How long a soak run's fault mix lasts; runs follow each other until the suite ends.
SOAK_MINUTES = 2.0
#: How long an interrupted soak may take to stop its cluster before what is left is killed.
SOAK_STOP_S = 60.0


def say(message: str) -> None:
    print(f"test-loaded: {message}", file=sys.stderr, flush=True)


def descendants(pid: int) -> set[tuple[int, int]]:
    """(pid, start time) of every live process below `pid`: the start time tells a reused PID apart."""
    children: dict[int, list[int]] = {}
    started: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        child = int(entry.name)
        children.setdefault(int(fields[1]), []).append(child)
        started[child] = int(fields[19])
    found: set[tuple[int, int]] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add((child, started[child]))
            todo.append(child)
    return found


def kill_if_same(pid: int, start_time: int) -> bool:
    """SIGKILL `pid` if it is still the process that started at `start_time`; whether it was."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if int(stat[stat.rindex(")") + 2 :].split()[19]) != start_time:
        return False
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


class Soak(threading.Thread):
    """The fault suite's soak, run after run, until stop(); each run's log is kept in `directory`."""

    def __init__(self, directory: Path, *, minutes: float) -> None:
        super().__init__(name="soak", daemon=True)
        self.directory = directory
        self.minutes = minutes
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.process: subprocess.Popen[bytes] | None = None
        self.seen: set[tuple[int, int]] = set()
        self.finished: list[tuple[Path, int]] = []  # (log, exit code) of the runs that ran to the end

    def run(self) -> None:
        env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_XDIST")}
        number = 0
        while not self.stopping.is_set():
            number += 1
            log_path = self.directory / f"soak-{number}.log"
            command = [
                str(PYTEST), "tests/faults/test_mix.py", "-k", "plain", "-q", "-p", "no:cacheprovider",
                "--faults-profile=soak", f"--soak-minutes={self.minutes}",
                f"--basetemp={self.directory / f'soak-{number}'}",
            ]  # fmt: skip
            with self.lock:
                if self.stopping.is_set():
                    return
                with log_path.open("wb") as log:
                    self.process = subprocess.Popen(
                        command, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log,
                        stderr=subprocess.STDOUT, start_new_session=True,
                    )  # fmt: skip
            while self.process.poll() is None:
                self.seen |= descendants(self.process.pid)
                time.sleep(1.0)
            with self.lock:
                if not self.stopping.is_set():
                    self.finished.append((log_path, self.process.returncode))
                    if self.process.returncode != 0:
                        say(f"a soak run failed (exit {self.process.returncode}): {log_path}")

    def stop(self) -> None:
        """Interrupt the running soak (its fixtures stop their cluster), then kill what is left."""
        with self.lock:
            self.stopping.set()
            process = self.process
        if process is None:
            return
        if process.poll() is None:
            self.seen |= descendants(process.pid)
            os.kill(process.pid, signal.SIGINT)
            try:
                process.wait(timeout=SOAK_STOP_S)
            except subprocess.TimeoutExpired:
                say(f"the soak did not stop in {SOAK_STOP_S:.0f} s: killing it")
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self.join(timeout=5.0)
        left = [pid for pid, start_time in sorted(self.seen) if kill_if_same(pid, start_time)]
        if left:
            say(f"killed {len(left)} process(es) the soak left behind: {left}")


def start_load(directory: Path) -> list[subprocess.Popen[bytes]]:
    """The two busy processes and the disk writer, each in a session of its own (no Ctrl-C)."""
    parent = str(os.getpid())
    commands = [
        [sys.executable, "-c", BUSY, parent],
        [sys.executable, "-c", BUSY, parent],
        [sys.executable, "-c", WRITER, parent, str(directory / "writer.bin")],
    ]
    return [
        subprocess.Popen(command, stdin=subprocess.DEVNULL, start_new_session=True) for command in commands
    ]


def stop_load(processes: Sequence[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        if process.poll() is None:
            process.kill()
    for process in processes:
        process.wait()


def run_suite(command: Sequence[str]) -> int:
    """The suite, in a process group of its own, to the end.

    A Ctrl-C or a SIGTERM (timeout(1), a CI's cancel) of this script reaches the suite as a SIGINT to
    its whole group: pytest stops its tests and runs their teardown (stopping their Redis and
    daemons) while we wait; the load is stopped after that, in main().
    """
    suite = subprocess.Popen(command, cwd=ROOT, process_group=0)

    def interrupt(signum: int, _frame: object) -> None:
        say(f"{signal.Signals(signum).name}: interrupting the suite, waiting for it to stop")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(suite.pid, signal.SIGINT)

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    return suite.wait()


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--soak-minutes", type=float, default=SOAK_MINUTES, help="length of each soak run")
    parser.add_argument("command", nargs="*", default=["make", "test"], help="the suite (default: make test)")
    args = parser.parse_args(argv)
    # A shell that starts us in the background (`make test-loaded &`, nohup, many CI runners) leaves
    # SIGINT ignored, and an ignored signal stays ignored across exec: the suite and the soak would
    # then never see the interrupt that stops them with their teardown (their Redis and daemons).
    # Python only installs its KeyboardInterrupt handler when SIGINT is not ignored at start-up, so
    # the default must be back before the first child is spawned.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if not PYTEST.exists():
        subprocess.run(["make", "setup"], cwd=ROOT, check=True)

    directory = Path(tempfile.mkdtemp(prefix="elector-test-loaded-"))
    load: list[subprocess.Popen[bytes]] = []
    soak = Soak(directory, minutes=args.soak_minutes)
    started = time.monotonic()
    try:
        load = start_load(directory)
        soak.start()
        say(f"load running (2 busy processes, a disk writer, the soak; logs in {directory}): {args.command}")
        code = run_suite(args.command)
    finally:
        stop_load(load)
        soak.stop()
        (directory / "writer.bin").unlink(missing_ok=True)
    failed = [(path, rc) for path, rc in soak.finished if rc != 0]
    say(
        f"suite exit {code} in {time.monotonic() - started:.0f} s; soak runs finished: "
        f"{len(soak.finished)}, failed: {len(failed)}"
    )
    for path, rc in failed:
        say(f"  soak failed (exit {rc}), log kept: {path}")
    if not failed:
        shutil.rmtree(directory, ignore_errors=True)
    if code < 0:  # the suite was ended by a signal: the shell's convention
        return 128 - code
    if code == 0 and failed:
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
