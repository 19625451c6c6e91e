"""The election is one class read top-down, driven by a many-locks engine through its public
interface only (the import contracts in pyproject.toml keep the election from naming the engine)."""

from __future__ import annotations

import ast
from pathlib import Path

from elector.election import Election

ROOT = Path(__file__).resolve().parents[2]


def test_the_election_is_one_class_not_assembled_from_mixins() -> None:
    assert Election.__mro__ == (Election, object)


def test_the_many_locks_engine_uses_no_private_name_of_an_election() -> None:
    # Every attribute the engine reads or writes on an election (or anything else it does not own)
    # is public: a private one would tie the engine to the election's insides again.
    tree = ast.parse((ROOT / "elector/daemon/many_locks/rounds.py").read_text(encoding="utf-8"))
    private = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not (isinstance(node.value, ast.Name) and node.value.id == "self")
    }
    assert not private, private
