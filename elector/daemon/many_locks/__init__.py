"""The daemon's many-locks engine: one `Election` per lock on one event loop, thousands of them.

- engine.py: how the locks start (a `StartGate`), stop (`BatchedStop`) and keep the garbage
  collector out of their way;
- rounds.py: `RenewalRounds`, which renews the leases due at one grid point in one batched send
  (the elections' `Renewer`);
- shared_timers.py: one loop timer per wake-up time for all the elections due then;
- grid.py: how far apart the renewal grid's points are, by the number of locks.

The election knows none of this: the engine drives it through `Election`'s small public
interface (`run(start_gate=)`, `shared_timers=`, `renewer=` and the renewal methods a `Renewer`
calls).
"""

from elector.daemon.many_locks.engine import BatchedStop, StartGate, freeze_long_lived, start_spacing_s
from elector.daemon.many_locks.grid import renew_grid_s
from elector.daemon.many_locks.rounds import RenewalRounds
from elector.daemon.many_locks.shared_timers import SharedTimers

__all__ = [
    "BatchedStop",
    "RenewalRounds",
    "SharedTimers",
    "StartGate",
    "freeze_long_lived",
    "renew_grid_s",
    "start_spacing_s",
]
