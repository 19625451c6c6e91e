"""`elector ... --help` is the same under PYTHONOPTIMIZE=2, the way the container image runs it.

-OO strips docstrings, and click takes a command's description from its function's docstring
unless `help=` is given; every command in elector/cli/ passes its help explicitly. This runs the
real CLI in subprocesses, once plain and once with PYTHONOPTIMIZE=2, for every command and
subcommand the `elector` group has (walked from the group, so a new command is covered too).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import click
import pytest

from elector.cli.main import cli


def _command_paths(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = [prefix]
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            paths += _command_paths(command, (*prefix, name))
        else:
            paths.append((*prefix, name))
    return paths


def _command(path: tuple[str, ...]) -> click.Command:
    command: click.Command = cli
    for name in path:
        assert isinstance(command, click.Group)
        command = command.commands[name]
    return command


def _help(path: tuple[str, ...], *, optimize: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ELECTOR_", "PYTHON"))}
    env["COLUMNS"] = "100"  # the same wrapping in both runs, whatever the terminal
    if optimize is not None:
        env["PYTHONOPTIMIZE"] = optimize
    completed = subprocess.run(
        [sys.executable, "-m", "elector", *path, "--help"],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    assert completed.stderr == ""
    return completed.stdout


PATHS = _command_paths(cli)


def test_every_command_is_walked() -> None:
    names = {" ".join(path) for path in PATHS}
    assert {"", "run", "status", "handoff", "demo", "leader-file", "leader-file check", "operator"} <= names


@pytest.mark.parametrize("path", PATHS, ids=lambda path: " ".join(path) or "elector")
def test_help_is_identical_without_docstrings(path: tuple[str, ...]) -> None:
    plain = _help(path, optimize=None)
    optimized = _help(path, optimize="2")
    assert optimized == plain
    # Identical and also complete: the description itself is there, not two empty ones.
    description = _command(path).help
    assert description, f"elector {' '.join(path)}: no help= given"
    first_line = description.strip().splitlines()[0]
    assert first_line.split()[0] in optimized
    if path:
        # The parent's command list shows a short help, derived from help= too (or short_help).
        parent = _help(path[:-1], optimize="2")
        listed = re.search(rf"^  {re.escape(path[-1])} +(\S.*)$", parent, re.MULTILINE)
        assert listed is not None, parent
