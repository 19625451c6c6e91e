"""The sync Elector and its process: closed at the interpreter's exit, and a warning when it is
called on a thread that runs an event loop. Against a real redis-server."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
import redis

import elector.sync
from tests.support.seed import seed_used_lock

ROOT = Path(__file__).resolve().parents[2]
LOCK = "jobs"

#: A worker that leads, then ends with sys.exit without closing its Elector (what a gunicorn or
#: Celery worker does when the program made no exit hook).
EXITS_LEADING = """
import sys, elector.sync
e = elector.sync.Elector("jobs", redis=sys.argv[1], ttl_s=10)
e.start()
e.wait_for_leadership(timeout=10)
print("LEADING", flush=True)
sys.exit(0)
"""


def test_an_elector_left_open_is_closed_at_the_interpreter_exit(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    seed_used_lock(client, LOCK)
    try:
        result = subprocess.run(
            [sys.executable, "-c", EXITS_LEADING, redis_url],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert result.stdout.strip() == "LEADING", result.stderr
        assert result.returncode == 0, result.stderr
        # Released: without it, the key would live on for most of its 10 s ttl.
        assert client.exists(f"elector:{{{LOCK}}}:lease") == 0
    finally:
        client.close()


async def test_the_sync_api_warns_when_called_on_a_thread_that_runs_an_event_loop(redis_url: str) -> None:
    e = elector.sync.Elector(LOCK, redis=redis_url, ttl_s=2)
    with pytest.warns(RuntimeWarning, match=r"start\(\) .* blocks that loop"):
        e.start()
    try:
        with pytest.warns(RuntimeWarning, match=r"wait_for_leadership\(\) .* asyncio.to_thread"):
            e.wait_for_leadership(timeout=10)
    finally:
        await asyncio.to_thread(e.close)
