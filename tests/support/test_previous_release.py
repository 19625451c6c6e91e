"""The previous-release fixture: it runs that release's code, and a missing commit is an error that says
how to fix it (never a skip)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.previous_release import (
    PreviousRelease,
    PreviousReleaseError,
    build_previous_release,
    resolve_commit,
)

REPO = Path(__file__).resolve().parents[2]


def test_the_entry_point_runs_the_release_s_own_code_even_with_pythonpath_at_the_checkout(
    previous_release: PreviousRelease, tmp_path: Path
) -> None:
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    argv = [*previous_release.elector, "--version"]
    version = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=env, check=True)
    assert version.stdout.strip() == f"elector, version {previous_release.version}"
    # Its elector package is the one of the commit, byte for byte, not the working tree's.
    site = next((previous_release.venv / "lib").glob("python3.*/site-packages"))
    archived = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{previous_release.commit}:elector/election/machine.py"],
        capture_output=True, check=True,
    ).stdout  # fmt: skip
    assert (site / "elector" / "election" / "machine.py").read_bytes() == archived


def test_a_second_build_comes_from_the_cache(previous_release: PreviousRelease) -> None:
    again = build_previous_release(REPO)
    assert again.build_s is None and again.venv == previous_release.venv


def test_a_shallow_clone_without_the_commit_fails_saying_how_to_fetch_it(tmp_path: Path) -> None:
    parent = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD~1"], capture_output=True, text=True, check=True
    ).stdout.strip()
    clone = tmp_path / "clone"
    subprocess.run(
        ["git", "clone", "--quiet", "--depth", "1", f"file://{REPO}", str(clone)], check=True, timeout=120
    )
    with pytest.raises(PreviousReleaseError, match=r"shallow clone: run `git fetch --unshallow`"):
        resolve_commit(clone, parent)


def test_outside_a_git_checkout_the_error_says_so(tmp_path: Path) -> None:
    with pytest.raises(PreviousReleaseError, match="is not a git checkout"):
        build_previous_release(tmp_path, cache=tmp_path / "cache")
