"""The commands' settings, each declared once: name, flag, variable, type, default and help.

A setting's name is the command's parameter and the keyword of the code that checks it
(`build_settings` for `elector run`, which gets the parameters as they are); its flag
(`--redis-url`) and its environment variable (`ELECTOR_REDIS_URL`) follow from the name, and so
do the messages: a bad setting is reported by its name (`SettingsError.names`), which gives its
flag and, when a variable set it, the variable. Commands that share a setting share its
declaration (`Option.but` changes what one command shows differently, such as its help).

Light on purpose: click and the standard library only, since every command imports this module
and `elector leader-file check` runs every second as a probe.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
import urllib.parse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import click
from click.core import ParameterSource

if TYPE_CHECKING:
    from elector.backend import RedisSettings
    from elector.daemon.settings import SettingsError

F = TypeVar("F", bound=Callable[..., Any])

CONTEXT: dict[str, Any] = {"help_option_names": ["-h", "--help"], "max_content_width": 100}

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?|\.\d+)(ms|us|µs|s|m|h)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6, "µs": 1e-6}
#: Longest duration any option takes: beyond it a value is a typo, and far larger ones overflow
#: timers and Redis' millisecond expiries (PX) at run time instead of failing at start-up.
MAX_DURATION_S = 7 * 24 * 3600.0


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


class Duration(click.ParamType):  # type: ignore[type-arg]
    """A duration such as 10s, 500ms, 1m or 1m30s, converted to seconds."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, int | float):
            return float(value)
        try:
            return parse_duration(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


DURATION = Duration()
FILE = click.Path(dir_okay=False, path_type=Path)


@dataclasses.dataclass(frozen=True, slots=True)
class Option:
    """One setting of the command line. Its flag and variable are derived from `name`."""

    name: str
    help: str | None = None
    type: Any = None
    #: None: no default (the option is unset unless given); shown in --help otherwise.
    default: Any = None
    multiple: bool = False
    is_flag: bool = False
    required: bool = False
    #: False for the few options no variable sets (the demo's).
    from_env: bool = True

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def envvar(self) -> str | None:
        return f"ELECTOR_{self.name.upper()}" if self.from_env else None

    def but(self, **changes: Any) -> Option:
        """This setting as another command shows it (another help text, default, ...)."""
        return dataclasses.replace(self, **changes)

    def __call__(self, func: F) -> F:
        # Only what is set: click reads an explicit `is_flag=False` as "the value is optional",
        # and `--kill-grace -1s` would then be taken for an option named -1.
        extra: dict[str, Any] = {}
        if self.type is not None:
            extra["type"] = self.type
        if self.default is not None:
            extra.update(default=self.default, show_default=True)
        if self.from_env:
            extra.update(envvar=self.envvar, show_envvar=True)
        if self.multiple:
            extra["multiple"] = True
        if self.is_flag:
            extra["is_flag"] = True
        decorate = click.option(self.flag, self.name, required=self.required, help=self.help, **extra)
        return decorate(func)


def options(*declared: Option) -> Callable[[F], F]:
    """The click options of `declared`, shown in --help in this order."""

    def decorate(func: F) -> F:
        for option in reversed(declared):  # click lists the last-applied decorator first
            func = option(func)
        return func

    return decorate


#: The Redis settings as the backend names them in its messages (RedisSettings' terms), and the
#: flag each is on the command line: the one place where the backend's words become the CLI's.
BACKEND_SETTING_FLAGS = {
    "password_file": "--redis-password-file",
    "tls_ca": "--redis-tls-ca",
    "tls_cert": "--redis-tls-cert",
    "tls_key": "--redis-tls-key",
    "request_timeout": "--request-timeout",
    "min_replicas_ack": "--min-replicas-ack",
    "replicas_ack_timeout": "--replicas-ack-timeout",
    "redlock_url": "--redlock-url",
}
# A whole word only: never part of a file path (/etc/tls_ca.pem) or of a URL option.
_BACKEND_SETTING = re.compile(
    r"(?<![\w/.=-])(" + "|".join(map(re.escape, BACKEND_SETTING_FLAGS)) + r")(?![\w/.=-])"
)


def in_flags(message: str) -> str:
    """`message` with the Redis settings it names in the backend's terms (`tls_ca`) written as
    this CLI's flags (`--redis-tls-ca`)."""
    return _BACKEND_SETTING.sub(lambda match: BACKEND_SETTING_FLAGS[match.group(1)], message)


def invalid_setting(exc: SettingsError) -> click.UsageError:
    """The exit-2 error of a bad setting; names the variable too when the value came from one."""
    ctx = click.get_current_context()
    params = {param.name: param for param in ctx.command.params}
    variables = [
        str(params[name].envvar)
        for name in exc.names
        if name in params and ctx.get_parameter_source(name) is ParameterSource.ENVIRONMENT
    ]
    source = f" (set by {', '.join(variables)})" if variables else ""
    return click.UsageError(f"invalid setting {exc.setting}{source}: {in_flags(exc.message)}")


# --- ELECTOR_* variables that are no setting ----------------------------------------------------

#: `ELECTOR_*` variables set legitimately where elector runs that no setting reads (docs/helm.md
#: lists them). Any other `ELECTOR_*` variable that is not a setting of the command stops `elector
#: run` and `elector operator` (`refuse_unknown_variables`): `ELECTOR_TLL=5s` must not leave the
#: default ttl in force unnoticed.
NOT_SETTINGS = {
    # Given to the application container by the charts (elector-sidecar.appEnv); an `envFrom`
    # shared by the app and the sidecar hands it to the daemon too.
    "ELECTOR_LEADER_URL": "the app container's URL of the sidecar's /leader (elector-sidecar.appEnv)",
    # Exec mode gives its command ELECTOR_LOCK, ELECTOR_IDENTITY (settings too) and these two: a
    # command that runs elector itself inherits them.
    "ELECTOR_FENCING_TOKEN": "exec mode: the fencing token, in the command's environment",
    "ELECTOR_LEASE_TTL_MS": "exec mode: the lease's ttl, in the command's environment",
    # Test and demo hooks (elector/testing, elector/daemon/testing_hooks.py, elector demo).
    "ELECTOR_REDIS_SERVER": "the redis-server binary of `elector demo` and the tests",
    "ELECTOR_DEMO_KEEP_LOGS": "`elector demo` keeps its daemons' logs",
    "ELECTOR_TESTING_BLOCK_LOOP_ON_SIGUSR2_S": "a fault-injection hook of the tests (off by default)",
    # This repository's tests, benchmarks and image build, exported in a developer's shell.
    "ELECTOR_REDIS_TLS_SERVER": "the tests' TLS-capable redis-server",
    "ELECTOR_IMAGE_CACHE": "the image tests' cache directory",
    "ELECTOR_DEBIAN_MIRROR": "the image tests' Debian mirror",
    "ELECTOR_CACHE_DIR": "the cache of scripts/checkov-venv.sh",
    "ELECTOR_BENCH_RUNTIME_VENV": "the benchmarks' runtime virtualenv",
    "ELECTOR_TEST_BACKSTOP_DIR": "the tests' timeout backstop reports",
    "ELECTOR_FUZZ_EXAMPLES": "the HTTP fuzz test's number of examples",
}
VARIABLE_PREFIX = "ELECTOR_"


def _variables_of(command: click.Command) -> set[str]:
    return {param.envvar for param in command.params if isinstance(param.envvar, str)}


def unknown_variables(
    command: click.Command, environ: Mapping[str, str], *, siblings: Mapping[str, click.Command] | None = None
) -> list[str]:
    """What is wrong with each `ELECTOR_*` variable of `environ` that is no setting of `command` (nor in
    NOT_SETTINGS), one sentence each naming it and, when one is close, the setting it may have meant.

    `siblings`: the other commands of the program, whose variables are named as theirs."""
    own = _variables_of(command)
    theirs: dict[str, str] = {}
    for name, sibling in sorted((siblings or {}).items()):
        for variable in _variables_of(sibling) - own:
            theirs.setdefault(variable, name)
    problems = []
    for variable in sorted(environ):
        if not variable.startswith(VARIABLE_PREFIX) or variable in own or variable in NOT_SETTINGS:
            continue
        if variable in theirs:
            problems.append(
                f"{variable} is a setting of `elector {theirs[variable]}`, not of `elector {command.name}`"
            )
            continue
        close = difflib.get_close_matches(variable, sorted(own), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else ""
        problems.append(f"{variable} is no setting of `elector {command.name}`{hint}")
    return problems


def refuse_unknown_variables(environ: Mapping[str, str] | None = None) -> None:
    """Exit 2 (a UsageError) when an `ELECTOR_*` variable is no setting of the running command.

    For the commands whose settings come from a pod's environment: `elector run` and `elector
    operator` (not `status` or `handoff`, typed into a shell that may be the sidecar's)."""
    import os

    ctx = click.get_current_context()
    root = ctx.find_root().command
    siblings = dict(root.commands) if isinstance(root, click.Group) else {}
    siblings.pop(str(ctx.command.name), None)
    problems = unknown_variables(ctx.command, os.environ if environ is None else environ, siblings=siblings)
    if problems:
        raise click.UsageError(
            "unknown ELECTOR_* environment variable: "
            + "; ".join(problems)
            + f" (`elector {ctx.command.name} --help` lists every setting's variable; the ELECTOR_* "
            "variables that are no setting are listed in docs/helm.md)"
        )


# --- Redis: every command that reaches it ------------------------------------------------------

REDIS_URL = Option(
    "redis_url",
    default="redis://localhost:6379/0",
    help="redis://[user[:password]@]host[:port][/db], rediss:// for TLS, unix:///path, or "
    "redis+sentinel://[user[:password]@]host1[:port1],host2[:port2]/MASTER[/db] (rediss+sentinel:// "
    "for TLS) to follow the master Sentinel names.",
)
REDIS_PASSWORD_FILE = Option(
    "redis_password_file",
    type=FILE,
    help="File holding the Redis password (e.g. a mounted Secret); overrides the URL's.",
)
REDIS_TLS_CA = Option("redis_tls_ca", type=FILE, help="rediss:// only: PEM file of the CA certificates.")
REDIS_TLS_CERT = Option(
    "redis_tls_cert", type=FILE, help="rediss:// only: PEM file of the client certificate."
)
REDIS_TLS_KEY = Option("redis_tls_key", type=FILE, help="rediss:// only: PEM file of the private key.")
REDIS_CONNECTION = (REDIS_URL, REDIS_PASSWORD_FILE, REDIS_TLS_CA, REDIS_TLS_CERT, REDIS_TLS_KEY)


@dataclasses.dataclass(frozen=True, slots=True)
class RedisConnection:
    """The REDIS_CONNECTION options of a command, as one value (see `redis_connection`)."""

    url: str
    password_file: Path | None
    tls_ca: Path | None
    tls_cert: Path | None
    tls_key: Path | None

    def url_with_tls(self) -> str:
        """The URL with the TLS files as its ssl_* query options, which redis-py reads the same
        way (for the commands that take a URL rather than TLS settings)."""
        files = {"ssl_ca_certs": self.tls_ca, "ssl_certfile": self.tls_cert, "ssl_keyfile": self.tls_key}
        given = {option: str(path) for option, path in files.items() if path is not None}
        if not given:
            return self.url
        base, _, fragment = self.url.partition("#")
        separator = "&" if "?" in base else "?"
        query = urllib.parse.urlencode(given)
        return f"{base}{separator}{query}" + (f"#{fragment}" if fragment else "")

    def settings(self) -> RedisSettings:
        """Unchecked: `RedisSettings.validate` checks them."""
        from elector.backend import RedisSettings

        return RedisSettings(
            url=self.url,
            password_file=self.password_file,
            tls_ca_file=self.tls_ca,
            tls_cert_file=self.tls_cert,
            tls_key_file=self.tls_key,
        )


def redis_connection(*declared: Option) -> Callable[[F], F]:
    """The REDIS_CONNECTION options (or variants of them, in the same order), passed to the
    command as one keyword, `redis: RedisConnection`."""
    names = [option.name for option in declared]
    assert names == [option.name for option in REDIS_CONNECTION], names

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def command(**params: Any) -> Any:
            return func(redis=RedisConnection(*(params.pop(name) for name in names)), **params)

        return options(*declared)(cast(F, command))

    return decorate


# --- the lease ---------------------------------------------------------------------------------

LOCK = Option("lock", required=True, help="Name of the lock the replicas compete for.")
IDENTITY = Option("identity", help="This replica's name in the lock. Default: $POD_NAME, else the host name.")
TTL = Option(
    "ttl",
    type=DURATION,
    default="10s",
    help="Lease time to live: a crashed leader is replaced at most this long after its last renewal.",
)
HTTP_ADDRESS = Option(
    "http_address",
    default="0.0.0.0:8080",
    help="host:port of the /healthz, /readyz, /leader and /metrics endpoint.",
)
LOG_FORMAT = Option(
    "log_format",
    type=click.Choice(["auto", "json", "console"]),
    default="auto",
    help="auto: console on a terminal, JSON lines otherwise.",
)
LOG_LEVEL = Option(
    "log_level",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default="info",
)

# --- `status` and `handoff`: one lock on one Redis ------------------------------------------------


def control_options(func: F) -> F:
    """The Redis (passed as `redis: RedisConnection`) and the lock of `status` and `handoff`."""
    return redis_connection(*REDIS_CONNECTION)(options(LOCK)(func))


def control_url(redis: RedisConnection, *, lock: str) -> str:
    """The URL `status` and `handoff` reach, TLS files included; it and the lock name are
    checked as `elector run` checks them."""
    from elector.backend.connection import InvalidRedisSettingsError, check_redis_url
    from elector.lease import InvalidValueError, check_lock_name

    url = redis.url_with_tls()
    try:
        check_lock_name(lock)
        check_redis_url(url)
    except (InvalidValueError, InvalidRedisSettingsError) as exc:
        from elector.daemon.settings import invalid

        raise invalid_setting(invalid(exc)) from None
    return url


# --- `elector run` only --------------------------------------------------------------------------

RUN_OPTIONS = (
    *REDIS_CONNECTION,
    Option(
        "min_replicas_ack",
        type=click.IntRange(0, 100),
        default=0,
        help="After each grant and renewal, WAIT until this many replicas have it; fewer in "
        "time makes a grant fail (and be released) and a renewal count as failed.",
    ),
    Option(
        "replicas_ack_timeout",
        type=DURATION,
        help="How long the WAIT of --min-replicas-ack may take (shorter than --request-timeout). "
        "Default: half the request timeout.",
    ),
    LOCK.but(
        multiple=True,
        required=False,
        help="Name of a lock the replicas compete for. Repeat it (or separate names by blanks in the "
        "variable) to hold several locks in one daemon.",
    ),
    Option("locks_file", type=FILE, help="File of lock names, one per line (# comments), added to --lock."),
    Option(
        "predecessor_lock",
        help="The name the previous release gave the lock (a rename under way): lead only while "
        "holding it too, so that replicas of both releases exclude each other during a rolling "
        "update or a rollback. One --lock only. Drop it once no replica of that release can return.",
    ),
    IDENTITY,
    TTL,
    Option(
        "renew_interval",
        type=DURATION,
        help="Time between renewals while leading. Default: 0.3 x ttl.",
    ),
    Option(
        "renew_deadline",
        type=DURATION,
        help="Step down when no renewal succeeded for this long. Default: 2/3 of the ttl.",
    ),
    Option(
        "request_timeout",
        type=DURATION,
        help="Timeout of each Redis request. Default: half the renew interval, at most 1s.",
    ),
    HTTP_ADDRESS,
    Option(
        "compat_http_address",
        help="host:port (conventionally :4040) of a listener answering any request with "
        '{"name":"<leader>"} as the retired leader-elector sidecar did. Default: off.',
    ),
    Option(
        "compat_api",
        type=click.Choice(["leader-elector", "nais"]),
        default="leader-elector",
        help="The API of --compat-http-address: leader-elector (the contrib image, answer for answer) "
        "or nais (nais/elector's: last_update in the body, /sse streaming leader changes).",
    ),
    LOG_FORMAT,
    LOG_LEVEL,
    Option(
        "exit_on_loss",
        is_flag=True,
        help="Exit (code 3) after losing leadership instead of contending again.",
    ),
    Option(
        "shutdown_linger",
        type=DURATION,
        default="0s",
        help="After a graceful shutdown has released the leases, keep serving HTTP this long (not "
        "ready, not leader) so that Prometheus scrapes the final counters, such as the shutdown "
        "step-down. Set it to the scrape interval; a second signal cuts it short.",
    ),
    Option(
        "redis_cluster",
        is_flag=True,
        help="--redis-url names one node of a Redis Cluster: each lock lives on the master of its slot.",
    ),
    Option(
        "redlock_url",
        multiple=True,
        help="Redlock: the URL of one of N >= 3 (odd) independent Redis servers; repeat it for each "
        "(the env var takes them separated by spaces). A grant needs a majority. Replaces --redis-url.",
    ),
    Option(
        "priority",
        type=int,
        default=0,
        help="Preferred leaders: a leader hands over to a live candidate with a higher priority "
        "(after it has been seen for a ttl, so leadership never flaps).",
    ),
    Option(
        "leader_file",
        help="Keep this JSON file (written atomically) showing whether we lead and the fencing token. "
        "With several locks, put {lock} in the path.",
    ),
    Option(
        "metrics_per_lock",
        type=click.Choice(["auto", "always", "never"]),
        default="auto",
        help="Series per lock on /metrics (a `lock` label), or aggregate ones: the same counters and "
        "renew histogram without the label, plus elector_locks, elector_locks_leading and "
        "elector_locks_redis_down instead of the per-lock gauges. auto: per lock up to 100 locks "
        "(~45 series each), aggregate above.",
    ),
    Option(
        "app_health_url",
        help="The app's own health URL (http:// or https://, e.g. http://127.0.0.1:8080/healthz): "
        "contend only while it answers 2xx, and hand over when it fails --app-health-failures "
        "checks in a row. An app that never answered 2xx never leads. Exec mode: the URL is the "
        "command's health. Default: off.",
    ),
    Option(
        "app_health_interval",
        type=DURATION,
        default="1s",
        help="Time between two checks of --app-health-url.",
    ),
    Option(
        "app_health_failures",
        type=click.IntRange(1, 100),
        default=3,
        help="Failed checks in a row (not 2xx, a timeout, refused) that make the app unhealthy; one "
        "success makes it healthy again.",
    ),
    Option(
        "app_health_timeout",
        type=DURATION,
        help="How long one check may take, connecting included (at most the interval). Default: half "
        "the interval, at most 1s.",
    ),
    Option(
        "app_health_min_term",
        type=DURATION,
        help="Hysteresis: a leader hands over for its app's health only once it has led this long, "
        "so a flapping app cannot move leadership more often. Default: the ttl.",
    ),
    Option(
        "kill_grace",
        type=DURATION,
        help="Exec mode: SIGTERM to SIGKILL grace for the command. Default: 0.2 x ttl, within what "
        "fits between the renew deadline and the lease's expiry.",
    ),
    Option(
        "on_child_exit",
        type=click.Choice(["release", "restart", "exit"]),
        default="release",
        help="Exec mode, when the command exits by itself while leading: release (step down, let "
        "another replica lead, contend again after a back-off), restart (after a back-off, still "
        "leading), or exit (release and exit with the command's code).",
    ),
)
