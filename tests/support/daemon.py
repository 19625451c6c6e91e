"""Real `elector run` processes for end-to-end tests: start, probe over HTTP, signal, read logs.

`DaemonStarter` is what the `daemon` fixture (tests/conftest.py) hands out: it starts daemons on
the test's redis-server, waits for their HTTP endpoint, and stops every one after the test.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from elector.testing.redis_server import free_tcp_port
from tests.support.waiting import wait_until

__all__ = ["DaemonProcess", "DaemonStarter", "wait_until"]


class DaemonProcess:
    """One `python -m elector run` child with its own HTTP port and a JSON log file."""

    def __init__(
        self,
        *,
        redis_url: str | None,
        identity: str,
        log_dir: Path,
        lock: str = "jobs",
        ttl: str = "1s",
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.identity = identity
        self.port = free_tcp_port()
        self.log_path = log_dir / f"{identity}.log"
        self.command = [
            sys.executable, "-m", "elector", "run",
            *(["--redis-url", redis_url] if redis_url is not None else []),
            "--lock", lock,
            "--identity", identity,
            "--ttl", ttl,
            "--http-address", f"127.0.0.1:{self.port}",
            "--log-format", "json",
            *extra_args,
        ]  # fmt: skip
        self.env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> DaemonProcess:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=log, env=self.env)
        return self

    def wait_http(self, timeout_s: float = 60.0) -> None:
        """Wait until the daemon serves HTTP; fail at once if it exits.

        The timeout bounds a hang, nothing else: a daemon that cannot start exits and is reported
        at once. Starting Python and its imports took over 10 s (the old bound) on a 2-core machine
        with a load average of 20 (make test-loaded while other jobs ran), so it is generous.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.get("/healthz")[0] != 0:
                return
            if self.process is not None and self.process.poll() is not None:
                raise AssertionError(f"{self.identity} exited {self.process.returncode}:\n{self.logs_text()}")
            time.sleep(0.02)
        raise AssertionError(f"{self.identity} did not serve HTTP in {timeout_s}s:\n{self.logs_text()}")

    def get(self, path: str, *, method: str = "GET") -> tuple[int, str]:
        """(status, body); status 0 when nothing answers."""
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", method=method)
        try:
            with urllib.request.urlopen(request, timeout=1.0) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except (urllib.error.URLError, OSError):
            return 0, ""

    def leader(self) -> dict[str, Any] | None:
        status, body = self.get("/leader")
        return json.loads(body) if status in (200, 503) else None

    def is_leader(self) -> bool:
        return self.get("/leader")[0] == 200

    def metrics(self) -> str:
        return self.get("/metrics")[1]

    def signal(self, signum: signal.Signals) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    def wait(self, timeout_s: float = 30.0) -> int:
        """The exit code. `timeout_s` bounds a hang, not a speed: at a load average of 10 a daemon
        that failed at start-up (port in use) took more than 10 s to start, fail and exit. A test
        that claims a speed measures it itself."""
        assert self.process is not None
        return self.process.wait(timeout=timeout_s)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def logs_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_lines(self) -> list[dict[str, Any]]:
        lines = []
        for line in self.logs_text().splitlines():
            try:
                lines.append(json.loads(line))
            except ValueError:
                continue
        return lines

    def logged_at(self, event: str, **fields: object) -> float | None:
        """When (on time.time()'s clock) the daemon logged its first `event` with these fields.

        The daemon's own moment: a test that polls HTTP for a change notices it only as soon as
        its own poll gets the CPU, which on a loaded machine can be much later.
        """
        for line in self.log_lines():
            if line.get("event") == event and all(line.get(k) == v for k, v in fields.items()):
                return datetime.datetime.fromisoformat(line["timestamp"]).timestamp()
        return None


class DaemonStarter:
    """Starts `elector run` daemons (`starter(identity, *extra_args, **options)`), stops them all.

    `options` are those of `DaemonProcess` (lock, ttl, env; redis_url to use another server).
    """

    def __init__(self, *, redis_url: str | None, log_dir: Path) -> None:
        self.redis_url = redis_url
        self.log_dir = log_dir
        self.started: list[DaemonProcess] = []

    def __call__(self, identity: str, *extra_args: str, **options: Any) -> DaemonProcess:
        options.setdefault("redis_url", self.redis_url)
        process = DaemonProcess(identity=identity, log_dir=self.log_dir, extra_args=extra_args, **options)
        self.started.append(process.start())
        process.wait_http()
        return process

    def stop_all(self) -> None:
        for process in self.started:
            process.stop()
