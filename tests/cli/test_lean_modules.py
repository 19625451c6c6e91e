"""What a real `elector run` process loads, read inside the daemon process itself.

A plain redis:// daemon runs without aiohttp and without kopf, and still leads; a rediss://
daemon leads over TLS. Neither replaces a standard-library module: 0.2.0's CLI installed a
stand-in `ssl` and blocked `_hashlib` in daemons without TLS, so plain HTTP through urllib or
prometheus_client's push_to_gateway raised TLSNotLoaded (Python 3.12+) and ssl's constants gave
wrong answers. asyncio, redis-py and prometheus_client import ssl themselves at import time,
so no lazy import in elector can keep OpenSSL out of the daemon; it is loaded, for real.

A wrapper runs the CLI's `main` and, when the test says so (a file appears), writes what the
process has loaded and what `ssl`, urllib and push_to_gateway do there to a file, and exits.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from elector.testing.redis_server import RedisServerProcess
from tests.support.daemon import DaemonProcess, wait_until
from tests.support.seed import seed_used_lock
from tests.support.tls import TlsRedis

WRAPPER = """
import json, os, sys, threading, time

def attempt(fn):
    try:
        return fn()
    except BaseException as exc:
        return repr(exc)

def push(gateway):
    import prometheus_client
    prometheus_client.push_to_gateway(gateway, job="lean", registry=prometheus_client.CollectorRegistry())
    return "ok"

def facts(gateway):
    import ssl, urllib.request
    return {
        "modules": sorted(name for name, module in sys.modules.items() if module is not None),
        "ssl_file": attempt(lambda: getattr(ssl, "__file__", None)),
        "has_sni": attempt(lambda: ssl.HAS_SNI is True),
        "cert_required": attempt(lambda: ssl.CERT_REQUIRED == 2),
        "default_context": attempt(lambda: type(ssl.create_default_context()).__name__),
        "sha256": attempt(lambda: __import__("hashlib").sha256(b"x").hexdigest()[:8]),
        "random": attempt(lambda: bool(__import__("random").random() < 2)),
        "opener": attempt(lambda: urllib.request.build_opener() and "ok"),
        "push": attempt(lambda: push(gateway)),
    }

def dump_when_told(path, gateway):
    while not os.path.exists(path + ".go"):
        time.sleep(0.02)
    with open(path + ".tmp", "w") as out:
        json.dump(facts(gateway), out)
    os.rename(path + ".tmp", path)
    os._exit(0)

threading.Thread(target=dump_when_told, args=(sys.argv[1], sys.argv[2]), daemon=True).start()
from elector.cli.main import main
sys.argv = ["elector", *sys.argv[3:]]
main()
"""


class _Gateway(http.server.BaseHTTPRequestHandler):
    """A Pushgateway stand-in for the test: accepts every PUT of metrics."""

    def do_PUT(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def gateway() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Gateway)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def process_facts(daemon: DaemonProcess, dump: Path, gateway: str) -> dict[str, Any]:
    """Start the daemon through the wrapper, wait until it leads, and read what it reports."""
    daemon.command[1:3] = ["-c", WRAPPER, str(dump), gateway]  # instead of `-m elector`
    daemon.start()
    try:
        daemon.wait_http()
        wait_until(daemon.is_leader, timeout_s=15)
        Path(f"{dump}.go").touch()
        wait_until(dump.exists, timeout_s=10)
    finally:
        daemon.stop()
    facts: dict[str, Any] = json.loads(dump.read_text())
    return facts


def assert_real_ssl(facts: dict[str, Any]) -> None:
    """The standard library's own ssl, hashlib and urllib, working as documented."""
    shown = {key: value for key, value in facts.items() if key != "modules"}
    assert str(facts["ssl_file"]).endswith("/ssl.py"), shown
    assert facts["has_sni"] is True and facts["cert_required"] is True, shown
    assert facts["default_context"] == "SSLContext", shown
    assert facts["sha256"] == "2d711642" and facts["random"] is True, shown
    assert facts["opener"] == "ok", facts["opener"]
    assert facts["push"] == "ok", facts["push"]


def packages(modules: set[str], *names: str) -> set[str]:
    return {module for module in modules if module.split(".")[0] in names}


def test_a_plain_daemon_loads_neither_aiohttp_nor_kopf_and_has_the_real_ssl(
    tmp_path: Path, gateway: str, redis_binary: str
) -> None:
    """No stand-in modules: ssl is the real one, plain HTTP through urllib and push_to_gateway
    works inside the daemon (0.2.0 raised TLSNotLoaded there on Python 3.12+)."""
    with RedisServerProcess(binary=redis_binary) as server:
        client = redis.Redis(port=server.port)
        seed_used_lock(client)
        client.close()
        daemon = DaemonProcess(redis_url=server.url, identity="plain", log_dir=tmp_path)
        facts = process_facts(daemon, tmp_path / "facts.json", gateway)
    modules = set(facts["modules"])
    assert {"elector.daemon.service", "elector.daemon.http_server", "h11", "redis", "asyncio"} <= modules
    assert not packages(modules, "aiohttp", "kopf", "multidict", "yarl"), packages(modules, "aiohttp", "kopf")
    assert_real_ssl(facts)


def test_a_rediss_daemon_leads_over_tls_with_the_real_ssl(
    tmp_path: Path, gateway: str, tls_redis_binary: str
) -> None:
    with TlsRedis(tmp_path / "tls", binary=tls_redis_binary) as server:
        admin = redis.Redis(port=server.server.port)
        seed_used_lock(admin)
        admin.close()
        daemon = DaemonProcess(
            redis_url=server.url,
            identity="tls",
            log_dir=tmp_path,
            extra_args=(
                "--redis-tls-ca", str(server.files.ca),
                "--redis-tls-cert", str(server.files.client_cert),
                "--redis-tls-key", str(server.files.client_key),
            ),
        )  # fmt: skip
        facts = process_facts(daemon, tmp_path / "facts.json", gateway)
    modules = set(facts["modules"])
    assert {"_ssl", "ssl"} <= modules
    assert not packages(modules, "aiohttp", "kopf")
    assert_real_ssl(facts)
