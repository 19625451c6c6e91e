"""Looking at and steering a lock from outside an election: `elector status` and `elector handoff`."""
