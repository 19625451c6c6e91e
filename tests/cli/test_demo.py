"""`elector demo` end to end: a private Redis, three replicas, a SIGKILL and a SIGTERM takeover."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TTL_MS = 1000


def _pid_gone(pid: int) -> bool:
    """True when the process no longer exists or is a zombie (dead, waiting to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    # Field 3, after the parenthesised command name (which may itself contain spaces).
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def _live_processes_with(*needles: bytes) -> list[tuple[int, str]]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if all(needle in cmdline for needle in needles) and not _pid_gone(int(entry.name)):
            found.append((int(entry.name), cmdline.replace(b"\0", b" ").decode(errors="replace")))
    return found


def _run_demo(redis_binary: str) -> tuple[int, str]:
    env = {key: value for key, value in os.environ.items() if key != "ELECTOR_DEMO_KEEP_LOGS"}
    env["PYTHONUNBUFFERED"] = "1"
    command = [sys.executable, "-m", "elector", "demo", "--ttl", "1s", "--rounds", "2", "--replicas", "3"]
    command += ["--redis-server", redis_binary]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO
    )
    try:
        output, _ = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        # Ctrl-C lets the demo stop what it started; only then force it.
        process.send_signal(signal.SIGINT)
        try:
            output, _ = process.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
        pytest.fail(f"the demo did not finish within 60 s:\n{output}")
    return process.returncode, output


def test_demo_shows_two_takeovers_and_cleans_up(redis_binary: str) -> None:
    started = time.monotonic()
    returncode, output = _run_demo(redis_binary)
    assert returncode == 0, output
    assert time.monotonic() - started < 40, output

    lines = output.splitlines()
    first = re.fullmatch(
        r"redis-server pid (\d+) on (redis://127\.0\.0\.1:(\d+)/0); replica logs in (\S+)", lines[0]
    )
    assert first, lines[0]
    redis_pid, redis_url, redis_port, log_dir = int(first[1]), first[2], int(first[3]), Path(first[4])
    assert redis_port != 6379

    takeovers = [line for line in lines if "took over" in line]
    assert len(takeovers) == 2, output
    assert "after SIGKILL: crash takeover" in takeovers[0]
    assert "after SIGTERM: graceful handoff" in takeovers[1]

    summary = dict(re.findall(r"^\s+(SIGKILL|SIGTERM)\s+takeover\s+([\d.]+) ms$", output, re.MULTILINE))
    assert set(summary) == {"SIGKILL", "SIGTERM"}, output
    assert len(re.findall(r"^\s+SIG\w+\s+takeover", output, re.MULTILINE)) == 2
    assert "summary (ttl 1s, 3 replicas):" in output
    sigterm_ms, sigkill_ms = float(summary["SIGTERM"]), float(summary["SIGKILL"])
    # A graceful handoff releases the lease: no waiting for it to run out.
    assert sigterm_ms < TTL_MS / 2, output
    # A crash is detected when the lease runs out: at most about a ttl after the last renewal.
    assert sigterm_ms < sigkill_ms < TTL_MS + 1000, output

    # Each new leader holds a larger fencing token than the one before.
    tokens = [int(token) for token in re.findall(r"LEADER \(token (\d+)\)", output)]
    distinct = list(dict.fromkeys(tokens))
    assert len(distinct) == 3, output
    assert distinct == sorted(distinct), output

    # Nothing it started is left behind.
    deadline = time.monotonic() + 5
    while not _pid_gone(redis_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _pid_gone(redis_pid), f"redis-server {redis_pid} still alive"
    replicas = _live_processes_with(b"--lock\0demo", redis_url.encode())
    assert replicas == [], replicas
    assert not log_dir.exists(), f"{log_dir} was not removed"
