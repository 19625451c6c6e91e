"""`--leader-file PATH`: the election's state as a JSON file, for sidecars on a shared volume.

A consumer that cannot call the HTTP endpoint (a batch job, a shell script, another container
sharing an emptyDir) reads one small file instead:

    {"lock":"jobs","identity":"pod-a","is_leader":true,"fencing_token":1795296567927,
     "valid_until_ms":1767268803123,"holder":"pod-a","holder_fencing_token":1795296567927,
     "state":"leader","updated_at":"2026-01-01T12:00:00.123Z"}

followed by a newline. `fencing_token` is ours while leading, else null; `valid_until_ms` is the
wall-clock time (Unix epoch, milliseconds) at which this replica stops believing it leads unless a
renewal extends it (null while not leading); `holder` and `holder_fencing_token` describe the
holder as last observed (null when unknown or free); `updated_at` is the wall-clock time (RFC
3339, UTC) the content last changed.

`is_leader: true` alone is not enough to act on: a daemon killed by SIGKILL (or OOM-killed, or
frozen) never writes "not leading", and its file would claim the lead while another replica holds
the lease. Only `is_leader` AND `valid_until_ms` still in the future mean "leading now": that is
what `elector leader-file check PATH` (daemon/leader_file_check.py) tests. The validity end is before the
lease can expire on Redis (it is the daemon's own validity, minus the safety margin), so a
successor can never be granted the lease while the old file still passes the check. Both
containers read the same node's wall clock; a wall-clock step on the node shifts the check.

Design:

- Atomic replacement: the content goes to a temporary file in the same directory (same file
  system, so the rename is atomic), is flushed and fsynced, gets mode 0644 (readable by a
  sidecar running as another user, whatever the umask), and is renamed over PATH with
  `os.replace`. A reader sees the old file or the new one, never a partial one. Watchers see a
  new inode on every change (inotify: IN_MOVED_TO on the directory, not IN_MODIFY on the file).
  A symlink at PATH is replaced by the file itself, not followed.
- Written on transitions and at every renewal (the validity end moves), not on every cycle: a
  write whose content (all but `updated_at`) equals the last one written is skipped while PATH
  is still that file, so callers may call `write` after every cycle. A leader therefore costs one
  write (a thread hop, an fsync of the file and of its directory) per renewal per lock: every
  3 s at the default 10 s ttl; on a memory-backed emptyDir (tmpfs) the fsyncs are free.
- A failing disk never stops the election: `write` catches OSError, removes its temporary file,
  logs an error once per distinct error (not once per cycle) and returns False; the next call
  tries again. Leadership is decided by the lease, not by this file.
- The file is not deleted at shutdown (a consumer may be watching it): `mark_stopped` writes
  `is_leader: false` and state "stopped".
- Plain values in, no election types: this module stays a thin adapter the app wires to the
  election's transitions.

`write` is synchronous and does disk I/O (fsync): from async code, call it in a thread and await
each call before the next, so that writes land in order.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

FILE_MODE = 0o644
STOPPED_STATE = "stopped"
#: How long a leadership hook waits for the leader file (to show a new term, or "not leading"
#: before the work is stopped) before going on without it, seconds. A step-down spends it before
#: the work stops, so it is part of the safety margin when a leader file is kept (settings.py).
LEADER_FILE_WAIT_S = 0.1


class LeaderFileError(Exception):
    """The leader file's path cannot be used; raised at start-up only."""


def check_leader_file_path(path: Path) -> None:
    """Fail fast, with a message naming the problem, if `path` cannot hold the leader file.

    Checks that the parent directory exists and is a directory, that a file can be created in
    it (by creating and removing one: permission bits, read-only mounts and ACLs all count, and
    root bypasses the bits), and that `path` itself is not a directory.
    """
    parent = path.parent
    if not parent.exists():
        raise LeaderFileError(f"leader file {str(path)!r}: its directory {str(parent)!r} does not exist")
    if not parent.is_dir():
        raise LeaderFileError(f"leader file {str(path)!r}: {str(parent)!r} is not a directory")
    if path.is_dir():
        raise LeaderFileError(f"leader file {str(path)!r} is a directory; give the path of a file in it")
    try:
        fd, probe = tempfile.mkstemp(dir=parent, prefix=f".{path.name}.", suffix=".check")
    except OSError as exc:
        raise LeaderFileError(
            f"leader file {str(path)!r}: cannot create files in {str(parent)!r}: {exc.strerror or exc}"
        ) from exc
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)


def _rfc3339(epoch_s: float) -> str:
    stamp = datetime.fromtimestamp(epoch_s, tz=UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def _file_id(stat: os.stat_result) -> tuple[int, ...]:
    # A rename keeps all four; a replacement changes the inode, an edit in place the mtime or size.
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)


def _error_key(exc: OSError) -> tuple[str, int | None, str | None]:
    # Not str(exc): it names the random temporary file, which would make every error "new".
    return (type(exc).__name__, exc.errno, exc.strerror)


class LeaderFileWriter:
    """Keeps the leader file of one election up to date. Thread-safe; never raises OSError."""

    def __init__(
        self,
        path: Path,
        *,
        lock: str,
        identity: str,
        logger: logging.Logger | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._path = Path(path)
        self._lock_name = lock
        self._identity = identity
        self._log = logging.getLogger(__name__) if logger is None else logger
        self._wall_clock = wall_clock
        self._mutex = threading.Lock()
        #: The last content written (without updated_at) and the `_file_id` of the file it went to.
        self._written: tuple[dict[str, object], tuple[int, ...]] | None = None
        self._errors_logged: set[tuple[str, int | None, str | None]] = set()

    @property
    def path(self) -> Path:
        return self._path

    def write(
        self,
        *,
        is_leader: bool,
        fencing_token: int | None,
        holder: str | None,
        holder_fencing_token: int | None,
        state: str,
        valid_until_ms: int | None = None,
    ) -> bool:
        """Make the file show this state. True when it does (written, or already so).

        False when the write failed (logged; the file keeps its previous content). ValueError
        for a fencing token or a validity end given while not leading, or a leader without a
        validity end: that is a bug in the caller.
        """
        if not is_leader and (fencing_token is not None or valid_until_ms is not None):
            raise ValueError(
                "fencing_token and valid_until_ms are ours only while leading: pass None when not leading"
            )
        if is_leader and valid_until_ms is None:
            raise ValueError("a leader's file needs valid_until_ms, or a dead daemon's file would say leader")
        content: dict[str, object] = {
            "lock": self._lock_name,
            "identity": self._identity,
            "is_leader": is_leader,
            "fencing_token": fencing_token,
            "valid_until_ms": valid_until_ms,
            "holder": holder,
            "holder_fencing_token": holder_fencing_token,
            "state": state,
        }
        with self._mutex:
            if self._unchanged(content):
                return True
            data = json.dumps({**content, "updated_at": _rfc3339(self._wall_clock())}) + "\n"
            try:
                file_id = self._replace(data.encode())
            except OSError as exc:
                self._written = None  # unknown now: the next call must write, even the same content
                self._report(exc)
                return False
            self._written = (content, file_id)
            if self._errors_logged:
                self._errors_logged.clear()
                self._log.info("leader_file_recovered", extra={"path": str(self._path)})
            return True

    def mark_stopped(self) -> bool:
        """At shutdown: not leading, holder unknown, state "stopped". The file is kept."""
        return self.write(
            is_leader=False, fencing_token=None, holder=None, holder_fencing_token=None, state=STOPPED_STATE
        )

    def _unchanged(self, content: dict[str, object]) -> bool:
        if self._written is None or self._written[0] != content:
            return False
        # Someone may have deleted, replaced or edited the file since: then write it again.
        try:
            return _file_id(os.stat(self._path)) == self._written[1]
        except OSError:
            return False

    def _replace(self, data: bytes) -> tuple[int, ...]:
        """Write `data` to a temporary file and rename it over the path; the file's `_file_id`."""
        directory = self._path.parent
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{self._path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as file:
                os.fchmod(file.fileno(), FILE_MODE)  # mkstemp creates 0600
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
                file_id = _file_id(os.fstat(file.fileno()))
            os.replace(tmp, self._path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self._fsync_directory(directory)
        return file_id

    @staticmethod
    def _fsync_directory(directory: Path) -> None:
        # Makes the rename itself durable across a crash of the node. Readers already see the new
        # file, so a file system that cannot fsync a directory is no reason to report a failure.
        with contextlib.suppress(OSError):
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def _report(self, exc: OSError) -> None:
        key = _error_key(exc)
        if key in self._errors_logged:
            return
        self._errors_logged.add(key)
        self._log.error(
            "leader_file_write_failed",
            extra={"path": str(self._path), "error": f"{type(exc).__name__}: {exc}"},
        )
