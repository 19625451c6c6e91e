"""The process under test of bench/many_locks/benchmark.py: `elector run --locks-file` with a renewal
recorder.

`python -m bench.many_locks.daemon --record PATH [elector run settings as --name=value ...]` builds
the settings with the daemon's own `build_settings` and runs the daemon's own `run_daemon`, with one
addition: an outcome observer (`Daemon(outcome_observer=...)`) that keeps, per renewal, its send
time (CLOCK_BOOTTIME, the clock every process of the host shares) and its round trip, and counts
the other outcomes by kind. The renewals go to PATH.renewals as pairs of native doubles, written
RECORD_CHUNK at a time, so that the recorder's memory stays flat (100,000 locks renew ~33,000
times a second: kept in memory, five minutes of them were 160 MiB of the daemon's footprint). It
prints one JSON line `all_acquired` once every lock was acquired, and writes the rest of the
record to PATH when the daemon has stopped (SIGTERM). Kept apart from
bench/many_locks/benchmark.py so that the process loads what `elector run` loads (the CLI's modules
included) and nothing of the bench.
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

#: Renewals (two doubles each) kept in memory before they are appended to the renewals file.
RECORD_CHUNK = 4096


class Recorder:
    def __init__(self, locks: int, *, renewals: Path) -> None:
        self.locks = locks
        #: (send time, round trip) of the renewals not yet written, interleaved.
        self.pending = array.array("d")
        self.file = renewals.open("wb")
        #: (boottime, kind) of every outcome that is neither a renewal nor an acquisition, the kind
        #: followed by `:<reason>` when the outcome ended a term.
        self.other: list[tuple[float, str]] = []
        self.kinds: collections.Counter[str] = collections.Counter()
        self.acquired: set[str] = set()

    def __call__(self, lock: str, outcome: CycleOutcome) -> None:
        kind = outcome.kind
        if kind is OutcomeKind.RENEWED and outcome.duration_s is not None:
            self.pending.append(outcome.at)
            self.pending.append(outcome.duration_s)
            if len(self.pending) >= 2 * RECORD_CHUNK:
                self.flush()
            return
        self.kinds[kind.value] += 1
        if kind is OutcomeKind.ACQUIRED:
            self.acquired.add(lock)
            if len(self.acquired) == self.locks:
                line = {"event": "all_acquired", "boottime": boottime(), "locks": self.locks}
                print(json.dumps(line), flush=True)
        elif kind is not OutcomeKind.RELEASED:
            reason = outcome.step_down_reason
            self.other.append((outcome.at, kind.value if reason is None else f"{kind.value}:{reason.value}"))

    def flush(self) -> None:
        self.pending.tofile(self.file)
        self.file.flush()
        del self.pending[:]

    def dump(self, path: Path) -> None:
        self.flush()
        self.file.close()
        path.write_text(json.dumps({"other": self.other, "kinds": dict(self.kinds)}))


def read_renewals(path: Path) -> array.array[float]:
    """The (send time, round trip) pairs a Recorder wrote, interleaved."""
    values = array.array("d")
    values.frombytes(path.read_bytes())
    return values


def main(argv: list[str]) -> int:
    record = Path(argv[argv.index("--record") + 1])
    params: dict[str, object] = {}
    for item in argv:
        if item.startswith("--") and "=" in item:
            name, value = item[2:].split("=", 1)
            params[name.replace("-", "_")] = float(value) if name == "ttl" else value
    locks_file = Path(str(params.pop("locks_file")))
    settings = build_settings(lock=(), locks_file=locks_file, **params)  # type: ignore[arg-type]
    recorder = Recorder(len(settings.locks), renewals=record.with_suffix(".renewals"))
    code = run_daemon(settings, outcome_observer=recorder)
    recorder.dump(record)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
