"""The daemon's settings, grouped by the part they configure, and their validation.

Each group is owned by its layer (RedisSettings by the backend, ElectionTiming by the election,
HttpSettings and LogSettings by their adapters); this module only assembles and checks them, so
that every bad value is reported up front with the setting's name.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import os
import re
import socket
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path

from elector.backend import InvalidRedisSettingsError, RedisSettings, redact_url
from elector.backend.redis_lease import MAX_IDENTITY_LENGTH
from elector.daemon.execmode.supervisor import stop_budget_s
from elector.daemon.http import HttpSettings, parse_http_address
from elector.daemon.logs import LogSettings
from elector.election import ElectionTiming, InvalidTimingError

#: Lock names become part of Redis keys inside a {hash tag}: no braces, no blanks, no control chars.
LOCK_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@-]{0,199}$")

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?|\.\d+)(ms|us|µs|s|m|h)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6, "µs": 1e-6}
#: Longest duration any option takes: beyond it a value is a typo, and far larger ones overflow
#: timers and Redis' millisecond expiries (PX) at run time instead of failing at start-up.
MAX_DURATION_S = 7 * 24 * 3600.0
#: Longest lease ttl: a leader that may vanish for more than a day without anyone taking over
#: is a misconfiguration, and the scripts' arithmetic (3 x ttl for candidates) must stay exact.
MAX_TTL_S = 24 * 3600.0


class SettingsError(ValueError):
    """A setting is invalid. `setting` names it as the user wrote it (e.g. `--ttl`)."""

    def __init__(self, setting: str, message: str) -> None:
        super().__init__(f"{setting}: {message}")
        self.setting = setting


#: Longest --shutdown-linger: longer than any sane scrape interval, short of a stuck rollout.
MAX_SHUTDOWN_LINGER_S = 300.0


def parse_duration(text: str) -> float:
    """Seconds from a Go-style duration: `10s`, `500ms`, `1m`, `1m30s`, `1.5s`.

    A bare number is refused (except 0): `10` could mean seconds or milliseconds.
    """
    cleaned = text.strip().replace(" ", "")
    if re.fullmatch(r"0+(\.0*)?", cleaned):
        return 0.0
    if not cleaned:
        raise ValueError("empty duration; write e.g. 10s or 500ms")
    if re.fullmatch(r"\d+(\.\d+)?", cleaned):
        raise ValueError(f"{text!r} has no unit; write e.g. {cleaned}s or {cleaned}ms")
    position, total = 0, 0.0
    for match in _DURATION_PART.finditer(cleaned):
        if match.start() != position:
            break
        total += float(match.group(1)) * _UNIT_S[match.group(2)]
        position = match.end()
    if position != len(cleaned):
        raise ValueError(f"{text!r} is not a duration; write e.g. 10s, 500ms, 1m or 1m30s")
    if not total <= MAX_DURATION_S:  # also catches inf from absurdly many digits
        raise ValueError(f"{text!r} is too long: at most {MAX_DURATION_S / 86400:g} days")
    return total


def validate_lock_name(name: str) -> str:
    if not LOCK_NAME_PATTERN.fullmatch(name):
        raise SettingsError(
            "--lock",
            f"{name!r} is not a valid lock name: 1-200 characters, letters, digits and . _ : / @ -, "
            "starting with a letter or digit",
        )
    return name


def validate_identity(identity: str) -> str:
    if not identity or len(identity) > MAX_IDENTITY_LENGTH:
        raise SettingsError("--identity", f"must be 1-{MAX_IDENTITY_LENGTH} characters, got {len(identity)}")
    if not identity.isprintable() or identity != identity.strip():
        raise SettingsError("--identity", f"{identity!r} has control characters or surrounding blanks")
    return identity


#: A host in a redis:// URL: a DNS name (underscores allowed: compose service names) or IPv4.
_URL_HOST = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,251}[A-Za-z0-9_])?\.?")
_URL_DB_PATH = re.compile(r"/?|/\d{1,5}")


def check_redis_url(url: str, *, setting: str = "--redis-url") -> None:
    """Refuse what redis-py would accept silently and then never reach, or reach wrongly.

    redis-py reads `/abc` or `/-1` as database 0 or fails every request with it, takes port 0
    for 6379, and keeps the first of repeated query options; none of that should survive
    start-up. Schemes other than redis, rediss and unix, and anything unparsable, are left to
    `RedisSettings.validate`, which reports them.
    """

    def refuse(message: str) -> SettingsError:
        return SettingsError(setting, f"{message}: {redact_url(url)}")

    if any(not char.isprintable() for char in url):
        # urlsplit drops tabs and newlines without a word: "redis://h\n:6379" would become h:6379.
        raise SettingsError(setting, "the redis URL contains control characters (a stray newline?)")
    try:
        parsed = urllib.parse.urlsplit(url)
        port = parsed.port
    except ValueError:
        return
    if parsed.scheme not in ("redis", "rediss", "unix"):
        return
    options = [name for name, _ in urllib.parse.parse_qsl(parsed.query, keep_blank_values=True)]
    repeated = sorted({name for name in options if options.count(name) > 1})
    if repeated:
        raise refuse(f"the redis URL gives the option {repeated[0]!r} more than once")
    if parsed.scheme == "unix":
        return
    if port == 0:
        raise refuse("the redis URL has port 0; give the server's port (default 6379)")
    host = parsed.hostname or ""
    if host and ":" not in host and not _URL_HOST.fullmatch(host):
        raise refuse(f"the redis URL has an invalid host {host!r}")
    if not _URL_DB_PATH.fullmatch(parsed.path):
        raise refuse("the redis URL's path must be a database number, e.g. /0")
    if parsed.path.strip("/") and "db" in options:
        raise refuse("the redis URL gives the database twice (path and ?db=)")


def default_identity(environ: Mapping[str, str] | None = None) -> str:
    """`$POD_NAME` (set from the downward API in Kubernetes), else the host name."""
    env = os.environ if environ is None else environ
    return env.get("POD_NAME") or socket.gethostname()


#: Most locks one daemon may hold (each is an election of its own).
MAX_LOCKS = 10_000
#: Default SIGTERM-to-SIGKILL grace of the leader's command, as a share of the ttl.
DEFAULT_KILL_GRACE_SHARE = 0.2
#: A kill grace shorter than this cannot let any real program exit cleanly.
MIN_USEFUL_KILL_GRACE_S = 0.05
LEADER_FILE_LOCK_PLACEHOLDER = "{lock}"
#: How long a step-down waits for the leader file to say "not leading" before stopping the
#: work; part of the safety margin when a leader file is kept, seconds.
LEADER_FILE_WAIT_S = 0.1


class ChildExitPolicy(enum.StrEnum):
    """What to do when the leader's command exits by itself while we lead."""

    #: Step down and release, stand back for a back-off, then contend again (the default: a
    #: command that keeps failing here gets a chance on another replica).
    RELEASE = "release"
    #: Keep leading and start the command again after a back-off.
    RESTART = "restart"
    #: Release and exit with the command's exit code (128 + N when a signal N killed it).
    EXIT = "exit"


@dataclasses.dataclass(frozen=True, slots=True)
class ExecSettings:
    """Exec mode: the command run only while this replica leads."""

    command: tuple[str, ...]
    #: SIGTERM to SIGKILL grace, seconds; part of the safety margin (see ElectionTiming).
    kill_grace_s: float
    on_child_exit: ChildExitPolicy = ChildExitPolicy.RELEASE


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    """Everything `elector run` needs, validated."""

    locks: tuple[str, ...]
    identity: str
    redis: RedisSettings
    timing: ElectionTiming
    http: HttpSettings
    logs: LogSettings
    #: Exit (code 3) after losing leadership instead of contending again.
    exit_on_loss: bool = False
    #: After a graceful shutdown, how long HTTP keeps serving (final scrapes), seconds.
    shutdown_linger_s: float = 0.0
    #: Higher wins: a leader yields to a live candidate with a higher priority.
    priority: int = 0
    #: Where to keep the current state for sidecars; `{lock}` is replaced by the lock's name.
    leader_file: str | None = None
    exec: ExecSettings | None = None

    @property
    def lock(self) -> str:
        """The first (in exec mode: the only) lock."""
        return self.locks[0]

    def leader_file_for(self, lock: str) -> Path | None:
        if self.leader_file is None:
            return None
        # Lock names may hold "/", which must not turn into directories.
        return Path(self.leader_file.replace(LEADER_FILE_LOCK_PLACEHOLDER, lock.replace("/", "_")))


def read_locks_file(path: Path) -> list[str]:
    """Lock names from a file: one per line; blank lines and `#` comments are skipped."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError("--locks-file", f"cannot read {str(path)!r}: {exc}") from None
    names = []
    for number, line in enumerate(text.splitlines(), start=1):
        name = line.split("#", 1)[0].strip()
        if not name:
            continue
        try:
            names.append(validate_lock_name(name))
        except SettingsError as exc:
            raise SettingsError("--locks-file", f"{path}:{number}: {exc}") from None
    return names


def _collect_locks(lock: str | Sequence[str], locks_file: Path | None) -> tuple[str, ...]:
    names = [lock] if isinstance(lock, str) else list(lock)
    for name in names:
        validate_lock_name(name)
    if locks_file is not None:
        names.extend(read_locks_file(locks_file))
    if not names:
        raise SettingsError("--lock", "give at least one lock name (--lock NAME or --locks-file PATH)")
    duplicates = sorted(name for name, count in collections.Counter(names).items() if count > 1)
    if duplicates:
        raise SettingsError("--lock", f"lock {duplicates[0]!r} is given more than once")
    if len(names) > MAX_LOCKS:
        raise SettingsError("--lock", f"{len(names)} locks; one daemon holds at most {MAX_LOCKS}")
    return tuple(names)


def _kill_grace(
    kill_grace_s: float | None, *, ttl_s: float, renew_deadline_s: float | None, other_stop_work_s: float
) -> float:
    """The kill grace, checked against the time left between the renew deadline and the expiry.

    The leader's command must be gone before the lease can expire on Redis, so the grace plus
    the reap slack must fit in `ttl - renew deadline - safety margin`.
    """
    deadline_s = ttl_s * 2 / 3 if renew_deadline_s is None else renew_deadline_s
    probe = ElectionTiming(
        ttl_s=ttl_s, renew_interval_s=deadline_s / 2, renew_deadline_s=deadline_s, request_timeout_s=0.001
    )
    room_s = ttl_s - deadline_s - probe.safety_margin_s - stop_budget_s(0.0) - other_stop_work_s
    if kill_grace_s is None:
        if room_s >= MIN_USEFUL_KILL_GRACE_S:
            return min(ttl_s * DEFAULT_KILL_GRACE_SHARE, room_s)
        kill_grace_s = ttl_s * DEFAULT_KILL_GRACE_SHARE
    if kill_grace_s < 0:
        raise SettingsError("--kill-grace", f"must not be negative, got {kill_grace_s * 1000:g}ms")
    if kill_grace_s > room_s:
        raise SettingsError(
            "--kill-grace",
            f"a kill grace of {kill_grace_s * 1000:g}ms does not fit: the command must be gone before "
            f"the lease can expire, and with --ttl {ttl_s * 1000:g}ms and a renew deadline of "
            f"{deadline_s * 1000:g}ms at most {max(0.0, room_s) * 1000:.0f}ms are left (ttl - renew "
            "deadline - 1% of ttl - 5ms - time to reap and to update the leader file); shorten "
            "--kill-grace, lengthen --ttl or shorten --renew-deadline",
        )
    return kill_grace_s


def _check_leader_file(template: str, locks: Sequence[str]) -> None:
    from elector.daemon.leader_file import LeaderFileError, check_leader_file_path

    if len(locks) > 1 and LEADER_FILE_LOCK_PLACEHOLDER not in template:
        raise SettingsError(
            "--leader-file",
            "with several locks the path must contain {lock} (replaced by each lock's name)",
        )
    for lock in locks:
        path = Path(template.replace(LEADER_FILE_LOCK_PLACEHOLDER, lock.replace("/", "_")))
        try:
            check_leader_file_path(path)
        except LeaderFileError as exc:
            raise SettingsError("--leader-file", str(exc)) from None


def build_settings(
    *,
    lock: str | Sequence[str],
    identity: str | None,
    redis_url: str,
    redis_password_file: Path | None = None,
    redis_tls_ca_file: Path | None = None,
    redis_tls_cert_file: Path | None = None,
    redis_tls_key_file: Path | None = None,
    min_replicas_ack: int = 0,
    replicas_ack_timeout_s: float | None = None,
    redis_cluster: bool = False,
    redlock_urls: Sequence[str] = (),
    ttl_s: float = 10.0,
    renew_interval_s: float | None = None,
    renew_deadline_s: float | None = None,
    request_timeout_s: float | None = None,
    http_address: str = "0.0.0.0:8080",
    log_format: str = "auto",
    log_level: str = "info",
    exit_on_loss: bool = False,
    locks_file: Path | None = None,
    priority: int = 0,
    leader_file: str | None = None,
    command: Sequence[str] = (),
    kill_grace_s: float | None = None,
    on_child_exit: str = "release",
    shutdown_linger_s: float = 0.0,
) -> Settings:
    """Assemble and check every setting; raises SettingsError naming the first bad one."""
    locks = _collect_locks(lock, locks_file)
    identity = validate_identity(identity if identity is not None else default_identity())
    exec_settings = None
    if command:
        if len(locks) > 1:
            raise SettingsError(
                "--lock",
                f"exec mode runs one command under one lock, but {len(locks)} locks were given; "
                "run one daemon per lock, or drop the command to hold several locks",
            )
        try:
            policy = ChildExitPolicy(on_child_exit)
        except ValueError:
            choices = ", ".join(p.value for p in ChildExitPolicy)
            raise SettingsError("--on-child-exit", f"{on_child_exit!r} is not one of {choices}") from None
        exec_settings = ExecSettings(
            command=tuple(command),
            kill_grace_s=_kill_grace(
                kill_grace_s,
                ttl_s=ttl_s,
                renew_deadline_s=renew_deadline_s,
                other_stop_work_s=0.0 if leader_file is None else LEADER_FILE_WAIT_S,
            ),
            on_child_exit=policy,
        )
    elif kill_grace_s is not None:
        raise SettingsError("--kill-grace", "only applies to exec mode (elector run ... -- COMMAND)")
    if not -(10**6) <= priority <= 10**6:
        raise SettingsError("--priority", f"must be between -1000000 and 1000000, got {priority}")
    if leader_file is not None:
        _check_leader_file(leader_file, locks)
    if ttl_s > MAX_TTL_S:
        raise SettingsError("--ttl", f"ttl must be at most {MAX_TTL_S / 3600:g}h, got {ttl_s:g}s")
    for url in redlock_urls or (redis_url,):
        check_redis_url(url, setting="--redlock-url" if redlock_urls else "--redis-url")
    if redlock_urls and priority != 0:
        # Preemption releases *to* a rival through a handoff key, which Redlock does not carry.
        raise SettingsError(
            "--priority", "preferred leaders and handoffs are not supported with --redlock-url"
        )
    stop_work_s = 0.0 if exec_settings is None else stop_budget_s(exec_settings.kill_grace_s)
    if leader_file is not None:
        stop_work_s += LEADER_FILE_WAIT_S
    try:
        timing = ElectionTiming.from_ttl(
            ttl_s,
            renew_interval_s=renew_interval_s,
            renew_deadline_s=renew_deadline_s,
            request_timeout_s=request_timeout_s,
            stop_work_s=stop_work_s,
        )
    except InvalidTimingError as exc:
        flag_of = {"stop_work": "kill_grace"}
        flags = ", ".join(f"--{flag_of.get(name, name).replace('_', '-')}" for name in exc.settings)
        raise SettingsError(flags, str(exc)) from None
    redis_settings = RedisSettings(
        url=redis_url,
        password_file=redis_password_file,
        request_timeout_s=timing.request_timeout_s,
        tls_ca_file=redis_tls_ca_file,
        tls_cert_file=redis_tls_cert_file,
        tls_key_file=redis_tls_key_file,
        min_replicas_ack=min_replicas_ack,
        replicas_ack_timeout_s=replicas_ack_timeout_s,
        cluster=redis_cluster,
        redlock_urls=tuple(redlock_urls),
    )
    try:
        redis_settings.validate()
    except InvalidRedisSettingsError as exc:
        flag = {
            "password_file": "--redis-password-file",
            "request_timeout": "--request-timeout",
            "tls_ca": "--redis-tls-ca",
            "tls_cert": "--redis-tls-cert",
            "tls_key": "--redis-tls-key",
            "min_replicas_ack": "--min-replicas-ack",
            "replicas_ack_timeout": "--replicas-ack-timeout",
            "cluster": "--redis-cluster",
            "redlock_url": "--redlock-url",
        }
        raise SettingsError(flag.get(exc.setting, "--redis-url"), str(exc)) from None
    try:
        http = parse_http_address(http_address)
    except ValueError as exc:
        raise SettingsError("--http-address", str(exc)) from None
    try:
        logs = LogSettings(format=log_format, level=log_level)  # type: ignore[arg-type]
    except ValueError as exc:
        raise SettingsError("--log-format/--log-level", str(exc)) from None
    if not 0 <= shutdown_linger_s <= MAX_SHUTDOWN_LINGER_S:
        raise SettingsError(
            "--shutdown-linger",
            f"must be between 0s and {MAX_SHUTDOWN_LINGER_S:g}s (a scrape interval), "
            f"got {shutdown_linger_s * 1000:g}ms",
        )
    return Settings(
        locks=locks,
        identity=identity,
        redis=redis_settings,
        timing=timing,
        http=http,
        logs=logs,
        exit_on_loss=exit_on_loss,
        shutdown_linger_s=shutdown_linger_s,
        priority=priority,
        leader_file=leader_file,
        exec=exec_settings,
    )
