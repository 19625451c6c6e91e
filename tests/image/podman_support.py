"""Build and run the project's image for real with Debian's podman, without a Docker engine.

Why each piece is here (see docs/image.md, "How it is tested"):
- runc, not crun: crun refuses this host's hybrid cgroup layout.
- A containers.conf of our own (CONTAINERS_CONF): podman's default ulimits (nofile 1048576,
  nproc 4194304) are above what root may set here, so every container start would fail.
- A stand-in for `python:3.11-slim-bookworm` made with debootstrap: no registry is reachable
  as a Docker Hub mirror here. It is cached as a tarball between runs (under /var/tmp) and
  rebuilt from nothing when missing.
- The host's CA bundle is bind-mounted read-only into the RUN steps of the build: the host's
  outgoing TLS is re-signed by a CA only the host trusts, and pip in the builder stage must
  reach PyPI. A bind mount is never part of a layer, so nothing of it is baked into the image.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE_DIR = Path(os.environ.get("ELECTOR_IMAGE_CACHE", "/var/tmp/elector-image-cache"))
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
DEBIAN_MIRROR = os.environ.get("ELECTOR_DEBIAN_MIRROR", "http://deb.debian.org/debian")
SUITE = "bookworm"
#: What the stand-in base has on top of minbase: what python:3.11-slim has that the Dockerfile uses.
BASE_PACKAGES = ("python3", "python3-pip", "python3-venv", "ca-certificates")
#: Bump to rebuild the cached base after a change of how it is made.
BASE_RECIPE = "3"
BASE_REPOSITORY = "localhost/elector-base"
IMAGE_TAG = "localhost/elector:image-test"
#: Intermediate images (the layer cache) older than this are pruned after a build: each source
#: change leaves a builder stage behind, and CI runs on the same machine day after day.
PRUNE_AFTER = "24h"
INSTALL_HINT = (
    "as root: apt-get install -y podman buildah runc debootstrap uidmap fuse-overlayfs slirp4netns "
    "(or run `bash scripts/system-deps.sh`)"
)


class ContainerToolsMissing(RuntimeError):
    """This machine cannot build or run containers; the message says what to install."""


def check_tools() -> None:
    """Raise ContainerToolsMissing unless root with podman, runc and debootstrap."""
    missing = [tool for tool in ("podman", "runc", "debootstrap") if shutil.which(tool) is None]
    if os.geteuid() != 0:
        raise ContainerToolsMissing(
            f"the image tests build and run containers with rootful podman and need root "
            f"(running as uid {os.geteuid()}); {INSTALL_HINT}"
        )
    if missing:
        raise ContainerToolsMissing(f"missing {', '.join(missing)}: {INSTALL_HINT}")


def containers_conf(directory: Path) -> Path:
    """A containers.conf whose default ulimits fit under this host's hard limits."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    nofile = 65536 if nofile == resource.RLIM_INFINITY else min(nofile, 65536)
    # podman refuses an nproc it cannot set; below 32768 is also what the kernel's pid_max allows.
    nproc = 32767 if nproc == resource.RLIM_INFINITY else min(nproc, 32767)
    path = directory / "containers.conf"
    path.write_text(
        "[containers]\n"
        f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\n'
        "[engine]\n"
        'runtime = "runc"\n'
    )
    return path


@dataclass(frozen=True)
class Podman:
    """Runs podman with our containers.conf and the runc runtime."""

    conf: Path

    def env(self) -> dict[str, str]:
        return {**os.environ, "CONTAINERS_CONF": str(self.conf)}

    def run(
        self, *args: str, check: bool = True, timeout_s: float = 120.0, stdin: bytes | None = None
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            ["podman", "--runtime", "runc", *args],
            check=False,
            env=self.env(),
            input=stdin.decode() if stdin is not None else None,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if check and proc.returncode != 0:
            output = f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
            raise AssertionError(f"podman {' '.join(args)} exited {proc.returncode}:\n{output}")
        return proc

    def image_exists(self, tag: str) -> bool:
        return self.run("image", "exists", tag, check=False).returncode == 0


def _base_tag() -> str:
    digest = hashlib.sha256(f"{BASE_RECIPE} {SUITE} {' '.join(BASE_PACKAGES)}".encode()).hexdigest()[:12]
    return f"{BASE_REPOSITORY}:{SUITE}-{digest}"


def _make_base_tarball(tarball: Path) -> None:
    """debootstrap minbase + python3/pip/venv, made to look like python:3.11-slim, as a tarball."""
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE_DIR, prefix="rootfs-") as tmp:
        root = Path(tmp) / "rootfs"
        subprocess.run(
            [
                "debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
                SUITE, str(root), DEBIAN_MIRROR,
            ],
            check=True, capture_output=True, timeout=900,
        )  # fmt: skip
        # python:3.11-slim lets pip install system-wide (PEP 668 marker absent) and has
        # `python` and `pip` on PATH: the Dockerfile relies on both.
        for marker in root.glob("usr/lib/python3*/EXTERNALLY-MANAGED"):
            marker.unlink()
        for name, target in (("python", "/usr/bin/python3"), ("pip", "/usr/bin/pip3")):
            link = root / "usr/local/bin" / name
            link.unlink(missing_ok=True)
            link.symlink_to(target)
        # Debian's official images (python:*-slim is built on debian:*-slim) keep apt from
        # caching package lists' binary indexes and .debs, and dpkg from installing docs: without
        # the same settings, an `apt-get install` layer here would be ~80 MB instead of ~1 MB.
        (root / "etc/apt/apt.conf.d/docker-clean").write_text(
            'DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb '
            '/var/cache/apt/*.bin || true"; };\n'
            'APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb '
            '/var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };\n'
            'Dir::Cache::pkgcache ""; Dir::Cache::srcpkgcache "";\n'
        )
        (root / "etc/dpkg/dpkg.cfg.d/docker").write_text(
            "path-exclude /usr/share/doc/*\npath-include /usr/share/doc/*/copyright\n"
            "path-exclude /usr/share/man/*\npath-exclude /usr/share/info/*\n"
        )
        # No apt lists or caches in the base (the slim image has none either).
        for cache in (root / "var/cache/apt").glob("*.bin"):
            cache.unlink()
        for junk in ("var/lib/apt/lists", "var/cache/apt/archives"):
            for item in (root / junk).glob("*"):
                if item.is_file():
                    item.unlink()
        partial = tarball.with_suffix(".partial")
        subprocess.run(["tar", "-C", str(root), "-cf", str(partial), "."], check=True, timeout=300)
        partial.rename(tarball)


def ensure_base_image(podman: Podman) -> tuple[str, float]:
    """The local stand-in base image's tag, and the seconds spent making it (0 when cached)."""
    tag = _base_tag()
    if podman.image_exists(tag):
        return tag, 0.0
    started = time.monotonic()
    tarball = CACHE_DIR / f"{tag.rpartition(':')[2]}.tar"
    # Bases of older recipes are never used again: do not let them pile up.
    for old in CACHE_DIR.glob(f"{SUITE}-*.tar"):
        if old != tarball:
            old.unlink(missing_ok=True)
    listed = podman.run("images", "--format", "{{.Repository}}:{{.Tag}}", BASE_REPOSITORY, check=False)
    for old_tag in listed.stdout.split():
        if old_tag != tag:
            podman.run("rmi", "--force", old_tag, check=False)
    if not tarball.exists():
        _make_base_tarball(tarball)
    podman.run(
        "import",
        "--change", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "--change", "ENV LANG=C.UTF-8",
        "--change", 'CMD ["python3"]',
        str(tarball), tag,
        timeout_s=300,
    )  # fmt: skip
    return tag, time.monotonic() - started


@dataclass(frozen=True)
class Layer:
    created_by: str
    size_bytes: int


@dataclass(frozen=True)
class BuiltImage:
    tag: str
    base_tag: str
    build_s: float
    base_s: float
    size_bytes: int
    #: The layers the Dockerfile adds on top of the base, oldest first (size 0: metadata only).
    added_layers: tuple[Layer, ...]


def _history(podman: Podman, tag: str) -> list[Layer]:
    rows = json.loads(podman.run("history", "--format", "json", tag).stdout)
    # `podman history` lists the newest first.
    return [Layer(created_by=str(r.get("createdBy") or r.get("CreatedBy") or ""), size_bytes=int(r["size"]))
            for r in reversed(rows)]  # fmt: skip


def build_image(
    podman: Podman, *, base_tag: str, base_s: float, extra_args: Sequence[str] = ()
) -> BuiltImage:
    started = time.monotonic()
    podman.run(
        "build",
        "--network", "host",
        "--layers",
        "--build-arg", f"PYTHON_IMAGE={base_tag}",
        "--volume", f"{HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro",
        "--tag", IMAGE_TAG,
        "--file", str(REPO / "Dockerfile"),
        *extra_args,
        str(REPO),
        timeout_s=900,
    )  # fmt: skip
    build_s = time.monotonic() - started
    podman.run("image", "prune", "--force", "--filter", f"until={PRUNE_AFTER}", check=False)
    inspect = json.loads(podman.run("image", "inspect", IMAGE_TAG).stdout)[0]
    base_layers = _history(podman, base_tag)
    layers = _history(podman, IMAGE_TAG)
    return BuiltImage(
        tag=IMAGE_TAG,
        base_tag=base_tag,
        build_s=build_s,
        base_s=base_s,
        size_bytes=int(inspect["Size"]),
        added_layers=tuple(layers[len(base_layers) :]),
    )


def process_tree(root_pid: int) -> list[int]:
    """`root_pid` and all its descendants (host PIDs), from /proc."""
    found: list[int] = []
    pending = [root_pid]
    while pending:
        pid = pending.pop()
        found.append(pid)
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                pending += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
    return found


def proc_status(pid: int) -> dict[str, str]:
    """/proc/PID/status as a dict ({} when the process is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    return {k: v.strip() for k, _, v in (line.partition(":") for line in text.splitlines())}


def proc_cmdline(pid: int) -> list[str]:
    try:
        return [p.decode() for p in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if p]
    except OSError:
        return []


def alive(pid: int) -> bool:
    """Running (a zombie counts as gone: it runs nothing)."""
    state = proc_status(pid).get("State", "")
    return bool(state) and not state.startswith(("Z", "X"))
