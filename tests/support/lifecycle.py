"""`with Thing(...) as thing:` for the test helpers that start processes and stop them by PID."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class StartStop:
    """Mixin: `__enter__` starts, `__exit__` stops (whatever happened inside the block)."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
