"""The fault suite's command-line options, registered by tests/conftest.py.

They live at the root conftest because pytest takes options only from the conftests it loads
before parsing the command line: registered in tests/faults/conftest.py, `pytest
--faults-profile=soak` from the repository root would be refused.
"""

from __future__ import annotations

import pytest


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("faults", "fault-injection suite (tests/faults)")
    group.addoption(
        "--faults-profile",
        choices=("short", "soak"),
        default="short",
        help="short: every fault once and a short random mix (CI); soak: the random mix for --soak-minutes",
    )
    group.addoption("--soak-minutes", type=float, default=10.0, help="length of the soak's random mix")
    group.addoption("--faults-seed", type=int, default=None, help="seed of the random mix (default: random)")
