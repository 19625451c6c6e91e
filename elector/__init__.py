"""elector: leader election for Kubernetes workloads on a Redis lease.

The library API (`elector.Elector`, ...; the sync one in `elector.sync`) is imported on first
use, so that `import elector`, which every CLI start pays for, does not load redis, the election
and the backend.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from elector._version import __version__  # the release (elector/_version.py)

if TYPE_CHECKING:
    from elector.election.outcome import ElectionStatus, State, StepDownReason
    from elector.lease import Holder
    from elector.library.elector import (
        Elector,
        ElectorConfigError,
        ForkedElectorError,
        Leadership,
        LeadershipLost,
        LeadershipTimeout,
        RedisSetupError,
    )
    from elector.library.fencing import (
        CorruptFenceKeyError,
        FencedStore,
        FencedWriteResult,
        FencingError,
        StaleFencingTokenError,
    )
    from elector.library.signals import run
    from elector.library.watch import Leader, LeaderWatch, watch

#: Each public name and the module that defines it. These names are the library's public API
#: (listed in docs/library.md); every other module of elector is internal and may change.
_LAZY_NAMES = {
    # Leader election (elector/library/elector.py): the Elector, one term of leadership, how a term ends.
    "Elector": "elector.library.elector",
    "ElectorConfigError": "elector.library.elector",
    "Leadership": "elector.library.elector",
    "LeadershipLost": "elector.library.elector",
    "LeadershipTimeout": "elector.library.elector",
    # fail_fast=True: Redis refuses us in a way retrying cannot cure.
    "RedisSetupError": "elector.library.elector",
    # An Elector used in a forked child (docs/library.md, "Fork and process managers").
    "ForkedElectorError": "elector.library.elector",
    # asyncio.run with SIGTERM unwinding like Ctrl-C (the sync API's is elector.sync.run).
    "run": "elector.library.signals",
    # Who leads, without contending.
    "watch": "elector.library.watch",
    "LeaderWatch": "elector.library.watch",
    "Leader": "elector.library.watch",
    "StepDownReason": "elector.election.outcome",
    # What Elector.status() returns.
    "ElectionStatus": "elector.election.outcome",
    "State": "elector.election.outcome",
    # ElectionStatus.holder: who holds the lock (identity, fencing token).
    "Holder": "elector.lease",
    # Fencing resources kept in Redis (docs/fencing.md).
    "FencedStore": "elector.library.fencing",
    "FencedWriteResult": "elector.library.fencing",
    "FencingError": "elector.library.fencing",
    "StaleFencingTokenError": "elector.library.fencing",
    "CorruptFenceKeyError": "elector.library.fencing",
}

__all__ = [
    "CorruptFenceKeyError",
    "ElectionStatus",
    "Elector",
    "ElectorConfigError",
    "FencedStore",
    "FencedWriteResult",
    "FencingError",
    "ForkedElectorError",
    "Holder",
    "Leader",
    "LeaderWatch",
    "Leadership",
    "LeadershipLost",
    "LeadershipTimeout",
    "RedisSetupError",
    "StaleFencingTokenError",
    "State",
    "StepDownReason",
    "__version__",
    "run",
    "watch",
]


def __getattr__(name: str) -> Any:
    module = _LAZY_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'elector' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY_NAMES))
