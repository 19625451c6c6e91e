"""`elector`'s exit without the interpreter's teardown (elector/cli/main.py `main`): the exit
status, the output and atexit handlers as a normal exit has them; threads to join keep the normal
exit."""

from __future__ import annotations

import subprocess
import sys

PROGRAM = """
import atexit, sys, threading
from elector.cli.main import main
atexit.register(lambda: print("atexit ran", flush=False))
if sys.argv[1] == "with-thread":
    # A non-daemon thread alive at the end: the normal exit joins it, so the fast one must not run.
    threading.Thread(target=lambda: (threading.Event().wait(0.2), print("joined"))).start()
sys.stdout.write("buffered, not flushed")
sys.argv = ["elector", *sys.argv[2:]]
main()
"""


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PROGRAM, *argv], capture_output=True, text=True, timeout=60, check=False
    )


def test_the_status_output_and_atexit_handlers_survive_the_fast_exit() -> None:
    done = run("plain", "--version")
    assert done.returncode == 0
    assert "buffered, not flushed" in done.stdout and "atexit ran" in done.stdout
    assert "elector" in done.stdout

    bad = run("plain", "run", "--no-such-option")
    assert bad.returncode == 2
    assert "No such option" in bad.stderr and "atexit ran" in bad.stdout


def test_a_thread_to_join_keeps_the_normal_exit() -> None:
    done = run("with-thread", "--version")
    assert done.returncode == 0
    assert "joined" in done.stdout and "atexit ran" in done.stdout
