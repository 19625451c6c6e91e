"""Fixtures of the exec-mode tests."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest


@pytest.fixture
def spawned(monkeypatch: pytest.MonkeyPatch) -> list[asyncio.subprocess.Process]:
    """The children the supervisors start, as asyncio's processes: each one's own exit status."""
    real = asyncio.create_subprocess_exec
    found: list[asyncio.subprocess.Process] = []

    async def recording(*args: Any, **kwargs: Any) -> asyncio.subprocess.Process:
        process = await real(*args, **kwargs)
        found.append(process)
        return process

    monkeypatch.setattr(asyncio, "create_subprocess_exec", recording)
    return found
