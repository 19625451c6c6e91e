"""The leader file (`elector.daemon.leader_file`): atomic, skip-if-unchanged, never raising on disk errors."""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import sys
import threading
from pathlib import Path

import pytest

from elector.daemon.leader_file import LeaderFileError, LeaderFileWriter, check_leader_file_path
from elector.daemon.leader_file_check import LeaderFileUnusable, check_leader_file

T = 1_795_296_567_927
NOW_S = 1_767_268_800.123  # 2026-01-01T12:00:00.123Z
VALID_UNTIL_MS = 1_767_268_803_123  # 3 s after NOW_S

LEADING = {
    "is_leader": True,
    "fencing_token": T,
    "valid_until_ms": VALID_UNTIL_MS,
    "holder": "pod-a",
    "holder_fencing_token": T,
    "state": "leader",
}
FOLLOWING = {
    "is_leader": False,
    "fencing_token": None,
    "holder": "pod-b",
    "holder_fencing_token": T + 1,
    "state": "follower",
}


@pytest.fixture
def logger() -> logging.Logger:
    return logging.getLogger("tests.leader_file")


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "leader.json"


def make_writer(path: Path, logger: logging.Logger, *, now_s: float = NOW_S) -> LeaderFileWriter:
    return LeaderFileWriter(path, lock="jobs", identity="pod-a", logger=logger, wall_clock=lambda: now_s)


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


def test_content_mode_and_trailing_newline(path, logger) -> None:
    assert make_writer(path, logger).write(**LEADING)
    text = path.read_text()
    assert text.endswith("}\n") and text.count("\n") == 1
    assert json.loads(text) == {
        "lock": "jobs",
        "identity": "pod-a",
        "is_leader": True,
        "fencing_token": T,
        "valid_until_ms": VALID_UNTIL_MS,
        "holder": "pod-a",
        "holder_fencing_token": T,
        "state": "leader",
        "updated_at": "2026-01-01T12:00:00.123Z",
    }
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert leftovers(path.parent) == []


def test_the_mode_is_0644_whatever_the_umask(path, logger) -> None:
    old = os.umask(0o077)
    try:
        make_writer(path, logger).write(**FOLLOWING)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_identical_content_is_not_rewritten(path, logger) -> None:
    clock = [NOW_S]
    writer = LeaderFileWriter(path, lock="jobs", identity="pod-a", logger=logger, wall_clock=lambda: clock[0])
    assert writer.write(**LEADING)
    before = path.stat()
    clock[0] += 5
    assert writer.write(**LEADING)
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert json.loads(path.read_text())["updated_at"] == "2026-01-01T12:00:00.123Z"

    assert writer.write(**FOLLOWING)
    assert path.stat().st_ino != before.st_ino
    assert json.loads(path.read_text())["updated_at"] == "2026-01-01T12:00:05.123Z"


def test_a_file_removed_behind_our_back_is_written_again(path, logger) -> None:
    writer = make_writer(path, logger)
    assert writer.write(**LEADING)
    path.unlink()
    assert writer.write(**LEADING)
    assert json.loads(path.read_text())["is_leader"] is True
    path.write_text("tampered\n")  # edited in place: same inode, new mtime and size
    assert writer.write(**LEADING)
    assert json.loads(path.read_text())["state"] == "leader"


def test_readers_never_see_a_partial_file(path, logger) -> None:
    writer = make_writer(path, logger)
    writer.write(**FOLLOWING)
    expected = {"leader", "follower"}
    stop = threading.Event()
    reads: list[int] = [0]
    failures: list[str] = []

    def reader() -> None:
        while not stop.is_set():
            text = path.read_text()  # the path always exists: replaced, never removed
            try:
                state = json.loads(text)["state"]
            except (ValueError, KeyError):
                failures.append(text)
                continue
            if state not in expected or not text.endswith("\n"):
                failures.append(text)
            reads[0] += 1

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for n in range(400):
            # Different content each time, so that every call replaces the file.
            assert writer.write(**(LEADING if n % 2 else FOLLOWING))
    finally:
        stop.set()
        thread.join()
    assert failures == []
    assert reads[0] > 0
    assert leftovers(path.parent) == []


def test_mark_stopped_keeps_the_file_and_says_not_leading(path, logger) -> None:
    writer = make_writer(path, logger)
    writer.write(**LEADING)
    assert writer.mark_stopped()
    content = json.loads(path.read_text())
    assert content["is_leader"] is False and content["fencing_token"] is None
    assert content["state"] == "stopped" and content["holder"] is None
    assert content["lock"] == "jobs" and content["identity"] == "pod-a"


def test_a_fencing_token_while_not_leading_is_a_caller_bug(path, logger) -> None:
    with pytest.raises(ValueError, match="only while leading"):
        make_writer(path, logger).write(**{**FOLLOWING, "fencing_token": T})
    assert not path.exists()


def test_write_failures_return_false_and_log_once_per_distinct_error(tmp_path, logger, caplog) -> None:
    directory = tmp_path / "shared"
    directory.mkdir()
    path = directory / "leader.json"
    writer = make_writer(path, logger)
    caplog.set_level(logging.INFO, logger=logger.name)

    shutil.rmtree(directory)  # the volume went away
    assert writer.write(**LEADING) is False
    assert writer.write(**LEADING) is False
    assert writer.write(**FOLLOWING) is False
    failures = [r for r in caplog.records if r.getMessage() == "leader_file_write_failed"]
    assert len(failures) == 1
    assert failures[0].levelno == logging.ERROR
    assert failures[0].path == str(path) and "FileNotFoundError" in failures[0].error  # type: ignore[attr-defined]

    # A different error is logged too.
    directory.mkdir()
    path.mkdir()  # os.replace cannot put a file over a directory
    assert writer.write(**LEADING) is False
    failures = [r for r in caplog.records if r.getMessage() == "leader_file_write_failed"]
    assert len(failures) == 2 and "IsADirectoryError" in failures[1].error  # type: ignore[attr-defined]
    assert leftovers(directory) == []  # the temporary file was removed

    # Recovery is logged, and the same content is written although the last attempt had it.
    path.rmdir()
    assert writer.write(**LEADING) is True
    assert json.loads(path.read_text())["state"] == "leader"
    assert [r.getMessage() for r in caplog.records].count("leader_file_recovered") == 1

    # After a recovery, a recurring error is news again.
    shutil.rmtree(directory)
    assert writer.write(**FOLLOWING) is False
    failures = [r for r in caplog.records if r.getMessage() == "leader_file_write_failed"]
    assert len(failures) == 3


def test_a_failing_fsync_removes_the_temporary_file(path, logger, monkeypatch) -> None:
    writer = make_writer(path, logger)
    writer.write(**FOLLOWING)

    def no_space(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    assert writer.write(**LEADING) is False
    monkeypatch.undo()
    assert leftovers(path.parent) == []
    assert json.loads(path.read_text())["state"] == "follower"  # the old content is intact


def test_check_accepts_a_new_or_existing_file(tmp_path) -> None:
    check_leader_file_path(tmp_path / "leader.json")
    (tmp_path / "existing.json").write_text("{}\n")
    check_leader_file_path(tmp_path / "existing.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing.json"]  # the probe is gone


def test_check_refuses_a_missing_directory(tmp_path) -> None:
    with pytest.raises(LeaderFileError, match="does not exist"):
        check_leader_file_path(tmp_path / "missing" / "leader.json")


def test_check_refuses_a_parent_that_is_a_file(tmp_path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(LeaderFileError, match="is not a directory"):
        check_leader_file_path(tmp_path / "file" / "leader.json")


def test_check_refuses_a_path_that_is_a_directory(tmp_path) -> None:
    with pytest.raises(LeaderFileError, match="is a directory; give the path of a file"):
        check_leader_file_path(tmp_path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to read-only directories")
def test_check_refuses_a_read_only_directory(tmp_path) -> None:
    directory = tmp_path / "ro"
    directory.mkdir(mode=0o555)
    try:
        with pytest.raises(LeaderFileError, match=r"cannot create files in .*Permission denied"):
            check_leader_file_path(directory / "leader.json")
    finally:
        directory.chmod(0o755)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc")
def test_check_refuses_a_directory_where_not_even_root_can_create_files() -> None:
    with pytest.raises(LeaderFileError, match="cannot create files in '/proc'"):
        check_leader_file_path(Path("/proc/leader.json"))


def test_a_new_validity_end_is_news_and_is_written(path, logger) -> None:
    writer = make_writer(path, logger)
    assert writer.write(**LEADING)
    before = path.stat()
    assert writer.write(**{**LEADING, "valid_until_ms": VALID_UNTIL_MS + 900})  # a renewal
    assert path.stat().st_ino != before.st_ino
    assert json.loads(path.read_text())["valid_until_ms"] == VALID_UNTIL_MS + 900


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"valid_until_ms": None}, "needs valid_until_ms"),
        ({"is_leader": False, "fencing_token": None}, "only while leading"),
    ],
)
def test_a_leader_without_a_validity_end_or_a_follower_with_one_is_a_caller_bug(
    path, logger, change: dict[str, object], problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        make_writer(path, logger).write(**{**LEADING, **change})
    assert not path.exists()


# --- check_leader_file: what `elector leader-file check` decides -------------------------------


def test_check_says_leading_only_before_the_validity_end(path, logger) -> None:
    make_writer(path, logger).write(**LEADING)
    verdict = check_leader_file(path, wall_now_s=VALID_UNTIL_MS / 1000 - 0.5)
    assert verdict.leading and "valid for 0.500s" in verdict.reason and str(T) in verdict.reason
    for now_s in (VALID_UNTIL_MS / 1000, VALID_UNTIL_MS / 1000 + 60):
        verdict = check_leader_file(path, wall_now_s=now_s)
        assert not verdict.leading and "validity ended" in verdict.reason and "pod-a" in verdict.reason
        assert "\n" not in verdict.reason


def test_check_says_not_leading_for_a_follower_or_a_stopped_daemon(path, logger) -> None:
    writer = make_writer(path, logger)
    writer.write(**FOLLOWING)
    verdict = check_leader_file(path, wall_now_s=NOW_S)
    assert not verdict.leading and "'follower'" in verdict.reason and "pod-b" in verdict.reason
    writer.mark_stopped()
    verdict = check_leader_file(path, wall_now_s=NOW_S)
    assert not verdict.leading and "'stopped'" in verdict.reason


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"", "not JSON"),
        (b'{"is_leader": tru', "not JSON"),
        (b"[true]", "not a JSON object"),
        (b'{"is_leader": "yes", "valid_until_ms": null}', "is_leader is 'yes'"),
        (b'{"is_leader": true, "fencing_token": 1}', "without valid_until_ms"),  # an older elector
        (b'{"is_leader": true, "valid_until_ms": "soon"}', "not an integer"),
        (b'{"is_leader": true, "valid_until_ms": true}', "not an integer"),
        (b'{"is_leader": true, "valid_until_ms": 1.5e12}', "not an integer"),
        (b'{"is_leader": true, "valid_until_ms": null}', "without valid_until_ms"),
        (b" " * 70_000, "over 65536 bytes"),
    ],
)
def test_check_refuses_what_is_not_a_leader_file(path, content: bytes, problem: str) -> None:
    path.write_bytes(content)
    with pytest.raises(LeaderFileUnusable, match=problem):
        check_leader_file(path, wall_now_s=NOW_S)


def test_check_refuses_a_missing_file_or_a_directory(tmp_path) -> None:
    with pytest.raises(LeaderFileUnusable, match="no such file"):
        check_leader_file(tmp_path / "absent.json")
    with pytest.raises(LeaderFileUnusable, match="cannot read"):
        check_leader_file(tmp_path)
