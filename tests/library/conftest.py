"""Fixtures of the library's tests: `spawn` runs leadership bodies on the Electors of the
module's own `make` fixture (real Redis in test_api.py, the in-memory lease in test_api_logic.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from elector import Elector
from tests.support.bodies import Body


@pytest.fixture
async def spawn(make) -> AsyncIterator[Callable[..., Body]]:
    """Start bodies; those still running at the end are cancelled before the Electors close."""
    bodies: list[Body] = []

    def _spawn(e: Elector, **kwargs: Any) -> Body:
        bodies.append(Body(e, **kwargs))
        return bodies[-1]

    yield _spawn
    for body in bodies:
        body.task.cancel()
    await asyncio.gather(*(body.task for body in bodies), return_exceptions=True)
