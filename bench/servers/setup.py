"""`python -m bench.servers.setup` (run by `make bench` before the bench): what the peers benchmark needs.

- Servers from Debian's packages: etcd-server and etcd-client (etcd, etcdctl), zookeeperd
  (ZooKeeper 3.8; it brings java) and redis-server. Installed with apt-get as root, and only the
  packages whose programs are missing, so a prepared machine is not touched.
- Clients from PyPI, into this venv: the `bench` extra of pyproject.toml (kazoo,
  python-redis-lock, matplotlib), only when one of them does not import.

Nothing here is fatal: what cannot be installed is printed, and the benchmark that needs it reports
its system as skipped with the reason (bench/peers/benchmark.py checks again for itself).
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import tomllib

from bench.harness.common import REPO
from bench.servers.install import apt_install, present

#: Debian package -> a file that shows it is installed.
PACKAGES: dict[str, str] = {
    "etcd-server": "etcd",
    "etcd-client": "etcdctl",
    "zookeeperd": "/usr/share/java/zookeeper.jar",
    "redis-server": "redis-server",
}
#: Requirement prefix in the `bench` extra -> the module it provides.
MODULES = {"kazoo": "kazoo", "python-redis-lock": "redis_lock", "matplotlib": "matplotlib"}


def missing_packages() -> list[str]:
    missing = [package for package, probe in PACKAGES.items() if not present(probe)]
    # ZooKeeper runs on java, which zookeeperd depends on: a removed JRE needs the package again.
    if "zookeeperd" not in missing and shutil.which("java") is None:
        missing.append("zookeeperd")
    return missing


def bench_requirements() -> list[str]:
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    return list(data["project"]["optional-dependencies"]["bench"])


def missing_requirements() -> list[str]:
    missing = []
    for requirement in bench_requirements():
        name = requirement.split(">")[0].split("=")[0].split("<")[0].strip()
        module = MODULES.get(name, name.replace("-", "_"))
        if importlib.util.find_spec(module) is None:
            missing.append(requirement)
    return missing


def install_requirements(requirements: list[str]) -> str | None:
    if not requirements:
        return None
    argv = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *requirements]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"pip install failed: {exc}"
    if done.returncode != 0:
        return f"pip install exited {done.returncode}: {done.stderr.strip()[-300:]}"
    return None


def main() -> int:
    packages = missing_packages()
    if packages:
        print(f"bench setup: apt-get install {' '.join(packages)}", flush=True)
        problem = apt_install(packages)
        print(f"bench setup: {problem or 'installed'}", flush=True)
    else:
        print(f"bench setup: Debian packages present ({', '.join(PACKAGES)})", flush=True)
    requirements = missing_requirements()
    if requirements:
        print(f"bench setup: pip install {' '.join(requirements)}", flush=True)
        problem = install_requirements(requirements)
        print(f"bench setup: {problem or 'installed'}", flush=True)
    else:
        print("bench setup: PyPI clients present (the `bench` extra)", flush=True)
    return 0  # what is still missing is reported as skipped by the benchmarks


if __name__ == "__main__":
    sys.exit(main())
