"""Modules are split by purpose, never to meet a line count; a long one says why it is one module.

A module of elector/ over `LONG_LINES` lines must say, in its docstring, why its length is one
purpose: a paragraph that begins with `REASON_OPENING`. The keeper is apart: it runs alone
(`python -I -S`, nothing of elector importable), so whatever it needs must live in its one file.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "elector"
LONG_LINES = 800
#: How a long module's docstring opens the paragraph that gives its reason.
REASON_OPENING = "One module, though long:"
#: Relative to the repository: the modules that may be long without saying why (see the module doc).
APART = frozenset({"elector/daemon/execmode/keeper.py"})


def line_counts() -> dict[str, int]:
    return {
        path.relative_to(ROOT).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def gives_its_reason(source: str) -> bool:
    """Whether the module doc of `source` has a paragraph that opens with `REASON_OPENING`."""
    docstring = ast.get_docstring(ast.parse(source)) or ""
    return any(paragraph.startswith(REASON_OPENING) for paragraph in docstring.split("\n\n"))


def test_a_module_over_800_lines_says_in_its_docstring_why_it_is_one() -> None:
    silent = {
        name: lines
        for name, lines in line_counts().items()
        if lines > LONG_LINES
        and name not in APART
        and not gives_its_reason((ROOT / name).read_text(encoding="utf-8"))
    }
    assert not silent, (
        f"modules over {LONG_LINES} lines: split each by purpose, or give the reason it is one purpose in "
        f"its docstring, in a paragraph that begins {REASON_OPENING!r}: {silent}"
    )


def test_a_reason_counts_only_as_a_paragraph_of_the_module_doc() -> None:
    reason = f"{REASON_OPENING} the loop and its timers share one state."
    assert gives_its_reason(f'"""Tasks.\n\n{reason}\n"""\n')
    assert not gives_its_reason(f'"""Tasks: {reason}"""\n'), "inside a paragraph"
    assert not gives_its_reason(f'"""Tasks."""\n\n# {reason}\n'), "a comment"
    assert not gives_its_reason(f'def run():\n    """Run.\n\n    {reason}\n    """\n'), "a function's doc"


def test_the_modules_apart_still_exist() -> None:
    # A module apart that was renamed or split would silently cover nothing.
    assert line_counts().keys() >= APART, APART - line_counts().keys()
