"""What the benchmarks of one run share: options, a scratch directory, the venvs, etcd, machine facts."""

from __future__ import annotations

import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from bench.harness.common import REPO, BenchError
from bench.servers.etcd import EtcdInstall, EtcdServer, ensure_etcd
from elector.testing.redis_server import find_redis_server

#: Shared by the runs of one machine; ELECTOR_BENCH_RUNTIME_VENV gives a run a venv of its own (two
#: work trees benchmarking at once would otherwise reinstall each other's elector mid-run).
RUNTIME_VENV = Path(os.environ.get("ELECTOR_BENCH_RUNTIME_VENV", "/tmp/elector-bench-rt"))
#: What a container image copies to build elector (no tests, no dev extras).
_IMAGE_FILES = ("pyproject.toml", "README.md", "elector")
#: The environment the Dockerfile's ENV gives every Python process of the image: no docstrings and
#: no asserts (-OO, read from *.opt-2.pyc files), and no .pyc written at run time.
IMAGE_PYTHON_ENV = {"PYTHONOPTIMIZE": "2", "PYTHONDONTWRITEBYTECODE": "1"}
#: Scripts next to the runtime venv's python, usable wherever the benchmarks take a python path
#: (bench.harness.common.Daemon runs `<python> -m elector run`). Both start in `/` like the image (WORKDIR
#: /): `python -m` puts the working directory first on sys.path, so from the repository's root
#: the venv would import the work tree's elector instead of its installed copy. The second adds
#: IMAGE_PYTHON_ENV. They `exec`, so the PID the benchmarks measure is the interpreter's own.
_PLAIN_WRAPPER = "python-in-workdir-root"
_IMAGE_WRAPPER = "python-as-image"
#: What the daemon imports.
_DAEMON_IMPORTS = "import elector.cli.main, elector.daemon.service"
#: Prints the source files of loaded modules whose .pyc (of this optimization level) is missing:
#: those are compiled in memory at each start.
_MISSING_PYC_PROBE = f"""
import os, sys
{_DAEMON_IMPORTS}
for module in list(sys.modules.values()):
    source, cached = getattr(module, "__file__", None), getattr(module, "__cached__", None)
    if source and source.endswith(".py") and cached and not os.path.exists(cached):
        print(source)
"""


class Context:
    def __init__(self, *, quick: bool, seed: int = 20261121) -> None:
        self.quick = quick
        #: Runs per benchmark where a distribution is reported.
        self.runs = 6 if quick else 30
        self.workdir = Path(tempfile.mkdtemp(prefix="elector-bench-"))
        self.rng = random.Random(seed)
        self.seed = seed
        self._etcd_install: EtcdInstall | None = None
        self._etcd: EtcdServer | None = None
        self._runtime_python: str | None = None
        #: What was done so that the image's way (PYTHONOPTIMIZE=2) reads opt-2 .pyc files only.
        self.runtime_bytecode: list[str] = []
        self.log: list[str] = []  # setup messages worth keeping in the report
        self.load_at_start = os.getloadavg()
        # Resolved once: a redis-server installed by someone else mid-run must not switch binaries.
        self.redis_binary = find_redis_server()

    def say(self, text: str) -> None:
        print(f"  {text}", flush=True)
        self.log.append(text)

    def dir(self, name: str) -> Path:
        path = self.workdir / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    # -- etcd ----------------------------------------------------------------------------------

    @property
    def etcd_install(self) -> EtcdInstall:
        if self._etcd_install is None:
            self._etcd_install = ensure_etcd(self.say)
        return self._etcd_install

    def etcd(self) -> EtcdServer | None:
        """A running etcd shared by the benchmarks, or None when etcd cannot be had."""
        if not self.etcd_install.available:
            return None
        if self._etcd is None:
            self._etcd = EtcdServer(self.dir("etcd")).start()
        return self._etcd

    # -- the runtime-only venv -----------------------------------------------------------------

    @property
    def dev_python(self) -> str:
        return sys.executable

    def runtime_python(self) -> str:
        """Python of a venv with `pip install <elector>` only, as the container image will have."""
        if self._runtime_python is None:
            python = _build_runtime_venv(self.dir("image-src"), self.say)
            self.runtime_bytecode = _compile_as_image(python, self.say)
            self._runtime_python = _write_wrapper(python, _PLAIN_WRAPPER, {})
        return self._runtime_python

    def runtime_python_as_image(self) -> str:
        """The runtime-only venv's python run the container image's way (IMAGE_PYTHON_ENV)."""
        return str(Path(self.runtime_python()).with_name(_IMAGE_WRAPPER))

    @property
    def runtime_python_if_built(self) -> str | None:
        return self._runtime_python

    @property
    def etcd_install_if_checked(self) -> EtcdInstall | None:
        return self._etcd_install

    def close(self) -> None:
        if self._etcd is not None:
            self._etcd.stop()
            self._etcd = None
        shutil.rmtree(self.workdir, ignore_errors=True)


def _build_runtime_venv(src: Path, say: Callable[[str], None]) -> str:
    # Install from a copy of the files an image would COPY, so that pip's build never writes
    # into the working tree; reinstalled every run so the code is the current one.
    for name in _IMAGE_FILES:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif source.exists():
            shutil.copy2(source, src / name)
    python = RUNTIME_VENV / "bin" / "python"
    if not python.exists():
        _run([shutil.which("python3") or "python3", "-m", "venv", str(RUNTIME_VENV)], "create the venv")
    _run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(src)],
        "pip install",
    )
    # pip reinstalls a local project only if it is not already there at the same version.
    _run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "--force-reinstall", "--no-deps", str(src)],
        "refresh elector",
    )  # fmt: skip
    say(f"runtime-only venv {RUNTIME_VENV}: `pip install <copy of {', '.join(_IMAGE_FILES)}>`")
    return str(python)


def _compile_as_image(python: str, say: Callable[[str], None]) -> list[str]:
    """Byte-compile like the Dockerfile (levels 0 and 2) and write the image-way wrapper script.

    Python reads only the .pyc of its own optimization level: under PYTHONOPTIMIZE=2 a module
    without its .opt-2.pyc is compiled from source in memory at every start (an idle daemon with
    nothing precompiled measured 44 MiB instead of 32). The venv's site-packages is compiled here; the
    standard library belongs to the interpreter the venv was made from, so the modules the daemon
    loads are checked there, and compiled only where this user may write.
    """
    purelib, stdlib = (_sysconfig_path(python, key) for key in ("purelib", "stdlib"))
    _run([python, "-m", "compileall", "-q", "-o", "0", "-o", "2", purelib], "compileall the venv")
    wrapper = _write_wrapper(python, _IMAGE_WRAPPER, IMAGE_PYTHON_ENV)
    missing = _run([str(wrapper), "-c", _MISSING_PYC_PROBE], "look for missing opt-2 .pyc").split()
    notes = [f"site-packages of {RUNTIME_VENV} compiled at optimization levels 0 and 2, as in the image"]
    if missing:
        done = subprocess.run(
            [python, "-m", "compileall", "-q", "-o", "2", *missing],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        left = _run([str(wrapper), "-c", _MISSING_PYC_PROBE], "look again").split()
        notes.append(
            f"{len(missing)} modules the daemon loads had no .opt-2.pyc; compiled: {len(missing) - len(left)}"
            + (f", not writable (compiled in memory at each start, included in the figures): "
               f"{', '.join(left[:8])}{' ...' if len(left) > 8 else ''} ({done.stderr.strip()[-200:]})"
               if left else "")
        )  # fmt: skip
    else:
        notes.append(
            f"the interpreter's standard library ({stdlib}) already has the .opt-2.pyc of every module "
            "the daemon loads (the official python images ship none: the Dockerfile compiles them)"
        )
    for note in notes:
        say(note)
    return notes


def _write_wrapper(python: str, name: str, env: dict[str, str]) -> str:
    wrapper = Path(python).with_name(name)
    exports = "".join(f"{key}={value} " for key, value in env.items())
    header = "#!/bin/sh\n# Written by bench/harness/context.py.\n"
    wrapper.write_text(f'{header}cd / && {exports}exec "{python}" "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def _sysconfig_path(python: str, key: str) -> str:
    return _run([python, "-c", f"import sysconfig; print(sysconfig.get_paths()[{key!r}])"], key).strip()


def _run(argv: list[str], what: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise BenchError(f"{what} failed ({' '.join(argv)}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done.stdout


def _first_line(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except OSError as exc:
        return f"unavailable ({exc.strerror})"
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else "unknown"


def machine_facts(ctx: Context) -> dict[str, str]:
    facts = {
        "nproc": str(os.cpu_count()),
        "cpu": _cpu_model(),
        "kernel": platform.release(),
        "python (dev venv)": f"{sys.version.split()[0]} ({sys.executable})",
    }
    if ctx.runtime_python_if_built is not None:
        facts["python (runtime venv)"] = _first_line([ctx.runtime_python_if_built, "--version"])
    redis_server = ctx.redis_binary
    facts["redis-server"] = f"{_first_line([redis_server, '--version'])} ({redis_server})"
    install = ctx.etcd_install_if_checked
    if install is not None and install.available:
        facts["etcd"] = f"{install.version} ({install.note})"
    elif install is not None:
        facts["etcd"] = install.note
    elif shutil.which("etcd") and shutil.which("etcdctl"):
        facts["etcd"] = f"{_first_line(['etcd', '--version'])} (on PATH, not used in this run)"
    else:
        facts["etcd"] = "not installed, not used in this run"
    facts["load average (1/5/15 min) at start, at end"] = (
        f"{' '.join(f'{x:.2f}' for x in ctx.load_at_start)}, {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    return facts


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
