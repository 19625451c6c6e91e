"""The process under test of bench/many_locks/benchmark.py: `elector run --locks-file` with a renewal
recorder.

`python -m bench.many_locks.daemon --record PATH [elector run settings as --name=value ...]` builds
the settings with the daemon's own `build_settings` and runs the daemon's own `run_daemon`, with one
addition: an outcome observer (`Daemon(outcome_observer=...)`) that keeps, per renewal, its send
time (CLOCK_BOOTTIME, the clock every process of the host shares) and its round trip, in two
`array('d')` (16 bytes per renewal), and counts the other outcomes by kind. It prints one JSON line
`all_acquired` once every lock was acquired, and writes the record to PATH when the daemon has
stopped (SIGTERM). Kept apart from bench/many_locks/benchmark.py so that the process loads what `elector run`
loads (the CLI's modules included) and nothing of the bench.
"""

from __future__ import annotations

import array
import collections
import json
import sys
from pathlib import Path

import elector.cli.main  # noqa: F401  (loaded by `elector run` too: same memory footprint)
from elector.daemon.service import run_daemon
from elector.daemon.settings import build_settings
from elector.election import CycleOutcome, OutcomeKind
from elector.election.clock import boottime


class Recorder:
    def __init__(self, locks: int) -> None:
        self.locks = locks
        self.at = array.array("d")
        self.duration = array.array("d")
        #: (boottime, kind) of every outcome that is neither a renewal nor an acquisition.
        self.other: list[tuple[float, str]] = []
        self.kinds: collections.Counter[str] = collections.Counter()
        self.acquired: set[str] = set()

    def __call__(self, lock: str, outcome: CycleOutcome) -> None:
        kind = outcome.kind
        if kind is OutcomeKind.RENEWED and outcome.duration_s is not None:
            self.at.append(outcome.at)
            self.duration.append(outcome.duration_s)
            return
        self.kinds[kind.value] += 1
        if kind is OutcomeKind.ACQUIRED:
            self.acquired.add(lock)
            if len(self.acquired) == self.locks:
                line = {"event": "all_acquired", "boottime": boottime(), "locks": self.locks}
                print(json.dumps(line), flush=True)
        elif kind is not OutcomeKind.RELEASED:
            self.other.append((outcome.at, kind.value))

    def dump(self, path: Path) -> None:
        data = {
            "renewals": list(zip(self.at, self.duration, strict=True)),
            "other": self.other,
            "kinds": dict(self.kinds),
        }
        path.write_text(json.dumps(data))


def main(argv: list[str]) -> int:
    record = Path(argv[argv.index("--record") + 1])
    params: dict[str, object] = {}
    for item in argv:
        if item.startswith("--") and "=" in item:
            name, value = item[2:].split("=", 1)
            params[name.replace("-", "_")] = float(value) if name == "ttl" else value
    locks_file = Path(str(params.pop("locks_file")))
    settings = build_settings(lock=(), locks_file=locks_file, **params)  # type: ignore[arg-type]
    recorder = Recorder(len(settings.locks))
    code = run_daemon(settings, outcome_observer=recorder)
    recorder.dump(record)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
