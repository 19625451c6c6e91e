"""Lease announcements: the shared pub/sub connection, its link, and the subscriptions built on it.

`LeaseEventSource` is what a lease backend needs of a shared connection: subscribe to one
channel. `EventHub` (hub.py) is the one the daemon uses; a backend never sees more of it.
"""

from __future__ import annotations

from typing import Protocol

from elector.lease import LeaseEventSubscription

__all__ = ["LeaseEventSource"]


class LeaseEventSource(Protocol):
    """Subscriptions to announcement channels over a connection shared by many locks."""

    async def subscribe(self, channel: str) -> LeaseEventSubscription:
        """Subscribe to `channel`; returns once Redis confirmed it. Raises LeaseBackendError."""
        ...
