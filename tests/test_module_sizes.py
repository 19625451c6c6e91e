"""Every module of elector/ stays at 500 lines or fewer: one purpose each, readable in a sitting.

The one exception is the keeper, a standalone stdlib-only file by design (it is copied and run on
its own, so it cannot import helpers from the package).
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "elector"
MAX_LINES = 500
#: Relative to the repository: the only module allowed over MAX_LINES, and why (the module doc).
EXCEPTIONS = frozenset({"elector/daemon/execmode/keeper.py"})


def line_counts() -> dict[str, int]:
    root = PACKAGE.parent
    return {
        path.relative_to(root).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def test_every_module_of_the_package_is_at_most_500_lines() -> None:
    too_long = {
        name: lines for name, lines in line_counts().items() if lines > MAX_LINES and name not in EXCEPTIONS
    }
    assert not too_long, f"modules over {MAX_LINES} lines (split them by purpose): {too_long}"


def test_the_exceptions_still_exist() -> None:
    # An exception for a file that was renamed or split would silently cover nothing.
    counts = line_counts()
    assert counts.keys() >= EXCEPTIONS, EXCEPTIONS - counts.keys()
