"""What a real `elector run` process loads (elector/cli/tls.py, issue 13's idle-RSS target).

A plain redis:// daemon runs without OpenSSL (no `_ssl`, no `_hashlib`), without aiohttp and
without kopf, and still leads; a rediss:// daemon loads OpenSSL and leads over TLS. The module
list is read inside the daemon process itself: a wrapper runs the CLI's `main` and, when the
test says so (a file appears), writes `sys.modules` to a file and exits.
"""

from __future__ import annotations

import json
from pathlib import Path

import redis

from elector.testing.redis_server import RedisServerProcess
from tests.support.daemon import DaemonProcess, wait_until
from tests.support.seed import seed_used_lock
from tests.support.tls import TlsRedis

WRAPPER = """
import json, os, sys, threading, time

def dump_when_told(path):
    while not os.path.exists(path + ".go"):
        time.sleep(0.02)
    loaded = sorted(name for name, module in sys.modules.items() if module is not None)
    with open(path + ".tmp", "w") as out:
        json.dump(loaded, out)
    os.rename(path + ".tmp", path)
    os._exit(0)

threading.Thread(target=dump_when_told, args=(sys.argv[1],), daemon=True).start()
from elector.cli.main import main
sys.argv = ["elector", *sys.argv[2:]]
main()
"""


def loaded_modules(daemon: DaemonProcess, dump: Path) -> set[str]:
    """Start the daemon through the wrapper, wait until it leads, and read its sys.modules."""
    daemon.command[1:3] = ["-c", WRAPPER, str(dump)]  # instead of `-m elector`
    daemon.start()
    try:
        daemon.wait_http()
        wait_until(daemon.is_leader, timeout_s=15)
        Path(f"{dump}.go").touch()
        wait_until(dump.exists, timeout_s=10)
    finally:
        daemon.stop()
    return set(json.loads(dump.read_text()))


def packages(modules: set[str], *names: str) -> set[str]:
    return {module for module in modules if module.split(".")[0] in names}


def test_a_plain_daemon_loads_neither_openssl_nor_aiohttp_nor_kopf(tmp_path: Path) -> None:
    with RedisServerProcess() as server:
        client = redis.Redis(port=server.port)
        seed_used_lock(client)
        client.close()
        daemon = DaemonProcess(redis_url=server.url, identity="plain", log_dir=tmp_path)
        modules = loaded_modules(daemon, tmp_path / "modules.json")
    assert {"elector.daemon.service", "elector.daemon.http_server", "h11", "redis"} <= modules
    assert not {"_ssl", "_hashlib"} & modules, "OpenSSL is loaded without any TLS setting"
    assert not packages(modules, "aiohttp", "kopf", "multidict", "yarl"), packages(modules, "aiohttp", "kopf")
    # The daemon runs on asyncio all the same (its no-ssl path); `ssl` is the inert stand-in.
    assert {"asyncio", "ssl"} <= modules


def test_a_rediss_daemon_loads_openssl_and_leads_over_tls(tmp_path: Path) -> None:
    with TlsRedis(tmp_path / "tls") as server:
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
        modules = loaded_modules(daemon, tmp_path / "modules.json")
    assert {"_ssl", "ssl"} <= modules
    assert not packages(modules, "aiohttp", "kopf")
