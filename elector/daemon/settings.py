"""The daemon's settings, grouped by the part they configure, and their validation.

Each group is owned by its layer (RedisSettings by the backend, ElectionTiming by the election,
HttpSettings and LogSettings by their adapters) and the rules of lock names, identities,
priorities and ttls by the domain (`elector.lease`); this module only assembles and checks
them, so that every bad value is reported up front with the setting's name.

A setting's name is its keyword of `build_settings`, which is also its parameter of `elector run`
(declared once, in elector/cli/options.py); its flag is `flag_of(name)`. Errors of the parts
are translated into those names in one place, `invalid`.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import inspect
from collections.abc import Sequence
from pathlib import Path

from elector.backend import InvalidRedisSettingsError, RedisSettings
from elector.daemon.app_health import (
    MAX_FAILURES,
    MIN_INTERVAL_S,
    AppHealthSettings,
    parse_app_health_url,
)
from elector.daemon.execmode.supervisor import stop_budget_s
from elector.daemon.http import HttpSettings, parse_http_address
from elector.daemon.http_compat import COMPAT_APIS
from elector.daemon.leader_file import LEADER_FILE_WAIT_S, LeaderFileError, check_leader_file_path
from elector.daemon.logs import LOG_FORMATS, LogSettings
from elector.election import ElectionTiming, InvalidTimingError
from elector.lease import (
    InvalidValueError,
    check_identity,
    check_lock_name,
    check_priority,
    check_ttl,
    default_identity,
)
from elector.telemetry.metrics import METRICS_PER_LOCK_CHOICES, per_lock_metrics

#: Longest --shutdown-linger: longer than any sane scrape interval, short of a stuck rollout.
MAX_SHUTDOWN_LINGER_S = 300.0


def flag_of(name: str) -> str:
    """The command-line flag of the setting `name` (a keyword of `build_settings`)."""
    return "--" + name.replace("_", "-")


class SettingsError(ValueError):
    """A setting is invalid.

    `names` are the settings at fault as `build_settings` names them; `setting` is how the user
    wrote them, their flags (e.g. `--ttl`, or `--ttl, --renew-deadline`); `message` is the rest.
    """

    def __init__(self, names: str | Sequence[str], message: str) -> None:
        self.names = (names,) if isinstance(names, str) else tuple(names)
        self.setting = ", ".join(flag_of(name) for name in self.names)
        self.message = message
        super().__init__(f"{self.setting}: {message}")


def invalid(exc: InvalidValueError | InvalidRedisSettingsError | InvalidTimingError) -> SettingsError:
    """An error of the domain, the backend or the election, naming the settings at fault."""
    if isinstance(exc, InvalidTimingError):
        # The election's stop-work time is what the kill grace (plus the leader file's wait) adds up to.
        names = tuple("kill_grace" if name == "stop_work" else name for name in exc.settings)
    elif isinstance(exc, InvalidRedisSettingsError):
        # RedisSettings names its own fields: url, password_file, tls_ca, cluster are redis_url, ...
        names = (exc.setting if exc.setting in RUN_SETTINGS else f"redis_{exc.setting}",)
    else:
        names = (exc.setting,)
    return SettingsError(names, str(exc))


def validate_lock_name(name: str) -> str:
    """The domain's lock-name rule, its error naming --lock."""
    try:
        return check_lock_name(name)
    except InvalidValueError as exc:
        raise invalid(exc) from None


def validate_identity(identity: str) -> str:
    """The domain's identity rule, its error naming --identity."""
    try:
        return check_identity(identity)
    except InvalidValueError as exc:
        raise invalid(exc) from None


#: Most locks one daemon may hold (each is an election of its own).
MAX_LOCKS = 10_000
#: Default SIGTERM-to-SIGKILL grace of the leader's command, as a share of the ttl.
DEFAULT_KILL_GRACE_SHARE = 0.2
#: A kill grace shorter than this cannot let any real program exit cleanly.
MIN_USEFUL_KILL_GRACE_S = 0.05
LEADER_FILE_LOCK_PLACEHOLDER = "{lock}"


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
    #: The retired leader-elector sidecar's API (`GET /` -> {"name": holder}); None: off.
    compat_http: HttpSettings | None = None
    #: Whose API the compat listener speaks: leader-elector, or nais (`last_update`, `/sse`).
    compat_api: str = "leader-elector"
    #: --metrics-per-lock: auto, always or never (see `per_lock_metrics`).
    metrics_per_lock: str = "auto"
    #: --app-health-url and its timing: contend only while the app is healthy; None: off.
    app_health: AppHealthSettings | None = None
    #: The name the previous release gave the (one) lock: it leads only while holding both
    #: (daemon/predecessor.py). None: no rename under way.
    predecessor_lock: str | None = None

    @property
    def per_lock_metrics(self) -> bool:
        """Whether /metrics has series per lock, or aggregate ones (see elector/telemetry/metrics.py)."""
        return per_lock_metrics(self.metrics_per_lock, locks=len(self.locks))

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
        raise SettingsError("locks_file", f"cannot read {str(path)!r}: {exc}") from None
    names = []
    for number, line in enumerate(text.splitlines(), start=1):
        name = line.split("#", 1)[0].strip()
        if not name:
            continue
        try:
            names.append(check_lock_name(name))
        except InvalidValueError as exc:
            raise SettingsError("locks_file", f"{path}:{number}: {exc}") from None
    return names


def _collect_locks(lock: str | Sequence[str], locks_file: Path | None) -> tuple[str, ...]:
    names = [lock] if isinstance(lock, str) else list(lock)
    for name in names:
        check_lock_name(name)
    if locks_file is not None:
        names.extend(read_locks_file(locks_file))
    if not names:
        raise SettingsError("lock", "give at least one lock name (--lock NAME or --locks-file PATH)")
    duplicates = sorted(name for name, count in collections.Counter(names).items() if count > 1)
    if duplicates:
        raise SettingsError("lock", f"lock {duplicates[0]!r} is given more than once")
    if len(names) > MAX_LOCKS:
        raise SettingsError("lock", f"{len(names)} locks; one daemon holds at most {MAX_LOCKS}")
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
        raise SettingsError("kill_grace", f"must not be negative, got {kill_grace_s * 1000:g}ms")
    if kill_grace_s > room_s:
        raise SettingsError(
            "kill_grace",
            f"a kill grace of {kill_grace_s * 1000:g}ms does not fit: the command must be gone before "
            f"the lease can expire, and with --ttl {ttl_s * 1000:g}ms and a renew deadline of "
            f"{deadline_s * 1000:g}ms at most {max(0.0, room_s) * 1000:.0f}ms are left (ttl - renew "
            "deadline - 1% of ttl - 5ms - time to reap and to update the leader file); shorten "
            "--kill-grace, lengthen --ttl or shorten --renew-deadline",
        )
    return kill_grace_s


def _exec_settings(
    command: Sequence[str],
    *,
    locks: Sequence[str],
    on_child_exit: str,
    kill_grace: float | None,
    ttl: float,
    renew_deadline: float | None,
    leader_file: str | None,
) -> ExecSettings | None:
    if not command:
        if kill_grace is not None:
            raise SettingsError("kill_grace", "only applies to exec mode (elector run ... -- COMMAND)")
        return None
    if len(locks) > 1:
        raise SettingsError(
            "lock",
            f"exec mode runs one command under one lock, but {len(locks)} locks were given; "
            "run one daemon per lock, or drop the command to hold several locks",
        )
    try:
        policy = ChildExitPolicy(on_child_exit)
    except ValueError:
        choices = ", ".join(p.value for p in ChildExitPolicy)
        raise SettingsError("on_child_exit", f"{on_child_exit!r} is not one of {choices}") from None
    grace_s = _kill_grace(
        kill_grace,
        ttl_s=ttl,
        renew_deadline_s=renew_deadline,
        other_stop_work_s=0.0 if leader_file is None else LEADER_FILE_WAIT_S,
    )
    return ExecSettings(command=tuple(command), kill_grace_s=grace_s, on_child_exit=policy)


def _check_leader_file(template: str, locks: Sequence[str]) -> None:
    if len(locks) > 1 and LEADER_FILE_LOCK_PLACEHOLDER not in template:
        raise SettingsError(
            "leader_file",
            "with several locks the path must contain {lock} (replaced by each lock's name)",
        )
    for lock in locks:
        path = Path(template.replace(LEADER_FILE_LOCK_PLACEHOLDER, lock.replace("/", "_")))
        try:
            check_leader_file_path(path)
        except LeaderFileError as exc:
            raise SettingsError("leader_file", str(exc)) from None


def build_settings(
    *,
    lock: str | Sequence[str],
    identity: str | None,
    redis_url: str,
    redis_password_file: Path | None = None,
    redis_tls_ca: Path | None = None,
    redis_tls_cert: Path | None = None,
    redis_tls_key: Path | None = None,
    min_replicas_ack: int = 0,
    replicas_ack_timeout: float | None = None,
    redis_cluster: bool = False,
    redlock_url: Sequence[str] = (),
    ttl: float = 10.0,
    renew_interval: float | None = None,
    renew_deadline: float | None = None,
    request_timeout: float | None = None,
    http_address: str = "0.0.0.0:8080",
    compat_http_address: str | None = None,
    log_format: str = "auto",
    log_level: str = "info",
    exit_on_loss: bool = False,
    locks_file: Path | None = None,
    priority: int = 0,
    leader_file: str | None = None,
    command: Sequence[str] = (),
    kill_grace: float | None = None,
    on_child_exit: str = "release",
    shutdown_linger: float = 0.0,
    metrics_per_lock: str = "auto",
    compat_api: str = "leader-elector",
    app_health_url: str | None = None,
    app_health_interval: float = 1.0,
    app_health_failures: int = 3,
    app_health_timeout: float | None = None,
    app_health_min_term: float | None = None,
    predecessor_lock: str | None = None,
) -> Settings:
    """Assemble and check every setting; raises SettingsError naming the first bad one.

    The keywords are the settings of `elector run` (durations in seconds); the command line
    passes its parameters through as they are.
    """
    try:
        locks = _collect_locks(lock, locks_file)
        identity = check_identity(identity if identity is not None else default_identity())
        exec_settings = _exec_settings(
            command,
            locks=locks,
            on_child_exit=on_child_exit,
            kill_grace=kill_grace,
            ttl=ttl,
            renew_deadline=renew_deadline,
            leader_file=leader_file,
        )
        check_priority(priority)
        if leader_file is not None:
            _check_leader_file(leader_file, locks)
        check_ttl(ttl)
        if redlock_url and priority != 0:
            # Preemption releases *to* a rival through a handoff key, which Redlock does not carry.
            raise SettingsError(
                "priority", "preferred leaders and handoffs are not supported with --redlock-url"
            )
        stop_work_s = 0.0 if exec_settings is None else stop_budget_s(exec_settings.kill_grace_s)
        if leader_file is not None:
            stop_work_s += LEADER_FILE_WAIT_S
        timing = ElectionTiming.from_ttl(
            ttl,
            renew_interval_s=renew_interval,
            renew_deadline_s=renew_deadline,
            request_timeout_s=request_timeout,
            stop_work_s=stop_work_s,
        )
        redis_settings = RedisSettings(
            url=redis_url,
            password_file=redis_password_file,
            request_timeout_s=timing.request_timeout_s,
            tls_ca_file=redis_tls_ca,
            tls_cert_file=redis_tls_cert,
            tls_key_file=redis_tls_key,
            min_replicas_ack=min_replicas_ack,
            replicas_ack_timeout_s=replicas_ack_timeout,
            cluster=redis_cluster,
            redlock_urls=tuple(redlock_url),
        )
        redis_settings.validate()
    except (InvalidValueError, InvalidTimingError, InvalidRedisSettingsError) as exc:
        raise invalid(exc) from None
    try:
        http = parse_http_address(http_address)
    except ValueError as exc:
        raise SettingsError("http_address", str(exc)) from None
    compat_http = _compat_http(compat_http_address, http=http, locks=len(locks))
    if compat_api not in COMPAT_APIS:
        raise SettingsError("compat_api", f"{compat_api!r} is not one of {', '.join(COMPAT_APIS)}")
    try:
        logs = LogSettings(format=log_format, level=log_level)  # type: ignore[arg-type]
    except ValueError as exc:
        raise SettingsError(
            "log_format" if log_format not in LOG_FORMATS else "log_level", str(exc)
        ) from None
    if not 0 <= shutdown_linger <= MAX_SHUTDOWN_LINGER_S:
        raise SettingsError(
            "shutdown_linger",
            f"must be between 0s and {MAX_SHUTDOWN_LINGER_S:g}s (a scrape interval), "
            f"got {shutdown_linger * 1000:g}ms",
        )
    if metrics_per_lock not in METRICS_PER_LOCK_CHOICES:
        raise SettingsError(
            "metrics_per_lock",
            f"{metrics_per_lock!r} is not one of {', '.join(METRICS_PER_LOCK_CHOICES)}",
        )
    app_health = _app_health(
        app_health_url,
        interval_s=app_health_interval,
        failures=app_health_failures,
        timeout_s=app_health_timeout,
        min_term_s=app_health_min_term,
        ttl_s=timing.ttl_s,
    )
    return Settings(
        locks=locks,
        identity=identity,
        redis=redis_settings,
        timing=timing,
        http=http,
        logs=logs,
        exit_on_loss=exit_on_loss,
        shutdown_linger_s=shutdown_linger,
        priority=priority,
        leader_file=leader_file,
        exec=exec_settings,
        metrics_per_lock=metrics_per_lock,
        compat_http=compat_http,
        compat_api=compat_api,
        app_health=app_health,
        predecessor_lock=_predecessor_lock(predecessor_lock, locks=locks),
    )


def _predecessor_lock(name: str | None, *, locks: Sequence[str]) -> str | None:
    if name is None or not name.strip():
        return None
    try:
        check_lock_name(name)
    except InvalidValueError as exc:
        raise SettingsError("predecessor_lock", str(exc)) from None
    if len(locks) != 1:
        # Which lock would it precede? Each renamed lock needs a daemon (or an exec mode) of its own.
        raise SettingsError(
            "predecessor_lock",
            f"names the previous name of one lock, but {len(locks)} locks were given; run one daemon "
            "per renamed lock",
        )
    if name == locks[0]:
        raise SettingsError(
            "predecessor_lock", f"{name!r} is --lock itself; name the lock the previous release used"
        )
    return name


def _compat_http(address: str | None, *, http: HttpSettings, locks: int) -> HttpSettings | None:
    if address is None or not address.strip():
        return None
    try:
        compat = parse_http_address(address)
    except ValueError as exc:
        raise SettingsError("compat_http_address", str(exc)) from None
    if locks != 1:
        raise SettingsError("compat_http_address", f"answers for one lock; this daemon holds {locks}")
    if compat.port != 0 and (compat.host, compat.port) == (http.host, http.port):
        reason = f"is --http-address's own ({http.address}): pick another port"
        raise SettingsError("compat_http_address", reason)
    return compat


def _app_health(
    url: str | None,
    *,
    interval_s: float,
    failures: int,
    timeout_s: float | None,
    min_term_s: float | None,
    ttl_s: float,
) -> AppHealthSettings | None:
    if url is None or not url.strip():
        for name, given in (("app_health_timeout", timeout_s), ("app_health_min_term", min_term_s)):
            if given is not None:
                raise SettingsError(name, "only applies with --app-health-url")
        return None
    try:
        parse_app_health_url(url)
    except ValueError as exc:
        raise SettingsError("app_health_url", str(exc)) from None
    if not interval_s >= MIN_INTERVAL_S:
        raise SettingsError(
            "app_health_interval",
            f"must be at least {MIN_INTERVAL_S * 1000:g}ms, got {interval_s * 1000:g}ms",
        )
    if not 1 <= failures <= MAX_FAILURES:
        raise SettingsError("app_health_failures", f"must be between 1 and {MAX_FAILURES}, got {failures}")
    if timeout_s is None:
        timeout_s = min(interval_s / 2, 1.0)
    if not 0 < timeout_s <= interval_s:
        raise SettingsError(
            ("app_health_timeout", "app_health_interval"),
            f"the timeout must be positive and at most the interval (checks never overlap), got "
            f"{timeout_s * 1000:g}ms and {interval_s * 1000:g}ms",
        )
    if min_term_s is None:
        min_term_s = ttl_s
    if min_term_s < 0:
        raise SettingsError("app_health_min_term", f"must not be negative, got {min_term_s * 1000:g}ms")
    return AppHealthSettings(
        url=url.strip(), interval_s=interval_s, failures=failures, timeout_s=timeout_s, min_term_s=min_term_s
    )


#: The names of the settings of `elector run`.
RUN_SETTINGS = frozenset(inspect.signature(build_settings).parameters)
