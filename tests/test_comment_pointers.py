"""Every `.py` file a comment or docstring names exists: a pointer to a renamed or removed file
misleads the next reader.

Which files are read: every `.py` file of the repository (the venv, caches and build output
apart). What counts as a pointer: a name ending in `.py` inside a comment, or inside the docstring
of a module, class or function; a path (`daemon/execmode/keeper.py`) or a bare name (`keeper.py`).
How a pointer is resolved: it names an existing file when some file of the repository has that
path, or a path that ends with it at a folder boundary (`execmode/keeper.py` and `keeper.py` name
elector/daemon/execmode/keeper.py; a path with a folder left out names nothing). A file of another
revision is written with its revision, as git writes it (`REV:path.py`): that is history, not a
pointer to today's tree. Web addresses are not pointers.
"""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: Folders that hold no file of the project's own.
NOT_OURS = frozenset(
    {".git", ".venv", "venv", "build", "dist", "node_modules", "__pycache__", ".mypy_cache", ".ruff_cache"}
)
#: A `.py` name, bare or with folders; not inside a longer path, a web address or `REV:path`.
POINTER = re.compile(r"(?<![\w./:-])((?:[\w.-]+/)*[A-Za-z_][\w-]*\.py)\b")


def project_files() -> list[str]:
    """Every file of the repository, as a path relative to it."""
    found = []
    for folder, subfolders, names in os.walk(ROOT):
        subfolders[:] = [
            name for name in subfolders if name not in NOT_OURS and not name.endswith(".egg-info")
        ]
        relative = Path(folder).relative_to(ROOT)
        found.extend((relative / name).as_posix() for name in names)
    return found


def comments_and_docstrings(source: str) -> Iterator[tuple[int, str]]:
    """(line, text) of each comment and of each module, class or function docstring of `source`."""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    pending: list[ast.AST] = [ast.parse(source)]
    while pending:  # only the statements that hold others: a docstring is a body's first one
        node = pending.pop()
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            docstring = ast.get_docstring(node, clean=False)
            if docstring is not None:
                yield node.body[0].lineno, docstring
        for field in ("body", "orelse", "finalbody", "handlers"):
            pending.extend(child for child in getattr(node, field, ()) if isinstance(child, ast.AST))


def pointers(source: str) -> Iterator[tuple[int, str]]:
    """(line, name) of each `.py` name the comments and docstrings of `source` hold."""
    if ".py" not in source:
        return
    for line, text in comments_and_docstrings(source):
        for match in POINTER.finditer(text):
            yield line, match.group(1)


def names_a_file(name: str, files: list[str]) -> bool:
    return any(path == name or path.endswith("/" + name) for path in files)


def test_every_py_file_a_comment_or_docstring_names_exists() -> None:
    files = project_files()
    dangling = [
        f"{path}:{line}: {name}"
        for path in sorted(p for p in files if p.endswith(".py"))
        for line, name in pointers((ROOT / path).read_text(encoding="utf-8"))
        if not names_a_file(name, files)
    ]
    assert not dangling, "comments and docstrings that name files that do not exist:\n" + "\n".join(dangling)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("# see keeper.py and execmode/treestop.py:tree_of\n", ["keeper.py", "execmode/treestop.py"]),
        ('"""Module.\n\nThe scripts (see lua/lease.py)."""\n', ["lua/lease.py"]),
        ("class A:\n    '''As in __init__.py.'''\n", ["__init__.py"]),
        ("def f():\n    '''test_x.py, then.'''\n", ["test_x.py"]),
        ("x = 'a string naming y.py is code, not a comment'\n", []),
        ("# https://github.com/redis/redis-py/blob/master/redis/lock.py\n", []),
        ("# it was PREVIOUS_RELEASE:elector/backend/scripts.py\n", []),
        ("# a .pyc, a .pyi or a .python file: none\n", []),
    ],
)
def test_what_counts_as_a_pointer(source: str, expected: list[str]) -> None:
    assert [name for _, name in pointers(source)] == expected


def test_a_pointer_resolves_at_a_folder_boundary_only() -> None:
    files = ["elector/daemon/execmode/keeper.py", "elector/backend/topologies/redlock.py"]
    assert names_a_file("keeper.py", files)
    assert names_a_file("execmode/keeper.py", files)
    assert names_a_file("elector/daemon/execmode/keeper.py", files)
    assert not names_a_file("backend/redlock.py", files), "a folder left out"
    assert not names_a_file("eeper.py", files), "not at a folder boundary"
    assert not names_a_file("exec_mode.py", files)
