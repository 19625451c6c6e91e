"""The command line: invalid settings exit 2 naming the setting, --help, --version, entry points.

`elector run` is never allowed to start a daemon here (it would contend on localhost:6379): an
autouse fixture replaces `elector.daemon.service.run_daemon`, which the CLI imports at call time.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

import elector
import elector.daemon.service
from elector.cli.main import cli
from elector.daemon.settings import Settings
from elector.testing.redis_server import RedisServerProcess

ELECTOR_SCRIPT = Path(sys.executable).with_name("elector")
REPO = Path(__file__).resolve().parents[2]


def _clean_environ() -> dict[str, str]:
    """The process environment without ELECTOR_* settings (keeping the redis-server choice)."""
    return {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("ELECTOR_") or key == "ELECTOR_REDIS_SERVER"
    }


class DaemonCalls:
    def __init__(self) -> None:
        self.settings: list[Settings] = []
        self.exit_code = 0

    def __call__(self, settings: Settings) -> int:
        self.settings.append(settings)
        return self.exit_code


@pytest.fixture(autouse=True)
def daemon(monkeypatch: pytest.MonkeyPatch) -> DaemonCalls:
    for key in os.environ:
        if key.startswith("ELECTOR_") and key != "ELECTOR_REDIS_SERVER":
            monkeypatch.delenv(key)
    calls = DaemonCalls()
    monkeypatch.setattr(elector.daemon.service, "run_daemon", calls)
    return calls


def invoke(args: list[str], env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, args, env=env, prog_name="elector")


def _flat(text: str) -> str:
    return " ".join(text.split())


# --- invalid settings of `elector run` -------------------------------------------------------

INVALID_RUN_SETTINGS = [
    # (id, args, env, fragments the message must contain)
    ("ttl-below-min", ["--lock", "x", "--ttl", "100ms"], {}, ["--ttl", "at least 500ms", "100ms"]),
    ("ttl-no-unit", ["--lock", "x", "--ttl", "10"], {}, ["--ttl", "no unit", "10s"]),
    ("ttl-garbage", ["--lock", "x", "--ttl", "abc"], {}, ["--ttl", "'abc' is not a duration"]),
    ("ttl-negative", ["--lock", "x", "--ttl", "-1s"], {}, ["--ttl", "'-1s' is not a duration"]),
    (
        "interval-above-ttl",
        ["--lock", "x", "--renew-interval", "5s", "--ttl", "3s"],
        {},
        ["--renew-interval", "renew interval (5000ms)"],
    ),
    (
        "deadline-margin",
        ["--lock", "x", "--renew-deadline", "9.95s", "--ttl", "10s"],
        {},
        ["--renew-deadline", "safety margin", "9950ms"],
    ),
    (
        "deadline-not-above-ttl",
        ["--lock", "x", "--renew-deadline", "10s", "--ttl", "10s"],
        {},
        ["--renew-deadline", "must be longer than the renew deadline"],
    ),
    (
        "deadline-below-interval",
        ["--lock", "x", "--renew-deadline", "1s", "--renew-interval", "2s"],
        {},
        ["--renew-deadline", "must be longer than the renew interval (2000ms)"],
    ),
    (
        "request-timeout",
        ["--lock", "x", "--request-timeout", "5s"],
        {},
        ["--request-timeout", "request timeout (5000ms) must be shorter"],
    ),
    ("url-scheme", ["--lock", "x", "--redis-url", "http://x"], {}, ["--redis-url", "redis://"]),
    ("url-port", ["--lock", "x", "--redis-url", "redis://h:99999"], {}, ["--redis-url", "invalid port"]),
    ("url-no-host", ["--lock", "x", "--redis-url", "redis:///0"], {}, ["--redis-url", "no host"]),
    (
        "password-file",
        ["--lock", "x", "--redis-password-file", "/nonexistent"],
        {},
        ["--redis-password-file", "/nonexistent"],
    ),
    (
        "tls-without-rediss",
        ["--lock", "x", "--redis-tls-ca", "/etc/passwd"],
        {},
        ["invalid setting --redis-tls-ca: --redis-tls-ca only apply to TLS connections"],
    ),
    (
        "tls-cert-alone",
        ["--lock", "x", "--redis-url", "rediss://h:6380/0", "--redis-tls-cert", "/etc/passwd"],
        {},
        ["--redis-tls-cert and --redis-tls-key go together: --redis-tls-key is missing"],
    ),
    (
        "ack-timeout-alone",
        ["--lock", "x", "--replicas-ack-timeout", "100ms"],
        {},
        ["--replicas-ack-timeout: --replicas-ack-timeout only applies with --min-replicas-ack 1 or more"],
    ),
    ("http-nonsense", ["--lock", "x", "--http-address", "nonsense"], {}, ["--http-address", "no port"]),
    ("http-port", ["--lock", "x", "--http-address", ":70000"], {}, ["--http-address", "out of range"]),
    ("lock-blank", ["--lock", "a b"], {}, ["--lock", "'a b' is not a valid lock name"]),
    ("lock-braces", ["--lock", "{x}"], {}, ["--lock", "'{x}' is not a valid lock name"]),
    ("lock-too-long", ["--lock", "x" * 201], {}, ["--lock", "1-200 characters"]),
    ("lock-missing", [], {}, ["--lock: missing", "ELECTOR_LOCK"]),
    ("lock-twice", ["--lock", "x", "--lock", "x"], {}, ["--lock", "'x' is given more than once"]),
    ("locks-file-missing", ["--locks-file", "/nonexistent/locks"], {}, ["--locks-file", "cannot read"]),
    (
        "exec-many-locks",
        ["--lock", "a", "--lock", "b", "--", "true"],
        {},
        ["--lock", "exec mode runs one command under one lock"],
    ),
    (
        "kill-grace-too-long",
        ["--lock", "x", "--ttl", "3s", "--kill-grace", "2s", "--", "true"],
        {},
        ["--kill-grace", "2000ms does not fit", "at most"],
    ),
    ("kill-grace-no-command", ["--lock", "x", "--kill-grace", "1s"], {}, ["--kill-grace", "exec mode"]),
    ("kill-grace-negative", ["--lock", "x", "--kill-grace", "-1s", "--", "true"], {}, ["--kill-grace"]),
    ("on-child-exit", ["--lock", "x", "--on-child-exit", "crash", "--", "true"], {}, ["--on-child-exit"]),
    ("priority-text", ["--lock", "x", "--priority", "high"], {}, ["--priority", "'high'"]),
    ("priority-huge", ["--lock", "x", "--priority", "99999999"], {}, ["--priority", "between"]),
    (
        "leader-file-dir-missing",
        ["--lock", "x", "--leader-file", "/nonexistent/dir/f.json"],
        {},
        ["--leader-file"],
    ),
    (
        "leader-file-no-placeholder",
        ["--lock", "a", "--lock", "b", "--leader-file", "/tmp/l.json"],
        {},
        ["--leader-file", "{lock}"],
    ),
    ("env-lock-bad", [], {"ELECTOR_LOCK": "good {bad}"}, ["--lock", "'{bad}' is not a valid lock name"]),
    ("identity-blank", ["--lock", "x", "--identity", " pod"], {}, ["--identity", "surrounding blanks"]),
    ("log-format", ["--lock", "x", "--log-format", "xml"], {}, ["--log-format", "'xml'"]),
    ("log-level", ["--lock", "x", "--log-level", "trace"], {}, ["--log-level", "'trace'"]),
    ("env-ttl", ["--lock", "x"], {"ELECTOR_TTL": "1"}, ["--ttl", "ELECTOR_TTL", "no unit", "1s"]),
    ("env-lock", [], {"ELECTOR_LOCK": "{bad}"}, ["--lock", "'{bad}'"]),
    ("env-redis-url", ["--lock", "x"], {"ELECTOR_REDIS_URL": "http://x"}, ["--redis-url", "redis://"]),
    (
        "env-http-address",
        ["--lock", "x"],
        {"ELECTOR_HTTP_ADDRESS": "0.0.0.0"},
        ["--http-address", "no port"],
    ),
    (
        "env-exit-on-loss",
        ["--lock", "x"],
        {"ELECTOR_EXIT_ON_LOSS": "maybe"},
        ["--exit-on-loss", "ELECTOR_EXIT_ON_LOSS"],
    ),
]


@pytest.mark.parametrize(
    ("args", "env", "fragments"),
    [pytest.param(args, env, fragments, id=name) for name, args, env, fragments in INVALID_RUN_SETTINGS],
)
def test_invalid_run_settings_exit_2_naming_the_setting(
    daemon: DaemonCalls, args: list[str], env: dict[str, str], fragments: list[str]
) -> None:
    result = invoke(["run", *args], env=env)
    assert result.exit_code == 2, result.output
    assert daemon.settings == [], "the daemon must not start with invalid settings"
    assert result.stdout == ""
    message = _flat(result.stderr)
    assert "Usage: elector run" in message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "url",
    [
        "redis://:hunter2@h:99999",
        "redis://user:hunter2@h:99999/0",
        "http://:hunter2@h",
        "redis://:hunter2@[::1:6379",
        "redis://:hunter2@/0",
    ],
)
def test_password_in_a_bad_url_never_appears(daemon: DaemonCalls, url: str) -> None:
    result = invoke(["run", "--lock", "x", "--redis-url", url])
    assert result.exit_code == 2
    assert "--redis-url" in result.stderr
    assert "hunter2" not in result.output
    assert "***" in result.stderr
    assert daemon.settings == []


def test_password_in_a_bad_url_never_appears_via_env(daemon: DaemonCalls) -> None:
    result = invoke(["run"], env={"ELECTOR_LOCK": "x", "ELECTOR_REDIS_URL": "redis://:hunter2@h:99999"})
    assert result.exit_code == 2
    assert "hunter2" not in result.output
    assert daemon.settings == []


def test_valid_settings_reach_the_daemon(daemon: DaemonCalls, tmp_path: Path) -> None:
    password_file = tmp_path / "password"
    password_file.write_text("s3cret\n")
    daemon.exit_code = 3
    args = [
        "run",
        "--lock", "orders",
        "--identity", "pod-1",
        "--ttl", "1m",
        "--renew-interval", "10s",
        "--renew-deadline", "40s",
        "--request-timeout", "500ms",
        "--http-address", "127.0.0.1:0",
        "--redis-url", "redis://127.0.0.1:1/2",
        "--redis-password-file", str(password_file),
        "--log-format", "json",
        "--log-level", "WARNING",
        "--exit-on-loss",
    ]  # fmt: skip
    result = invoke(args)
    assert result.exit_code == 3, result.output  # the daemon's exit code is the process's
    (settings,) = daemon.settings
    assert (settings.lock, settings.identity, settings.exit_on_loss) == ("orders", "pod-1", True)
    timing = settings.timing
    assert (timing.ttl_s, timing.renew_interval_s, timing.renew_deadline_s) == (60.0, 10.0, 40.0)
    assert timing.request_timeout_s == 0.5
    assert settings.redis.url == "redis://127.0.0.1:1/2"
    assert settings.redis.password_file == password_file
    assert (settings.http.host, settings.http.port) == ("127.0.0.1", 0)
    assert (settings.logs.format, settings.logs.level) == ("json", "warning")


def test_env_vars_set_every_run_option(daemon: DaemonCalls, tmp_path: Path) -> None:
    password_file = tmp_path / "password"
    password_file.write_text("s3cret")
    env = {
        "ELECTOR_LOCK": "orders",
        "ELECTOR_IDENTITY": "pod-2",
        "ELECTOR_TTL": "30s",
        "ELECTOR_RENEW_INTERVAL": "5s",
        "ELECTOR_RENEW_DEADLINE": "20s",
        "ELECTOR_REQUEST_TIMEOUT": "250ms",
        "ELECTOR_HTTP_ADDRESS": ":9100",
        "ELECTOR_REDIS_URL": "redis://127.0.0.1:1/3",
        "ELECTOR_REDIS_PASSWORD_FILE": str(password_file),
        "ELECTOR_LOG_FORMAT": "console",
        "ELECTOR_LOG_LEVEL": "debug",
        "ELECTOR_EXIT_ON_LOSS": "true",
    }
    result = invoke(["run"], env=env)
    assert result.exit_code == 0, result.output
    (settings,) = daemon.settings
    assert (settings.lock, settings.identity, settings.exit_on_loss) == ("orders", "pod-2", True)
    assert (settings.timing.ttl_s, settings.timing.renew_interval_s) == (30.0, 5.0)
    assert (settings.timing.renew_deadline_s, settings.timing.request_timeout_s) == (20.0, 0.25)
    assert (settings.http.host, settings.http.port) == ("0.0.0.0", 9100)
    assert settings.redis.url == "redis://127.0.0.1:1/3"
    assert settings.redis.password_file == password_file
    assert (settings.logs.format, settings.logs.level) == ("console", "debug")


def test_command_line_wins_over_env(daemon: DaemonCalls) -> None:
    result = invoke(
        ["run", "--lock", "cli-lock", "--ttl", "2s"], env={"ELECTOR_LOCK": "env", "ELECTOR_TTL": "5s"}
    )
    assert result.exit_code == 0, result.output
    (settings,) = daemon.settings
    assert (settings.lock, settings.timing.ttl_s) == ("cli-lock", 2.0)


def test_renew_deadline_inside_the_margin_is_valid(daemon: DaemonCalls) -> None:
    # 9s + 105ms (1% of 10s + 5ms) < 10s: allowed by the documented invariant.
    result = invoke(["run", "--lock", "x", "--renew-deadline", "9s", "--ttl", "10s"])
    assert result.exit_code == 0, result.output
    assert daemon.settings[0].timing.renew_deadline_s == 9.0


def test_identity_defaults_to_pod_name(daemon: DaemonCalls, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAME", "web-3")
    result = invoke(["run", "--lock", "x"])
    assert result.exit_code == 0, result.output
    assert daemon.settings[0].identity == "web-3"


# --- help and version -------------------------------------------------------------------------

RUN_ENV_VARS = [
    "ELECTOR_REDIS_URL",
    "ELECTOR_REDIS_PASSWORD_FILE",
    "ELECTOR_REDIS_TLS_CA",
    "ELECTOR_REDIS_TLS_CERT",
    "ELECTOR_REDIS_TLS_KEY",
    "ELECTOR_MIN_REPLICAS_ACK",
    "ELECTOR_REPLICAS_ACK_TIMEOUT",
    "ELECTOR_REDIS_CLUSTER",
    "ELECTOR_REDLOCK_URL",
    "ELECTOR_LOCK",
    "ELECTOR_IDENTITY",
    "ELECTOR_TTL",
    "ELECTOR_RENEW_INTERVAL",
    "ELECTOR_RENEW_DEADLINE",
    "ELECTOR_REQUEST_TIMEOUT",
    "ELECTOR_HTTP_ADDRESS",
    "ELECTOR_COMPAT_HTTP_ADDRESS",
    "ELECTOR_LOG_FORMAT",
    "ELECTOR_LOG_LEVEL",
    "ELECTOR_EXIT_ON_LOSS",
    "ELECTOR_SHUTDOWN_LINGER",
    "ELECTOR_LOCKS_FILE",
    "ELECTOR_PREDECESSOR_LOCK",
    "ELECTOR_PRIORITY",
    "ELECTOR_LEADER_FILE",
    "ELECTOR_KILL_GRACE",
    "ELECTOR_ON_CHILD_EXIT",
    "ELECTOR_METRICS_PER_LOCK",
    "ELECTOR_COMPAT_API",
    "ELECTOR_APP_HEALTH_URL",
    "ELECTOR_APP_HEALTH_INTERVAL",
    "ELECTOR_APP_HEALTH_FAILURES",
    "ELECTOR_APP_HEALTH_TIMEOUT",
    "ELECTOR_APP_HEALTH_MIN_TERM",
]


def test_run_help_lists_every_option_with_its_env_var() -> None:
    result = invoke(["run", "--help"])
    assert result.exit_code == 0
    text = result.stdout
    for name in RUN_ENV_VARS:
        assert f"env var: {name}" in _flat(text), name
    # Every option of the command, derived from the command itself: shown, with its env var.
    run_command = cli.commands["run"]
    options = [p for p in run_command.params if isinstance(p, click.Option) and p.name != "help"]
    assert len(options) == len(RUN_ENV_VARS)
    for option in options:
        flag = option.opts[0]
        expected = "ELECTOR_" + flag.removeprefix("--").upper().replace("-", "_")
        assert option.envvar == expected
        assert re.search(rf"^\s*{re.escape(flag)}\b", text, re.MULTILINE), flag
        assert expected in text


def test_run_help_shows_the_exit_codes_and_duration_defaults() -> None:
    text = _flat(invoke(["run", "-h"]).stdout)
    assert "2 invalid settings" in text
    assert "3 leadership lost with --exit-on-loss" in text
    assert "default: 10s" in text
    assert "--ttl DURATION" in text


def test_version() -> None:
    result = invoke(["--version"])
    assert result.exit_code == 0
    assert result.stdout == f"elector, version {elector.__version__}\n"
    assert elector.__version__ == importlib.metadata.version("elector")


def test_top_level_help_lists_the_commands() -> None:
    result = invoke(["--help"])
    assert result.exit_code == 0
    for command in ("run", "status", "demo"):
        assert re.search(rf"^\s+{command}\b", result.stdout, re.MULTILINE), command


def test_unknown_command_exits_2() -> None:
    result = invoke(["elect"])
    assert result.exit_code == 2
    assert "No such command 'elect'" in result.stderr


# --- real processes: console script, python -m, exit codes -------------------------------------


def _run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=30,
        env=_clean_environ(),
        cwd=REPO,
        check=False,
        **kwargs,
    )


def test_console_script_version() -> None:
    assert ELECTOR_SCRIPT.is_file(), f"{ELECTOR_SCRIPT} is not installed (pip install -e .)"
    completed = _run([str(ELECTOR_SCRIPT), "--version"])
    assert completed.returncode == 0
    assert completed.stdout == f"elector, version {elector.__version__}\n"


def test_console_script_invalid_setting_exits_2_on_stderr() -> None:
    completed = _run([str(ELECTOR_SCRIPT), "run", "--lock", "x", "--ttl", "100ms"])
    assert completed.returncode == 2
    assert completed.stdout == ""
    assert "Usage: elector run" in completed.stderr
    assert "--ttl" in completed.stderr and "at least 500ms" in completed.stderr


def test_python_dash_m_invalid_setting_exits_2_on_stderr() -> None:
    completed = _run([sys.executable, "-m", "elector", "run", "--lock", "x", "--ttl", "100ms"])
    assert completed.returncode == 2
    assert completed.stdout == ""
    assert "Usage: elector run" in completed.stderr
    assert "invalid setting" in completed.stderr and "ttl must be at least 500ms" in completed.stderr
    assert "Traceback" not in completed.stderr


def test_python_dash_m_env_var_error_exits_2() -> None:
    env = {**_clean_environ(), "ELECTOR_LOCK": "{bad}"}
    completed = subprocess.run(
        [sys.executable, "-m", "elector", "run"],
        capture_output=True, text=True, timeout=30, env=env, cwd=REPO, check=False,
    )  # fmt: skip
    assert completed.returncode == 2
    assert "--lock" in completed.stderr and "'{bad}'" in completed.stderr


def test_run_stops_with_exit_0_on_sigterm(redis_server: RedisServerProcess, tmp_path: Path) -> None:
    """The exit-0 path end to end: a real daemon on a private Redis, stopped by SIGTERM."""
    log_path = tmp_path / "daemon.log"
    command = [
        sys.executable, "-m", "elector", "run",
        "--redis-url", redis_server.url,
        "--lock", "cli-e2e",
        "--identity", "e2e-1",
        "--ttl", "1s",
        "--http-address", "127.0.0.1:0",
        "--log-format", "json",
    ]  # fmt: skip
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=log, env=_clean_environ(), cwd=REPO)
    try:
        deadline = time.monotonic() + 15
        while '"started"' not in log_path.read_text() and time.monotonic() < deadline:
            assert process.poll() is None, log_path.read_text()
            time.sleep(0.05)
        assert '"started"' in log_path.read_text()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0, log_path.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    text = log_path.read_text()
    assert '"stopped"' in text and '"exit_code": 0' in text


# --- no kopf on the plain paths -------------------------------------------------------------------


def test_cli_and_app_do_not_import_kopf() -> None:
    completed = _run(
        [
            sys.executable,
            "-c",
            "import sys, elector.cli.main, elector.daemon.service; assert 'kopf' not in sys.modules",
        ]
    )
    assert completed.returncode == 0, completed.stderr


def test_help_does_not_import_kopf_even_when_installed(tmp_path: Path) -> None:
    # A stand-in kopf that is importable, so an import of it would show in sys.modules.
    (tmp_path / "kopf").mkdir()
    (tmp_path / "kopf" / "__init__.py").write_text("IMPORTED = True\n")
    script = f"""
import sys
sys.path.insert(0, {str(tmp_path)!r})
import kopf as probe  # proves the stand-in is importable
del sys.modules["kopf"], probe
import elector.cli.main, elector.daemon.service, elector.control.status, elector.cli.demo
from elector.cli.main import cli
for args in (["run", "--help"], ["status", "--help"], ["demo", "--help"], ["--version"]):
    try:
        cli(args, prog_name="elector")
    except SystemExit as exc:
        assert exc.code == 0, (args, exc.code)
assert "kopf" not in sys.modules, "kopf was imported"
print("no kopf")
"""
    completed = _run([sys.executable, "-c", script])
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.rstrip().endswith("no kopf")


# --- elector leader-file check --------------------------------------------------------------------


def _leader_file(path: Path, **content: Any) -> Path:
    path.write_text(json.dumps({"lock": "jobs", "identity": "pod-a", "state": "leader", **content}) + "\n")
    return path


@pytest.mark.parametrize(
    ("content", "code", "stdout", "stderr"),
    [
        ({"is_leader": True, "fencing_token": 7, "valid_until_ms": "AHEAD"}, 0, "leading: lock 'jobs'", ""),
        (
            {"is_leader": True, "fencing_token": 7, "valid_until_ms": "PAST"},
            1,
            "",
            "not leading: lock 'jobs': the",
        ),
        (
            {"is_leader": False, "fencing_token": None, "valid_until_ms": None},
            1,
            "",
            "not leading: lock 'jobs'",
        ),
        ({"is_leader": True, "fencing_token": 7}, 2, "", "error: "),  # an older elector's file
        ({"is_leader": "true", "valid_until_ms": None}, 2, "", "error: "),
    ],
)
def test_leader_file_check_exit_codes(
    tmp_path: Path, content: dict[str, Any], code: int, stdout: str, stderr: str
) -> None:
    now_ms = round(time.time() * 1000)
    moments = {"AHEAD": now_ms + 60_000, "PAST": now_ms - 1}
    if isinstance(content.get("valid_until_ms"), str):
        content = {**content, "valid_until_ms": moments[content["valid_until_ms"]]}
    result = CliRunner().invoke(
        cli, ["leader-file", "check", str(_leader_file(tmp_path / "l.json", **content))]
    )
    assert result.exit_code == code, result.output
    assert result.stdout.startswith(stdout) and result.stderr.startswith(stderr)
    assert (result.stdout + result.stderr).count("\n") == 1  # one line, whatever the verdict


@pytest.mark.parametrize(
    "args", [["leader-file", "check"], ["leader-file", "check", "a", "b"], ["leader-file", "probe"]]
)
def test_leader_file_check_bad_usage_or_unreadable_exits_2(tmp_path: Path, args: list[str]) -> None:
    assert CliRunner().invoke(cli, args).exit_code == 2
    for path in (tmp_path / "absent.json", tmp_path):
        result = CliRunner().invoke(cli, ["leader-file", "check", str(path)])
        assert result.exit_code == 2 and str(path) in result.stderr, result.output


def test_leader_file_check_imports_none_of_the_daemons_heavy_modules(tmp_path: Path) -> None:
    path = _leader_file(tmp_path / "l.json", is_leader=False, fencing_token=None, valid_until_ms=None)
    script = f"""
import sys
from elector.cli.main import cli
try:
    cli(["leader-file", "check", {str(path)!r}], prog_name="elector")
except SystemExit as exc:
    assert exc.code == 1, exc.code
heavy = ("redis", "aiohttp", "structlog", "prometheus_client", "elector.daemon.settings", "elector.election")
print(sorted(name for name in heavy if name in sys.modules))
"""
    completed = _run([sys.executable, "-c", script])
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.splitlines()[-1] == "[]"
