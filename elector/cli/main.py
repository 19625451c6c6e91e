"""The command line: `elector run`, `status`, `handoff`, `demo`, `leader-file check`, `operator`.

Every option of `run` can also be set by an `ELECTOR_*` environment variable (shown in --help).
Invalid settings exit with code 2 and a message naming the setting.
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from elector import __version__

if TYPE_CHECKING:
    from elector.daemon.settings import SettingsError

# elector.daemon.settings and everything else of the daemon are imported inside the commands that need
# them: they pull in redis, aiohttp and structlog (~0.5 s), which `elector leader-file check`, run
# every second by a probe, must not pay for.

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class Duration(click.ParamType):  # type: ignore[type-arg]
    """A duration such as 10s, 500ms, 1m or 1m30s, converted to seconds."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, int | float):
            return float(value)
        from elector.daemon.settings import parse_duration

        try:
            return parse_duration(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


DURATION = Duration()


def _envvar(name: str) -> str:
    return f"ELECTOR_{name.upper().replace('-', '_')}"


def _invalid(exc: SettingsError) -> click.UsageError:
    """The exit-2 error for a bad setting; names the variable too when the value came from one."""
    ctx = click.get_current_context()
    variables = []
    for flag in re.findall(r"--[a-z][a-z-]*", exc.setting):
        name = flag[2:].replace("-", "_")
        source = ctx.get_parameter_source(name) or ctx.get_parameter_source(f"{name}s")  # --lock: locks
        if source is click.core.ParameterSource.ENVIRONMENT:
            variables.append(_envvar(flag[2:]))
    text = str(exc)
    if variables:
        text = f"{exc.setting} (set by {', '.join(variables)}){text.removeprefix(exc.setting)}"
    return click.UsageError(f"invalid setting {text}")


#: The redis-py URL options of --redis-tls-ca, --redis-tls-cert and --redis-tls-key.
_URL_OPTIONS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")


def _with_tls_query(url: str, files: dict[str, Path | None]) -> str:
    """`url` with the TLS files as redis-py query options (for commands without TLS settings)."""
    given = {option: str(path) for option, path in files.items() if path is not None}
    if not given:
        return url
    base, _, fragment = url.partition("#")
    separator = "&" if "?" in base else "?"
    query = urllib.parse.urlencode(given)
    return f"{base}{separator}{query}" + (f"#{fragment}" if fragment else "")


def redis_options(func: Any) -> Any:
    """--redis-url, --redis-password-file and the TLS files; --min-replicas-ack and
    --replicas-ack-timeout for commands that take them (they write leases).

    A command that takes no `redis_tls_*` parameters gets the TLS files as the URL's ssl_*
    query options, which redis-py reads the same way.
    """
    accepts = set(inspect.signature(func).parameters)
    tls_params = ("redis_tls_ca", "redis_tls_cert", "redis_tls_key")
    if "min_replicas_ack" in accepts:
        func = click.option(
            "--replicas-ack-timeout",
            type=DURATION,
            envvar=_envvar("replicas-ack-timeout"),
            show_envvar=True,
            help="How long the WAIT of --min-replicas-ack may take (shorter than --request-timeout). "
            "Default: half the request timeout.",
        )(func)
        func = click.option(
            "--min-replicas-ack",
            type=click.IntRange(0, 100),
            default=0,
            show_default=True,
            envvar=_envvar("min-replicas-ack"),
            show_envvar=True,
            help="After each grant and renewal, WAIT until this many replicas have it; fewer in "
            "time makes a grant fail (and be released) and a renewal count as failed.",
        )(func)
    if not set(tls_params) <= accepts:
        command = func

        @functools.wraps(command)
        def fold_tls(*args: Any, **kwargs: Any) -> Any:
            files = {opt: kwargs.pop(param) for opt, param in zip(_URL_OPTIONS, tls_params, strict=True)}
            kwargs["redis_url"] = _with_tls_query(kwargs["redis_url"], files)
            return command(*args, **kwargs)

        func = fold_tls
    for name, what in (("key", "private key"), ("cert", "client certificate"), ("ca", "CA certificates")):
        func = click.option(
            f"--redis-tls-{name}",
            f"redis_tls_{name}",
            type=click.Path(dir_okay=False, path_type=Path),
            envvar=_envvar(f"redis-tls-{name}"),
            show_envvar=True,
            help=f"rediss:// only: PEM file of the {what}.",
        )(func)
    func = click.option(
        "--redis-password-file",
        type=click.Path(dir_okay=False, path_type=Path),
        envvar=_envvar("redis-password-file"),
        show_envvar=True,
        help="File holding the Redis password (e.g. a mounted Secret); overrides the URL's.",
    )(func)
    return click.option(
        "--redis-url",
        envvar=_envvar("redis-url"),
        show_envvar=True,
        default="redis://localhost:6379/0",
        show_default=True,
        help="redis://[user[:password]@]host[:port][/db], rediss:// for TLS, unix:///path, or "
        "redis+sentinel://[user[:password]@]host1[:port1],host2[:port2]/MASTER[/db] (rediss+sentinel:// "
        "for TLS) to follow the master Sentinel names.",
    )(func)


def lock_option(func: Any) -> Any:
    return click.option(
        "--lock",
        envvar=_envvar("lock"),
        show_envvar=True,
        required=True,
        help="Name of the lock the replicas compete for.",
    )(func)


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, prog_name="elector")
def cli() -> None:
    """Leader election for Kubernetes workloads on a Redis lease."""


@cli.command(context_settings=CONTEXT)
@redis_options
@click.option(
    "--lock",
    "locks",
    multiple=True,
    envvar=_envvar("lock"),
    show_envvar=True,
    help="Name of a lock the replicas compete for. Repeat it (or separate names by blanks in the "
    "variable) to hold several locks in one daemon.",
)
@click.option(
    "--locks-file",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar=_envvar("locks-file"),
    show_envvar=True,
    help="File of lock names, one per line (# comments), added to --lock.",
)
@click.option(
    "--identity",
    envvar=_envvar("identity"),
    show_envvar=True,
    help="This replica's name in the lock. Default: $POD_NAME, else the host name.",
)
@click.option(
    "--ttl",
    type=DURATION,
    default="10s",
    show_default=True,
    envvar=_envvar("ttl"),
    show_envvar=True,
    help="Lease time to live: a crashed leader is replaced at most this long after its last renewal.",
)
@click.option(
    "--renew-interval",
    type=DURATION,
    envvar=_envvar("renew-interval"),
    show_envvar=True,
    help="Time between renewals while leading. Default: 0.3 x ttl.",
)
@click.option(
    "--renew-deadline",
    type=DURATION,
    envvar=_envvar("renew-deadline"),
    show_envvar=True,
    help="Step down when no renewal succeeded for this long. Default: 2/3 of the ttl.",
)
@click.option(
    "--request-timeout",
    type=DURATION,
    envvar=_envvar("request-timeout"),
    show_envvar=True,
    help="Timeout of each Redis request. Default: half the renew interval, at most 1s.",
)
@click.option(
    "--http-address",
    default="0.0.0.0:8080",
    show_default=True,
    envvar=_envvar("http-address"),
    show_envvar=True,
    help="host:port of the /healthz, /readyz, /leader and /metrics endpoint.",
)
@click.option(
    "--log-format",
    type=click.Choice(["auto", "json", "console"]),
    default="auto",
    show_default=True,
    envvar=_envvar("log-format"),
    show_envvar=True,
    help="auto: console on a terminal, JSON lines otherwise.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default="info",
    show_default=True,
    envvar=_envvar("log-level"),
    show_envvar=True,
)
@click.option(
    "--exit-on-loss",
    is_flag=True,
    envvar=_envvar("exit-on-loss"),
    show_envvar=True,
    help="Exit (code 3) after losing leadership instead of contending again.",
)
@click.option(
    "--shutdown-linger",
    type=DURATION,
    default="0s",
    show_default=True,
    envvar=_envvar("shutdown-linger"),
    show_envvar=True,
    help="After a graceful shutdown has released the leases, keep serving HTTP this long (not "
    "ready, not leader) so that Prometheus scrapes the final counters, such as the shutdown "
    "step-down. Set it to the scrape interval; a second signal cuts it short.",
)
@click.option(
    "--redis-cluster",
    is_flag=True,
    envvar=_envvar("redis-cluster"),
    show_envvar=True,
    help="--redis-url names one node of a Redis Cluster: each lock lives on the master of its slot.",
)
@click.option(
    "--redlock-url",
    "redlock_urls",
    multiple=True,
    envvar=_envvar("redlock-url"),
    show_envvar=True,
    help="Redlock: the URL of one of N >= 3 (odd) independent Redis servers; repeat it for each "
    "(the env var takes them separated by spaces). A grant needs a majority. Replaces --redis-url.",
)
@click.option(
    "--priority",
    type=int,
    default=0,
    show_default=True,
    envvar=_envvar("priority"),
    show_envvar=True,
    help="Preferred leaders: a leader hands over to a live candidate with a higher priority "
    "(after it has been seen for a ttl, so leadership never flaps).",
)
@click.option(
    "--leader-file",
    envvar=_envvar("leader-file"),
    show_envvar=True,
    help="Keep this JSON file (written atomically) showing whether we lead and the fencing token. "
    "With several locks, put {lock} in the path.",
)
@click.option(
    "--kill-grace",
    type=DURATION,
    envvar=_envvar("kill-grace"),
    show_envvar=True,
    help="Exec mode: SIGTERM to SIGKILL grace for the command. Default: 0.2 x ttl, within what "
    "fits between the renew deadline and the lease's expiry.",
)
@click.option(
    "--on-child-exit",
    type=click.Choice(["release", "restart", "exit"]),
    default="release",
    show_default=True,
    envvar=_envvar("on-child-exit"),
    show_envvar=True,
    help="Exec mode, when the command exits by itself while leading: release (step down, let "
    "another replica lead, contend again after a back-off), restart (after a back-off, still "
    "leading), or exit (release and exit with the command's code).",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run(
    *,
    redis_url: str,
    redis_password_file: Path | None,
    redis_tls_ca: Path | None,
    redis_tls_cert: Path | None,
    redis_tls_key: Path | None,
    min_replicas_ack: int,
    replicas_ack_timeout: float | None,
    locks: tuple[str, ...],
    locks_file: Path | None,
    identity: str | None,
    ttl: float,
    renew_interval: float | None,
    renew_deadline: float | None,
    request_timeout: float | None,
    http_address: str,
    log_format: str,
    log_level: str,
    exit_on_loss: bool,
    shutdown_linger: float,
    redis_cluster: bool,
    redlock_urls: tuple[str, ...],
    priority: int,
    leader_file: str | None,
    kill_grace: float | None,
    on_child_exit: str,
    command: tuple[str, ...],
) -> None:
    """Compete for each LOCK; lead while holding it; publish the role over HTTP and metrics.

    \b
    Exec mode:  elector run --lock NAME [options] -- COMMAND [ARGS...]
    runs COMMAND only while this replica leads, with ELECTOR_LOCK, ELECTOR_IDENTITY,
    ELECTOR_FENCING_TOKEN and ELECTOR_LEASE_TTL_MS in its environment, and stops its whole
    process group before the lease could expire.

    Exit codes: 0 stopped by SIGTERM/SIGINT (lease released), 1 fatal error or a second signal,
    2 invalid settings, 3 leadership lost with --exit-on-loss; with --on-child-exit exit, the
    command's own exit code.
    """
    from elector.daemon.settings import SettingsError, build_settings

    if not locks and locks_file is None:
        raise click.UsageError("invalid setting --lock: missing (give --lock NAME or set ELECTOR_LOCK)")
    context = click.get_current_context()
    if redlock_urls and context.get_parameter_source("redis_url") is not click.core.ParameterSource.DEFAULT:
        raise _invalid(SettingsError("--redlock-url", "replaces --redis-url: give the Redlock servers only"))
    child_exit_source = context.get_parameter_source("on_child_exit")
    if not command and child_exit_source is not click.core.ParameterSource.DEFAULT:
        # A policy for a command that is not there is a misunderstanding, not a no-op.
        raise _invalid(
            SettingsError("--on-child-exit", "only applies to exec mode (elector run ... -- COMMAND)")
        )
    try:
        settings = build_settings(
            lock=locks,
            locks_file=locks_file,
            priority=priority,
            leader_file=leader_file,
            command=command,
            kill_grace_s=kill_grace,
            on_child_exit=on_child_exit,
            identity=identity,
            redis_url=redis_url,
            redis_password_file=redis_password_file,
            redis_tls_ca_file=redis_tls_ca,
            redis_tls_cert_file=redis_tls_cert,
            redis_tls_key_file=redis_tls_key,
            min_replicas_ack=min_replicas_ack,
            replicas_ack_timeout_s=replicas_ack_timeout,
            redis_cluster=redis_cluster,
            redlock_urls=redlock_urls,
            ttl_s=ttl,
            renew_interval_s=renew_interval,
            renew_deadline_s=renew_deadline,
            request_timeout_s=request_timeout,
            http_address=http_address,
            log_format=log_format,
            log_level=log_level.lower(),
            exit_on_loss=exit_on_loss,
            shutdown_linger_s=shutdown_linger,
        )
    except SettingsError as exc:
        raise _invalid(exc) from None
    from elector.daemon.service import run_daemon

    sys.exit(run_daemon(settings))


@cli.command(context_settings=CONTEXT)
@redis_options
@lock_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (one per line with --watch).")
@click.option("--timeout", type=DURATION, default="2s", show_default=True, help="Redis request timeout.")
@click.option(
    "--watch",
    is_flag=True,
    help="Follow the lock: print one line per transition (acquired, released, handoff, "
    "candidates joining or leaving) until interrupted.",
)
def status(
    *, redis_url: str, redis_password_file: Path | None, lock: str, as_json: bool, timeout: float, watch: bool
) -> None:
    """Show who holds LOCK, its fencing token and remaining TTL, and the registered candidates.

    Read without contending. Exit codes: 0 read (held or free; with --watch: interrupted by
    SIGINT/SIGTERM), 1 Redis unreachable or unreadable, 2 invalid settings.
    """
    import json

    from elector.control.status import StatusError, read_status, watch_status
    from elector.daemon.settings import SettingsError, check_redis_url, validate_lock_name

    try:
        validate_lock_name(lock)
        check_redis_url(redis_url)
    except SettingsError as exc:
        raise _invalid(exc) from None
    if timeout <= 0:
        raise click.BadParameter("must be positive", param_hint="'--timeout'")
    try:
        if watch:
            watch_status(
                redis_url,
                password_file=redis_password_file,
                lock=lock,
                timeout_s=timeout,
                as_json=as_json,
                emit=click.echo,
            )
            return
        click.echo(
            read_status(
                redis_url, password_file=redis_password_file, lock=lock, timeout_s=timeout, as_json=as_json
            )
        )
    except StatusError as exc:
        if exc.usage:
            raise click.UsageError(str(exc)) from None
        if as_json:
            click.echo(json.dumps({"lock": lock, "error": str(exc)}))
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)


@cli.command(context_settings=CONTEXT)
@click.option("--replicas", type=click.IntRange(2, 9), default=3, show_default=True)
@click.option("--ttl", type=DURATION, default="3s", show_default=True, help="Lease ttl of the demo replicas.")
@click.option(
    "--rounds", type=click.IntRange(1, 20), default=2, show_default=True, help="Leader kills to show."
)
@click.option(
    "--redis-server", "redis_server", envvar="ELECTOR_REDIS_SERVER", help="redis-server binary to use."
)
def demo(*, replicas: int, ttl: float, rounds: int, redis_server: str | None) -> None:
    """Watch a failover: a private Redis, several replicas, the leader killed, the takeover timed."""
    from elector.cli.demo import run_demo

    sys.exit(run_demo(replicas=replicas, ttl_s=ttl, rounds=rounds, redis_server=redis_server))


@cli.command(context_settings=CONTEXT)
@redis_options
@lock_option
@click.option(
    "--to",
    "to",
    metavar="IDENTITY",
    help="The candidate to hand over to (it must be a live candidate). Default: anyone but the leader.",
)
@click.option(
    "--timeout",
    type=DURATION,
    default="30s",
    show_default=True,
    help="How long to wait for the handoff to complete.",
)
@click.option(
    "--window",
    type=DURATION,
    help="How long the old leader (and with --to, every other candidate) stands back. "
    "Default: 10s, or --timeout if shorter.",
)
def handoff(
    *,
    redis_url: str,
    redis_password_file: Path | None,
    lock: str,
    to: str | None,
    timeout: float,
    window: float | None,
) -> None:
    """Ask the leader of LOCK to stop its work and hand the lease over, and wait until it has.

    Exit codes: 0 handed over within --timeout, 1 not handed over (no leader, unknown or
    current --to, timeout) or Redis unreachable, 2 invalid settings.
    """
    from elector.control.handoff import MAX_WINDOW_S, HandoffError, run_handoff
    from elector.daemon.settings import SettingsError, check_redis_url, validate_identity, validate_lock_name

    try:
        validate_lock_name(lock)
        check_redis_url(redis_url)
        if to is not None:
            validate_identity(to)
    except SettingsError as exc:
        setting = exc.setting.replace("--identity", "--to", 1)
        raise _invalid(SettingsError(setting, str(exc).removeprefix(f"{exc.setting}: "))) from None
    if timeout <= 0:
        raise click.BadParameter("must be positive", param_hint="'--timeout'")
    if window is not None and not 0 < window <= MAX_WINDOW_S:
        raise click.BadParameter(f"must be positive and at most {MAX_WINDOW_S:g}s", param_hint="'--window'")
    try:
        result = run_handoff(
            redis_url,
            password_file=redis_password_file,
            lock=lock,
            to=to,
            timeout_s=timeout,
            window_s=window,
            progress=click.echo,
        )
    except HandoffError as exc:
        if exc.usage:
            raise click.UsageError(str(exc)) from None
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    if not result.done:
        click.echo(f"error: {result.message}", err=True)
        sys.exit(1)
    click.echo(result.message)


@cli.group("leader-file", context_settings=CONTEXT)
def leader_file_group() -> None:
    """Read the file `elector run --leader-file` keeps (from any container sharing its volume)."""


@leader_file_group.command("check", context_settings=CONTEXT)
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
def leader_file_check(path: Path) -> None:
    """Exit 0 only if PATH says this replica leads and its validity end is still ahead.

    `is_leader: true` alone is not enough: a daemon killed by SIGKILL leaves it behind while
    another replica leads. The file's `valid_until_ms` (wall clock) ends before the lease can
    expire on Redis, so two replicas never pass this check at once. Cheap enough for an exec
    probe every second.

    Exit codes: 0 leading (one line on stdout), 1 not leading or its validity ended (the reason,
    one line on stderr), 2 bad usage, or PATH unreadable or not a leader file.
    """
    # A few standard-library modules only: no redis, aiohttp or structlog to import.
    from elector.daemon.leader_file_check import LeaderFileUnusable, check_leader_file

    try:
        verdict = check_leader_file(path)
    except LeaderFileUnusable as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    if not verdict.leading:
        click.echo(verdict.reason, err=True)
        sys.exit(1)
    click.echo(verdict.reason)


@cli.command(
    "operator",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
    add_help_option=False,
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def operator(args: tuple[str, ...]) -> None:
    """Run the Kubernetes operator for LeaderElection resources (needs elector[kube])."""
    import importlib

    # Imported by name only when invoked: `elector` without the kube extra keeps working, and
    # the import-layer check does not follow the operator's kopf imports into the CLI.
    module = importlib.import_module("elector.kube.operator.command")
    module.operator_command.main(args=list(args), prog_name="elector operator")


def main() -> None:
    cli(prog_name="elector")
