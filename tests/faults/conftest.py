"""Options and fixtures of the fault suite.

pytest tests/faults                                          # short profile (CI), a few minutes
pytest tests/faults --faults-profile=soak --soak-minutes=10  # the random mix for 10 minutes
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import Cluster
from .http_faults import http_sweep_s

#: The summary tables of the mixes that ran, printed at the end of the session.
SUMMARIES = pytest.StashKey[list[str]]()


def _mix_s(config: pytest.Config) -> float:
    minutes = float(config.getoption("--soak-minutes"))
    if minutes <= 0:
        raise pytest.UsageError(f"--soak-minutes must be positive, got {minutes}")
    return 60 * minutes if config.getoption("--faults-profile") == "soak" else 40.0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The mix's time limit follows its length: the faults, plus start-up, recovery, the soak's sweep
    of HTTP attacks and the stop."""
    for item in items:
        if item.nodeid.startswith("tests/faults/test_mix.py"):
            sweep_s = http_sweep_s(config.getoption("--faults-profile"))
            item.add_marker(pytest.mark.timeout(_mix_s(config) + 120 + sweep_s))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    for table in config.stash.get(SUMMARIES, []):
        terminalreporter.write_sep("=", "fault-injection summary")
        terminalreporter.write_line(table)


@dataclasses.dataclass(frozen=True)
class Profile:
    name: str
    mix_s: float
    seed: int | None
    ttl_s: float = 2.0


@pytest.fixture
def profile(request: pytest.FixtureRequest) -> Profile:
    config = request.config
    return Profile(config.getoption("--faults-profile"), _mix_s(config), config.getoption("--faults-seed"))


@pytest.fixture
def cluster(tmp_path: Path, redis_binary: str) -> Iterator[Cluster]:
    """Three daemons on a fresh lock Redis, a leader's child running; stopped and checked after."""
    with Cluster(tmp_path / "run", ttl_s=2.0, redis_binary=redis_binary) as running:
        yield running
