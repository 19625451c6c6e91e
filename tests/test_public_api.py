"""The library's public API is what `elector` exports, stated in docs/library.md, and the only part
of elector that the docs' code examples use."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import elector
import elector.kube
import elector.sync

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
#: Modules besides `elector` itself that are documented for users (docs/library.md).
DOCUMENTED_MODULES = ("elector.kube", "elector.testing", "elector.sync")
_PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def python_blocks(path: Path) -> list[tuple[int, str]]:
    """The ```python blocks of a Markdown file, with the line each starts on."""
    text = path.read_text()
    matches = _PYTHON_BLOCK.finditer(text)
    return [(text.count("\n", 0, match.start()) + 2, match.group(1)) for match in matches]


def uses_of_elector(source: str) -> list[str]:
    """What a snippet takes from elector: `elector.X` for `from elector import X`, `elector.X`
    attributes and `import elector.X` modules, and `elector.x.y:Z` for other from-imports."""
    # Examples run inside `async def main()` in real programs: allow `async with` at top level.
    tree = compile(source, "<doc>", "exec", flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "elector":
            found += [f"{node.module}:{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.split(".")[0] == "elector"]
        elif isinstance(node, ast.Attribute) and ast.unparse(node.value) == "elector":
            found.append(f"elector.{node.attr}")
    return found


def allowed(use: str) -> bool:
    module, _, name = use.partition(":")
    if module.startswith(DOCUMENTED_MODULES):
        return module != "elector.kube" or not name or name in elector.kube.__all__
    if module == "elector" and name:
        return name in elector.__all__
    if not name and module.count(".") == 1:  # elector.X, an attribute or `import elector.X`
        attribute = module.split(".")[1]
        return attribute in elector.__all__ or f"elector.{attribute}" in DOCUMENTED_MODULES
    return module == "elector"


def test_every_exported_name_resolves_and_is_loaded_lazily() -> None:
    assert set(elector.__all__) - {"__version__"} == set(elector._LAZY_NAMES)
    for name in elector.__all__:
        assert getattr(elector, name) is not None, name
        assert name in dir(elector)


def test_docs_library_md_lists_every_exported_name() -> None:
    text = (ROOT / "docs" / "library.md").read_text()
    section = text.split("## Public API", 1)[1]
    missing = [name for name in elector.__all__ if f"`{name}`" not in section]
    assert not missing, f"exported but not listed in docs/library.md's Public API: {missing}"
    assert all(f"`{name}`" in section for name in elector.kube.__all__)
    assert all(f"`{name}`" in section for name in elector.sync.__all__)


@pytest.mark.parametrize("path", DOCS, ids=lambda path: path.name)
def test_code_examples_use_only_the_public_api(path: Path) -> None:
    outside = [
        f"{path.name}:{line}: {use}"
        for line, source in python_blocks(path)
        for use in uses_of_elector(source)
        if not allowed(use)
    ]
    assert not outside, "docs reach into elector's internals:\n" + "\n".join(outside)


def test_the_examples_are_found_and_read() -> None:
    uses = {
        name: [use for _, source in python_blocks(ROOT / name) for use in uses_of_elector(source)]
        for name in ("README.md", "docs/library.md", "docs/topologies.md", "docs/fencing.md")
    }
    assert {"elector.Elector", "elector.run", "elector.kube:run_singleton_blocking"} <= set(uses["README.md"])
    assert {"elector.sync", "elector.run", "elector.LeadershipTimeout"} <= set(uses["docs/library.md"])
    assert "elector.Elector" in uses["docs/topologies.md"]  # the Cluster and Redlock examples
    assert "elector:StaleFencingTokenError" in uses["docs/fencing.md"]


@pytest.mark.parametrize(
    ("use", "ok"),
    [
        ("elector", True),
        ("elector:Elector", True),
        ("elector.Elector", True),
        ("elector.FencedStore", True),
        ("elector.kube:run_singleton_blocking", True),
        ("elector.testing.redis_server:RedisServerProcess", True),
        ("elector.fencing:FencedStore", False),
        ("elector.backend:RedisSettings", False),
        ("elector.backend.topologies.cluster", False),
        ("elector:RedisLeaseBackend", False),
        ("elector.kube:not_exported", False),
    ],
)
def test_the_check_tells_public_from_internal(use: str, ok: bool) -> None:
    assert allowed(use) is ok
