"""`elector leader-file check PATH`: does the leader file say "leading" right now?

The rule (see elector/daemon/leader_file.py for the file): `is_leader` is true AND `valid_until_ms`
(wall clock, Unix epoch milliseconds) is still in the future. `is_leader` alone is not enough: a
daemon killed by SIGKILL leaves "true" behind while another replica leads; its validity end,
moved forward at each renewal, runs out before the lease can expire on Redis.

A consumer in another language applies the same two-field rule to the JSON. This module imports
only a few standard-library modules: a probe may run the check every second, and the import
time is most of its cost.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

#: A leader file is a few hundred bytes; anything much larger is not one.
MAX_FILE_BYTES = 64 * 1024


class LeaderFileUnusable(Exception):
    """The file cannot be read or is not a leader file (exit 2 of the check command)."""


class LeaderFileVerdict:
    """What a leader file says right now: `leading` only while its validity end is ahead.

    A plain class: dataclasses would import inspect and re on the probe's path."""

    __slots__ = ("leading", "reason")

    def __init__(self, leading: bool, reason: str) -> None:
        self.leading = leading
        #: One line for a person: why (not) leading.
        self.reason = reason

    def __repr__(self) -> str:
        return f"LeaderFileVerdict(leading={self.leading}, reason={self.reason!r})"


def check_leader_file(path: Path, *, wall_now_s: float | None = None) -> LeaderFileVerdict:
    """Whether the daemon that writes `path` leads now: `is_leader` and `valid_until_ms` ahead.

    LeaderFileUnusable when the file cannot be read or is not a leader file (a missing file
    included: a typo in the path must not look like a follower forever).
    """
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise LeaderFileUnusable(
            f"{path}: no such file (is the elector sidecar running with --leader-file?)"
        ) from None
    except OSError as exc:
        raise LeaderFileUnusable(f"{path}: cannot read: {exc.strerror or exc}") from None
    return judge_leader_file(
        data, source=str(path), wall_now_s=time.time() if wall_now_s is None else wall_now_s
    )


def judge_leader_file(data: bytes, *, source: str, wall_now_s: float) -> LeaderFileVerdict:
    """`check_leader_file` on content already read (`source` names it in errors)."""
    path = source
    if len(data) > MAX_FILE_BYTES:
        raise LeaderFileUnusable(f"{path}: over {MAX_FILE_BYTES} bytes: not a leader file")
    try:
        content = json.loads(data)
    except ValueError:
        raise LeaderFileUnusable(f"{path}: not JSON: not a leader file") from None
    if not isinstance(content, dict):
        raise LeaderFileUnusable(f"{path}: not a JSON object: not a leader file")
    is_leader = content.get("is_leader")
    if not isinstance(is_leader, bool):
        raise LeaderFileUnusable(f"{path}: is_leader is {is_leader!r}, not true or false")
    if "valid_until_ms" not in content:
        raise LeaderFileUnusable(f"{path}: without valid_until_ms (written by an older elector?)")
    valid_until_ms = content["valid_until_ms"]
    if valid_until_ms is not None and type(valid_until_ms) is not int:  # bool is an int subclass
        raise LeaderFileUnusable(f"{path}: valid_until_ms is {valid_until_ms!r}, not an integer or null")
    lock, state = content.get("lock"), content.get("state")
    if not is_leader:
        holder = content.get("holder")
        held_by = f", held by {holder!r}" if isinstance(holder, str) else ""
        return LeaderFileVerdict(False, f"not leading: lock {lock!r} in state {state!r}{held_by}")
    if valid_until_ms is None:
        raise LeaderFileUnusable(f"{path}: is_leader is true without valid_until_ms: not a leader file")
    now_ms = round(wall_now_s * 1000)
    if valid_until_ms <= now_ms:
        ago_s = (now_ms - valid_until_ms) / 1000
        return LeaderFileVerdict(
            False,
            f"not leading: lock {lock!r}: the lease's validity ended {ago_s:.3f}s ago and was never "
            f"renewed (the daemon of {content.get('identity')!r} died, hangs, or cannot write the file)",
        )
    left_s = (valid_until_ms - now_ms) / 1000
    token = content.get("fencing_token")
    return LeaderFileVerdict(True, f"leading: lock {lock!r}, fencing token {token}, valid for {left_s:.3f}s")
