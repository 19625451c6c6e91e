"""The recipes of docs/recipes/ run as written, as processes, against a real redis-server.

Each is judged on what it does: journals of the workers' own steps (no two leaders' steps
overlap), the fence's accepted tokens (never going back), /leader answers, exec mode's child.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from elector.testing.redis_server import free_tcp_port
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "docs" / "recipes"
LOCK = "jobs"


class Programs:
    def __init__(self) -> None:
        self.started: list[subprocess.Popen[str]] = []

    def start(self, *args: str, ready: bool = True) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [*args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        self.started.append(process)
        if ready:
            assert process.stdout is not None
            assert process.stdout.readline().split()[:1] == ["READY"]
        return process

    def stop_all(self) -> None:
        for process in self.started:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=10)


@pytest.fixture
def programs(seeded: redis.Redis) -> Iterator[Programs]:
    started = Programs()
    yield started
    started.stop_all()


def terms(lines: list[list[str]]) -> dict[tuple[str, str], tuple[float, float]]:
    """(who, token) -> (first, last) time of its journal lines."""
    found: dict[tuple[str, str], tuple[float, float]] = {}
    for who, token, at in lines:
        first, last = found.get((who, token), (float(at), float(at)))
        found[(who, token)] = (min(first, float(at)), max(last, float(at)))
    return found


def overlaps(found: dict[tuple[str, str], tuple[float, float]]) -> list[object]:
    items = sorted(found.items())
    return [
        (one, other)
        for i, one in enumerate(items)
        for other in items[i + 1 :]
        if one[0][1] != other[0][1] and one[1][0] <= other[1][1] and other[1][0] <= one[1][1]
    ]


def journal_lines(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def test_threaded_worker(redis_url: str, programs: Programs, seeded: redis.Redis, tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    first = programs.start(sys.executable, str(RECIPES / "threaded_worker.py"), redis_url, LOCK, str(journal))
    wait_until(lambda: journal_lines(journal), timeout_s=10)
    programs.start(sys.executable, str(RECIPES / "threaded_worker.py"), redis_url, LOCK, str(journal))
    leader = journal_lines(journal)[0][0]
    first.send_signal(signal.SIGTERM)  # the first one leads: SIGTERM releases, the other takes over
    assert first.wait(timeout=10) == 143
    wait_until(lambda: {line[0] for line in journal_lines(journal)} != {leader}, timeout_s=10)
    assert len(terms(journal_lines(journal))) >= 2
    assert overlaps(terms(journal_lines(journal))) == []


def test_periodic_job_writes_through_the_fence(
    redis_url: str, programs: Programs, seeded: redis.Redis
) -> None:
    """The resource is the fenced value itself, sampled as it changes: once the successor has
    written, the paused and resumed first job never gets a write in again."""
    report = f"{{{LOCK}}}:report"
    writers: list[str] = []  # who wrote the stored value, each change once

    def sample() -> None:
        value = seeded.get(report)
        if value is not None:
            writer = value.decode().split()[0]
            if not writers or writers[-1] != writer:
                writers.append(writer)

    def sampling_until(predicate: Callable[[], bool], *, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            assert time.monotonic() < deadline, "timed out"
            sample()
            time.sleep(0.002)

    first = programs.start(sys.executable, str(RECIPES / "periodic_job.py"), redis_url, LOCK)
    sampling_until(lambda: len(writers) == 1, timeout_s=10)
    programs.start(sys.executable, str(RECIPES / "periodic_job.py"), redis_url, LOCK)
    first.send_signal(signal.SIGSTOP)  # paused past its lease: the other leads and writes
    try:
        sampling_until(lambda: len(writers) >= 2, timeout_s=15)
    finally:
        first.send_signal(signal.SIGCONT)
    resumed_at = time.monotonic()
    sampling_until(lambda: time.monotonic() > resumed_at + 1.0, timeout_s=5)
    assert writers[:2] == [writers[0], writers[1]] and writers[0] != writers[1]
    assert writers[2:] == [], writers  # the first job's late write, if it tried one, was refused
    accepted = [int(token) for token in seeded.lrange(f"{LOCK}:accepted", 0, -1)]
    assert len(set(accepted)) == 2
    assert seeded.get(f"{report}:fence") == str(max(accepted)).encode()


def get_leader(port: int) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/leader", timeout=2) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    except OSError:
        return 0, {}


def test_web_app_lifespan_with_a_leader_endpoint(redis_url: str, programs: Programs) -> None:
    ports = [free_tcp_port(), free_tcp_port()]
    apps = [
        programs.start(sys.executable, str(RECIPES / "web_leader_endpoint.py"), redis_url, LOCK, str(port))
        for port in ports
    ]
    wait_until(lambda: sorted(get_leader(port)[0] for port in ports) == [200, 503], timeout_s=15)
    [leading] = [i for i, port in enumerate(ports) if get_leader(port)[0] == 200]
    other = 1 - leading
    # The follower names the leader once it has looked at the lock.
    wait_until(lambda: get_leader(ports[other])[1].get("holder"), timeout_s=10)
    assert get_leader(ports[other])[1]["leader"] is False
    apps[leading].send_signal(signal.SIGTERM)  # aiohttp stops gracefully: the lifespan releases
    apps[leading].wait(timeout=10)
    wait_until(lambda: get_leader(ports[other])[0] == 200, timeout_s=5)


def test_beat_singleton_in_exec_mode(redis_url: str, programs: Programs, tmp_path: Path) -> None:
    journal = tmp_path / "beat"
    command = [sys.executable, str(RECIPES / "beat_standin.py"), str(journal)]

    def daemon(identity: str) -> subprocess.Popen[str]:
        return programs.start(
            sys.executable, "-m", "elector", "run", "--redis-url", redis_url, "--lock", LOCK,
            "--identity", identity, "--ttl", "2s", "--http-address", f"127.0.0.1:{free_tcp_port()}",
            "--", *command,
            ready=False,
        )  # fmt: skip

    first = daemon("beat-a")
    wait_until(lambda: journal_lines(journal), timeout_s=15)
    daemon("beat-b")
    first.send_signal(signal.SIGTERM)  # the daemon stops beat, then releases
    first.wait(timeout=15)
    pids = {line[0] for line in journal_lines(journal)}
    wait_until(lambda: {line[0] for line in journal_lines(journal)} != pids, timeout_s=15)
    assert overlaps(terms(journal_lines(journal))) == []
