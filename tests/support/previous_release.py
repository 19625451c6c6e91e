"""The previous release of elector, installed into a virtualenv of its own, for mixed-fleet tests.

    release = build_previous_release(REPO_ROOT)        # cached in build/previous-release/<commit[:12]>/
    subprocess.run([*release.elector, "run", ...])     # that release's `elector` entry point

The release's code comes from the repository's own history at a fixed commit (`git archive`), so a
fresh clone builds exactly the same thing, offline, in about a second. The virtualenv gets only the
`elector` package of that commit; its dependencies (redis, click, aiohttp, ...) come from the main
.venv through a .pth file. A plain path line in a .pth does not process the .pth files it points
at, so the main venv's editable install of the *current* elector stays invisible there, and the
venv's own site-packages comes first on sys.path anyway. `build_previous_release()` checks which
file `import elector` really loads before handing the release out. So the old code runs on the
current dependencies, not on the versions it shipped with: what is tested is the protocol between
the two releases' code, not the old release's own dependency set.

No pip and no build backend: the .venv's setuptools may be too old to build a wheel offline, and
elector is pure Python with one console script, which is written here from the commit's
pyproject.toml.

A shallow clone (CI's default in some systems) lacks the commit: that is an error with the fix in
its message, never a skip, because a skipped compatibility test looks exactly like a passing one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import io
import json
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

#: The last release (0.1.0): HEAD before the 0.2.0 work began. Bump it at each release.
PREVIOUS_RELEASE_COMMIT = "cbaaac65455e7ccd57407db791688cffb9ab8336"
PREVIOUS_RELEASE_VERSION = "0.1.0"
#: Bumped when the layout built here changes, so stale caches are rebuilt.
_LAYOUT = 2


class PreviousReleaseError(Exception):
    """The previous release cannot be built; the message says how to fix it."""


@dataclasses.dataclass(frozen=True)
class PreviousRelease:
    commit: str
    version: str
    venv: Path
    #: Seconds the build took, or None when it came from the cache.
    build_s: float | None

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def elector(self) -> tuple[str, ...]:
        """The argv prefix of that release's `elector` command (its installed entry point)."""
        return (str(self.venv / "bin" / "elector"),)


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, check=False, timeout=60)
    except FileNotFoundError:
        raise PreviousReleaseError(
            "git is not installed: the previous release is built from the repository's history "
            "(apt-get install git)"
        ) from None


def resolve_commit(repo: Path, commit: str) -> str:
    """The full hash of `commit` in `repo`; an error saying how to get it when it is missing."""
    if _git(repo, "rev-parse", "--git-dir").returncode != 0:
        raise PreviousReleaseError(
            f"{repo} is not a git checkout: the mixed-fleet tests build the previous release "
            f"({PREVIOUS_RELEASE_VERSION}, commit {commit}) from the repository's history. "
            "Run the tests from a git clone."
        )
    found = _git(repo, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}")
    if found.returncode == 0:
        return found.stdout.decode().strip()
    shallow = _git(repo, "rev-parse", "--is-shallow-repository").stdout.decode().strip() == "true"
    hint = (
        "this is a shallow clone: run `git fetch --unshallow` (or clone without --depth)"
        if shallow
        else f"fetch it: `git fetch origin {commit}` (or `git fetch --unshallow` in a shallow clone)"
    )
    raise PreviousReleaseError(
        f"commit {commit} (elector {PREVIOUS_RELEASE_VERSION}, the previous release the "
        f"rolling-upgrade tests run against) is not in {repo}: {hint}"
    )


def _site_packages(venv: Path) -> Path:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return venv / "lib" / version / "site-packages"


def _main_site_dirs() -> list[str]:
    """The main environment's site-packages (purelib and platlib), where the dependencies are."""
    paths = sysconfig.get_paths()
    return list(dict.fromkeys(paths[name] for name in ("purelib", "platlib")))


def _fingerprint(commit: str) -> dict[str, object]:
    return {
        "layout": _LAYOUT,
        "commit": commit,
        "python": sys.version,
        "base": getattr(sys, "_base_executable", sys.executable),
        "deps": _main_site_dirs(),
    }


def _extract_package(repo: Path, commit: str, destination: Path) -> dict[str, object]:
    """Unpack the commit's `elector` package into `destination`; return its pyproject.toml."""
    archive = _git(repo, "archive", "--format=tar", commit, "elector", "pyproject.toml")
    if archive.returncode != 0:
        raise PreviousReleaseError(f"git archive {commit} failed: {archive.stderr.decode().strip()}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(destination, filter="data")
        else:  # Python < 3.11.4 (Debian 12 has 3.11.2); the archive is our own history
            tar.extractall(destination)
        pyproject_member = tar.extractfile("pyproject.toml")
        assert pyproject_member is not None
        pyproject = tomllib.load(pyproject_member)
    (destination / "pyproject.toml").unlink()
    return pyproject


def _write_scripts(venv: Path, pyproject: dict[str, object]) -> None:
    project = pyproject.get("project")
    scripts = project.get("scripts", {}) if isinstance(project, dict) else {}
    if "elector" not in scripts:
        raise PreviousReleaseError("the previous release's pyproject.toml declares no `elector` script")
    for name, target in scripts.items():
        module, _, function = str(target).partition(":")
        path = venv / "bin" / name
        path.write_text(
            # -I: PYTHONPATH (or a current directory holding elector/) must not bring in other code.
            f"#!{venv / 'bin' / 'python'} -I\n"
            "import sys\n"
            f"from {module} import {function}\n"
            f"sys.exit({function}())\n"
        )
        path.chmod(0o755)


def _check(venv: Path) -> None:
    """`import elector` in the venv must load the previous release's copy, and its dependencies."""
    probe = "import elector, elector.cli, redis, click; print(elector.__file__)"
    # -I, as in the entry point's #! line: neither PYTHONPATH nor the current directory count.
    result = subprocess.run(
        [str(venv / "bin" / "python"), "-I", "-c", probe], capture_output=True, check=False, timeout=60
    )
    loaded = result.stdout.decode().strip()
    if result.returncode != 0 or not Path(loaded).resolve().is_relative_to(_site_packages(venv).resolve()):
        raise PreviousReleaseError(
            f"the previous release's venv {venv} does not load its own elector "
            f"(loaded {loaded or 'nothing'}):\n"
            f"{result.stderr.decode()[-2000:]}"
        )


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One builder at a time (pytest-xdist workers, two engineers' runs in one checkout)."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build_previous_release(
    repo: Path, *, commit: str = PREVIOUS_RELEASE_COMMIT, cache: Path | None = None
) -> PreviousRelease:
    """The previous release's venv, built on first use and cached per commit (and interpreter)."""
    repo = repo.resolve()
    full = resolve_commit(repo, commit)
    root = cache.resolve() if cache is not None else repo / "build" / "previous-release"
    root.mkdir(parents=True, exist_ok=True)
    venv = root / full[:12]
    stamp = venv / "elector-build.json"
    fingerprint = _fingerprint(full)
    with _locked(root / f"{full[:12]}.lock"):
        built = json.loads(stamp.read_text()) if stamp.exists() else {}
        if built.get("fingerprint") == fingerprint:
            _check(venv)
            return PreviousRelease(full, str(built["version"]), venv, None)
        started = time.monotonic()
        # A venv is not relocatable (absolute paths in bin/): built in place, stamped last.
        shutil.rmtree(venv, ignore_errors=True)
        base = getattr(sys, "_base_executable", sys.executable)
        made = subprocess.run(
            [base, "-m", "venv", "--without-pip", str(venv)], capture_output=True, check=False, timeout=120
        )
        if made.returncode != 0:
            raise PreviousReleaseError(f"{base} -m venv {venv} failed:\n{made.stderr.decode()[-2000:]}")
        site = _site_packages(venv)
        pyproject = _extract_package(repo, full, site)
        (site / "elector-main-venv-deps.pth").write_text("".join(f"{d}\n" for d in _main_site_dirs()))
        _write_scripts(venv, pyproject)
        _check(venv)
        build_s = time.monotonic() - started
        project = pyproject.get("project")
        version = str(project.get("version", "unknown")) if isinstance(project, dict) else "unknown"
        record = {"fingerprint": fingerprint, "version": version, "build_s": round(build_s, 3)}
        stamp.write_text(json.dumps(record, indent=1) + "\n")
    return PreviousRelease(full, version, venv, build_s)
