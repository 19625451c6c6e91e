"""Every CPython that `requires-python` admits (3.11, 3.12, 3.13) runs elector, installed for real.

For each version found (pyenv's ~/.pyenv/versions/<v>.*/bin/python<v>, then PATH), a throw-away
virtualenv (without pip: this venv's pip installs into it) gets the project's wheel (built once
per session, non-editable) and its dependencies (downloaded once into a wheelhouse, installed
offline); the venvs are built concurrently, once per session even under pytest-xdist. Each then
runs, from its own interpreter (`python -I`, so the work tree is never on its path): an
import of every module of elector (the kube extra's modules only when kopf is importable: it is
not installed here), `--help` of every command, `elector run` against a real redis-server in
plain TCP and in TLS (the latter with the throw-away CA of tests/support/tls.py), exec mode, and
a small asyncio program that leads through the library.

The versions found and missing are printed; fewer than two found is a failure (a machine with
one Python would prove nothing about the others).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import fcntl
import glob
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from elector.testing.redis_server import RedisServerProcess
from tests.support.daemon import DaemonProcess, wait_until
from tests.support.seed import seed_used_lock
from tests.support.tiers import PIP, PYTHONS, REDIS, needs
from tests.support.tls import TlsRedis

pytestmark = pytest.mark.timeout(600)

REPO = Path(__file__).resolve().parents[1]
VERSIONS = ("3.11", "3.12", "3.13")
#: Fewer found than this fails the run.
MIN_FOUND = 2


def _version_of(python: str) -> str | None:
    try:
        done = subprocess.run(
            [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
    except OSError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def find_pythons() -> dict[str, str]:
    """version -> interpreter, for each admitted version found on this machine."""
    found: dict[str, str] = {}
    home = Path.home() / ".pyenv" / "versions"
    for version in VERSIONS:
        candidates = sorted(glob.glob(str(home / f"{version}.*" / "bin" / f"python{version}")), reverse=True)
        on_path = shutil.which(f"python{version}")
        for python in [*candidates, *([on_path] if on_path else [])]:
            if _version_of(python) == version:
                found[version] = python
                break
    return found


FOUND = find_pythons()


@dataclasses.dataclass(frozen=True)
class Venv:
    version: str
    python: Path
    build_s: float

    @property
    def elector(self) -> list[str]:
        return [str(self.python), "-I", "-m", "elector"]


def _run(argv: list[str], *, timeout_s: float = 300, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False, env=env)
    assert done.returncode == 0, (
        f"{argv} exited {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    )
    return done.stdout


def _build(version: str, python: str, *, root: Path, wheelhouse: Path) -> Venv:
    """A venv without pip of its own (ensurepip is the slowest step), filled by this pip."""
    started = time.monotonic()
    venv = root / f"py{version}"
    _run([python, "-m", "venv", "--without-pip", str(venv)])
    _run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--quiet",
          "--no-compile", "--no-index", "--find-links", str(wheelhouse), "elector"])  # fmt: skip
    return Venv(version=version, python=venv / "bin" / "python", build_s=time.monotonic() - started)


@pytest.fixture(scope="session")
@needs(PYTHONS)
def pythons() -> dict[str, str]:
    """version -> interpreter, for each admitted version found on this machine."""
    return FOUND


@pytest.fixture(scope="session")
@needs(PYTHONS, PIP)
def venvs(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> dict[str, Venv]:
    """One venv per version found, built once per session (shared by pytest-xdist's workers
    under a file lock: the first builds, the others wait and reuse), the versions concurrently."""
    if len(FOUND) < MIN_FOUND:
        return {}
    if worker_id == "master":  # not under xdist
        return _build_all(tmp_path_factory.mktemp("pythons"))
    root = tmp_path_factory.getbasetemp().parent / "pythons"
    root.mkdir(exist_ok=True)
    with (root / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = root / "venvs.json"
        if done.exists():
            return {v: Venv(v, Path(p), 0.0) for v, p in json.loads(done.read_text()).items()}
        built = _build_all(root)
        done.write_text(json.dumps({v: str(venv.python) for v, venv in built.items()}))
        return built


def _build_all(root: Path) -> dict[str, Venv]:
    wheelhouse = root / "wheelhouse"
    pip = [sys.executable, "-m", "pip"]
    # The project's wheel (non-editable), then its dependencies (pure-Python wheels, from pip's
    # cache and the configured indexes), once for every version.
    _run([*pip, "wheel", "--quiet", "--no-deps", "--wheel-dir", str(wheelhouse), str(REPO)])
    (wheel,) = wheelhouse.glob("elector-*.whl")
    _run([*pip, "download", "--quiet", "--dest", str(wheelhouse), str(wheel)])
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(FOUND)) as pool:
        futures = {
            version: pool.submit(_build, version, python, root=root, wheelhouse=wheelhouse)
            for version, python in FOUND.items()
        }
        return {version: future.result() for version, future in futures.items()}


def test_at_least_two_admitted_pythons_are_found(pythons: dict[str, str]) -> None:
    missing = [version for version in VERSIONS if version not in pythons]
    print(f"\nPythons found: {', '.join(f'{v} ({p})' for v, p in pythons.items()) or 'none'}; "
          f"not found: {', '.join(missing) or 'none'}")  # fmt: skip
    assert len(pythons) >= MIN_FOUND, (
        f"found {sorted(pythons)} of {list(VERSIONS)}: at least {MIN_FOUND} are needed "
        "(install them, e.g. with pyenv)"
    )


def _venv(venvs: dict[str, Venv], version: str) -> Venv:
    if version not in FOUND:
        pytest.skip(
            f"Python {version} is not installed here (test_at_least_two_admitted_pythons_are_found counts)"
        )
    return venvs[version]


PROBE = """
import importlib, json, pkgutil, sys
import elector, elector.cli.main
assert elector.__file__.startswith(sys.prefix), elector.__file__
try:
    import kopf  # noqa: F401
    kube = True
except ImportError:
    kube = False
names = [m.name for m in pkgutil.walk_packages(elector.__path__, "elector.")]
imported = []
for name in names:
    if name == "elector.__main__" or (name.startswith("elector.kube") and not kube):
        continue
    importlib.import_module(name)
    imported.append(name)
commands = []
def walk(group, path):
    for name, command in sorted(group.commands.items()):
        commands.append([*path, name])
        if hasattr(command, "commands"):
            walk(command, [*path, name])
walk(elector.cli.main.cli, [])
print(json.dumps({"version": "%d.%d" % sys.version_info[:2], "imported": imported,
                  "skipped": len(names) - len(imported), "commands": commands}))
"""


@pytest.mark.parametrize("version", VERSIONS)
def test_every_module_imports_and_every_command_has_help(venvs: dict[str, Venv], version: str) -> None:
    venv = _venv(venvs, version)
    found = json.loads(_run([str(venv.python), "-I", "-c", PROBE]))
    assert found["version"] == version
    assert len(found["imported"]) > 30 and "elector.daemon.service" in found["imported"], found
    assert ["run"] in found["commands"], found["commands"]
    for command in [[], *found["commands"]]:
        text = _run([*venv.elector, *command, "--help"])
        assert "Usage:" in text, (command, text)


def _daemon(
    venv: Venv, tmp_path: Path, *, url: str, identity: str, extra: tuple[str, ...] = ()
) -> DaemonProcess:
    daemon = DaemonProcess(redis_url=url, identity=identity, log_dir=tmp_path, ttl="2s", extra_args=extra)
    daemon.command[:3] = venv.elector  # this venv's interpreter, isolated from the work tree
    return daemon


def _leads(daemon: DaemonProcess) -> None:
    daemon.start()
    try:
        daemon.wait_http(timeout_s=30)
        wait_until(daemon.is_leader, timeout_s=20)
    except AssertionError:
        raise AssertionError(daemon.logs_text()[-3000:]) from None
    finally:
        daemon.stop()


@pytest.fixture
@needs(REDIS)
def lock_server() -> Iterator[RedisServerProcess]:
    with RedisServerProcess() as server:
        with redis.Redis(port=server.port) as client:
            seed_used_lock(client)
        yield server


@pytest.mark.parametrize("version", VERSIONS)
def test_run_leads_in_plain_tcp_and_in_exec_mode(
    venvs: dict[str, Venv], version: str, tmp_path: Path, lock_server: RedisServerProcess
) -> None:
    venv = _venv(venvs, version)
    _leads(_daemon(venv, tmp_path, url=lock_server.url, identity="plain"))
    out = tmp_path / "token"
    command = (str(venv.python), "-c",
               f"import os; open({str(out)!r}, 'w').write(os.environ['ELECTOR_FENCING_TOKEN'])")  # fmt: skip
    daemon = _daemon(venv, tmp_path, url=lock_server.url, identity="exec", extra=("--", *command))
    daemon.start()
    try:
        wait_until(lambda: out.exists() and out.read_text().isdigit(), timeout_s=30)
    except AssertionError:
        raise AssertionError(daemon.logs_text()[-3000:]) from None
    finally:
        daemon.stop()


@pytest.mark.parametrize("version", VERSIONS)
def test_run_leads_over_tls(
    venvs: dict[str, Venv], version: str, tmp_path: Path, tls_redis_binary: str
) -> None:
    venv = _venv(venvs, version)
    with TlsRedis(tmp_path / "tls", binary=tls_redis_binary) as server:
        with redis.Redis(port=server.server.port) as admin:
            seed_used_lock(admin)
        files = server.files
        extra = ("--redis-tls-ca", str(files.ca), "--redis-tls-cert", str(files.client_cert),
                 "--redis-tls-key", str(files.client_key))  # fmt: skip
        _leads(_daemon(venv, tmp_path, url=server.url, identity="tls", extra=extra))


LIBRARY = """
import asyncio, sys
import elector

async def main() -> None:
    async with elector.Elector("jobs", redis=sys.argv[1], ttl_s=2) as candidate:
        async with candidate.leadership() as lease:
            print(lease.fencing_token)

asyncio.run(asyncio.wait_for(main(), 30))
"""


@pytest.mark.parametrize("version", VERSIONS)
def test_the_library_leads(venvs: dict[str, Venv], version: str, lock_server: RedisServerProcess) -> None:
    venv = _venv(venvs, version)
    token = _run([str(venv.python), "-I", "-c", LIBRARY, lock_server.url], timeout_s=60).strip()
    assert token.isdigit() and int(token) > 1, token
