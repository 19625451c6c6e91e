"""The top of `elector/` stays a lobby: the public faces and the domain types every floor shares.

Everything else lives in the package of its purpose (library/, telemetry/, daemon/, election/,
...), where a newcomer looks for it and where the import contracts can name it as one package.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "elector"
MAX_TOP_MODULES = 8


def test_at_most_eight_modules_at_the_top_of_the_package() -> None:
    top = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_MODULES, f"{len(top)} modules at the top of elector/: {top}"


def test_the_library_marks_its_private_modules() -> None:
    # Users import from `elector` and `elector.sync`; inside the package, a module without a
    # leading underscore must be where one of `elector`'s public names is defined.
    import elector

    homes = {getattr(getattr(elector, name), "__module__", None) for name in elector.__all__}
    unmarked = {
        f"elector.library.{path.stem}"
        for path in (PACKAGE / "library").glob("*.py")
        if not path.stem.startswith("_")
    }
    assert unmarked <= homes, f"unmarked, yet home to no public name: {sorted(unmarked - homes)}"
