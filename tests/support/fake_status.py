"""A mutable status provider for the adapters' tests: tests replace fields, adapters read snapshots."""

from __future__ import annotations

import dataclasses

from elector.election.outcome import ElectionStatus, State


class FakeStatus:
    def __init__(self, **changes: object) -> None:
        self.value = ElectionStatus(
            lock="jobs",
            identity="pod-a",
            state=State.FOLLOWER,
            is_leader=False,
            holder=None,
            fencing_token=None,
            lease_remaining_s=None,
            started=True,
            last_backend_ok_at=None,
            cycle_due_by=None,
            backend_up=False,
            now=100.0,
        )
        self.set(**changes)
        #: When set, the provider raises it (an adapter must survive a failing status).
        self.error: Exception | None = None

    def set(self, **changes: object) -> None:
        self.value = dataclasses.replace(self.value, **changes)  # type: ignore[arg-type]

    def __call__(self) -> ElectionStatus:
        if self.error is not None:
            raise self.error
        return self.value
