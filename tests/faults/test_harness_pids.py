"""The fault harness signals a command only while its pid still names that command: a pid
recycled by another process (pid_max can be 32768) is neither alive nor a group to kill."""

from __future__ import annotations

import os
import subprocess

from elector.daemon.execmode.proctree import read_proc

from .harness import alive, group_of


def test_a_pid_is_the_command_only_with_its_own_start_time() -> None:
    process = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        proc = read_proc(process.pid)
        assert proc is not None
        started = proc.start_ticks
        assert alive(process.pid, started)
        assert group_of(process.pid, started) == os.getpgid(process.pid) == process.pid
        # The same pid, another start time: the process that had it is gone, whoever has it now.
        assert not alive(process.pid, started + 1)
        assert group_of(process.pid, started + 1) is None
        # Without a start time (records of older harnesses): the pid alone, as before.
        assert alive(process.pid) and group_of(process.pid) == process.pid
    finally:
        process.kill()
        process.wait()
    assert not alive(process.pid, started) and group_of(process.pid, started) is None
