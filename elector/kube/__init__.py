"""The Kubernetes side of elector, built with kopf (the `kube` extra: `pip install elector[kube]`).

    from elector.kube import run_singleton   # any kopf operator as a hot-standby singleton

Names are imported on first use, so that importing this package (the CLI does, to offer its
commands) loads neither kopf nor its dependencies.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from elector.kube.singleton import run_singleton, run_singleton_blocking

#: Each public name and the module that defines it.
_LAZY_NAMES = {
    "run_singleton": "elector.kube.singleton",
    "run_singleton_blocking": "elector.kube.singleton",
}

__all__ = ["run_singleton", "run_singleton_blocking"]


def __getattr__(name: str) -> Any:
    module = _LAZY_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'elector.kube' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY_NAMES))
