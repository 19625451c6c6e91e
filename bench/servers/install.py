"""Find a server's programs, or install its Debian packages: the one apt-get step of the bench.

Used by `python -m bench.servers.setup` (`make bench-setup`: every peer's packages up front) and by
etcd's own check when a benchmark needs it (bench/servers/etcd.py). Only as root, only with apt-get,
only for what is missing, so a prepared machine is not touched; a failure is returned as a reason,
never raised: the benchmark that needs the server reports it as skipped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

#: apt-get's own runs (update, install) may take this long each on a slow mirror.
APT_TIMEOUT_S = 900


def present(probe: str) -> bool:
    """Whether `probe` is there: an absolute path that exists, or a program on PATH."""
    return Path(probe).exists() if probe.startswith("/") else shutil.which(probe) is not None


def apt_install(packages: list[str]) -> str | None:
    """`apt-get update && apt-get install` the Debian `packages`: None on success, else why not."""
    if not packages:
        return None
    if shutil.which("apt-get") is None:
        return "no apt-get on this machine"
    if os.geteuid() != 0:
        return "installing Debian packages needs root"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    steps = [
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages],
    ]
    for argv in steps:
        try:
            done = subprocess.run(
                argv, env=env, capture_output=True, text=True, timeout=APT_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"`{' '.join(argv)}` failed: {exc}"
        if done.returncode != 0:
            return f"`{' '.join(argv)}` exited {done.returncode}: {done.stderr.strip()[-300:]}"
    return None
