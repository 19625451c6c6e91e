"""elector: leader election for Kubernetes workloads on a Redis lease.

The library API (`elector.Elector`, ...) is imported on first use, so that `import elector`, which
every CLI start pays for, does not load redis, the election and the backend.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from elector.api import Elector, ElectorConfigError, Leadership, LeadershipLost
    from elector.election.outcome import StepDownReason
    from elector.fencing import FencedStore

#: Each public name and the module that defines it.
_LAZY_NAMES = {
    "Elector": "elector.api",
    "ElectorConfigError": "elector.api",
    "Leadership": "elector.api",
    "LeadershipLost": "elector.api",
    "StepDownReason": "elector.election.outcome",
    "FencedStore": "elector.fencing",
}

__all__ = [
    "Elector",
    "ElectorConfigError",
    "FencedStore",
    "Leadership",
    "LeadershipLost",
    "StepDownReason",
    "__version__",
]


def __getattr__(name: str) -> Any:
    module = _LAZY_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'elector' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY_NAMES))
