"""The settings' one declaration (elector/cli/options.py): durations, and that every command's
options, `build_settings` and the error messages agree on it."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from elector.cli.main import cli
from elector.cli.operator import OPERATOR_OPTIONS, OPERATOR_REDIS
from elector.cli.options import RUN_OPTIONS, Option, RedisConnection, parse_duration
from elector.daemon.logs import LOG_FORMATS, LOG_LEVELS
from elector.daemon.settings import RUN_SETTINGS, build_settings, flag_of

# --- durations -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("10s", 10.0),
        ("500ms", 0.5),
        ("1m", 60.0),
        ("1m30s", 90.0),
        ("1.5s", 1.5),
        ("0", 0.0),
        ("0.0", 0.0),
        ("2h", 7200.0),
        ("250us", 0.00025),
        ("250µs", 0.00025),
        (".5s", 0.5),
        ("1h2m3s", 3723.0),
        ("0s", 0.0),
        (" 10s ", 10.0),
    ],
)
def test_parse_duration_valid(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("text", ["10", "", "abc", "10x", "-1s", "1s2", "s", "   ", "10 parsecs", "1e3s"])
def test_parse_duration_invalid_gives_a_hint(text: str) -> None:
    with pytest.raises(ValueError, match="10s") as caught:
        parse_duration(text)
    # Not a bare float() error: the message is written for a person.
    assert "could not convert" not in str(caught.value)


def test_parse_duration_bare_number_suggests_units_for_that_number() -> None:
    with pytest.raises(ValueError, match="no unit") as caught:
        parse_duration("1.5")
    assert "1.5s" in str(caught.value) and "1.5ms" in str(caught.value)


# --- one declaration, everywhere ------------------------------------------------------------------


@pytest.fixture(autouse=True)
def no_elector_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [key for key in os.environ if key.startswith("ELECTOR_")]:
        monkeypatch.delenv(key)


def test_run_declares_exactly_the_settings_build_settings_takes() -> None:
    # `run` passes its parameters through: a setting added on one side only fails here.
    assert {option.name for option in RUN_OPTIONS} | {"command"} == RUN_SETTINGS
    command = cli.commands["run"]
    assert [p.name for p in command.params if isinstance(p, click.Option) and p.name != "help"] == [
        option.name for option in RUN_OPTIONS
    ]


def test_run_defaults_are_build_settings_defaults() -> None:
    """The command line's defaults, as the command gets them, are those a program calling
    `build_settings` gets: the daemon behaves the same either way."""
    command = cli.commands["run"]
    with command.make_context("run", ["--lock", "x"]) as ctx:
        given = ctx.params
    for name, parameter in inspect.signature(build_settings).parameters.items():
        if parameter.default is not inspect.Parameter.empty:
            assert given[name] == parameter.default, name


def test_flags_and_variables_follow_from_the_name() -> None:
    option = Option("replicas_ack_timeout")
    assert (option.flag, option.envvar) == ("--replicas-ack-timeout", "ELECTOR_REPLICAS_ACK_TIMEOUT")
    assert Option("ttl", from_env=False).envvar is None
    for declared in (*RUN_OPTIONS, *OPERATOR_REDIS, *OPERATOR_OPTIONS):
        # The daemon's errors name a setting by the same rule.
        assert declared.flag == flag_of(declared.name)


def test_the_operator_shares_the_declarations_it_shows_differently() -> None:
    by_name = {option.name: option for option in RUN_OPTIONS}
    for option in (*OPERATOR_REDIS, *OPERATOR_OPTIONS):
        if option.name in by_name:
            shared = by_name[option.name]
            assert (option.flag, option.envvar) == (shared.flag, shared.envvar)
    ttl = next(option for option in OPERATOR_OPTIONS if option.name == "ttl")
    assert ttl.type is by_name["ttl"].type  # a DURATION, no longer a string parsed by hand


def test_the_log_choices_are_the_log_settings() -> None:
    choices = {option.name: option.type.choices for option in (*RUN_OPTIONS, *OPERATOR_OPTIONS)
               if option.name.startswith("log_")}  # fmt: skip
    assert set(choices["log_format"]) == set(LOG_FORMATS)
    levels = next(o.type.choices for o in OPERATOR_OPTIONS if o.name == "log_level")
    assert set(levels) == set(LOG_LEVELS)


def test_tls_files_become_the_urls_ssl_options() -> None:
    connection = RedisConnection("rediss://h:6380/0#x", None, Path("/c a.pem"), None, Path("/k.pem"))
    assert connection.url_with_tls() == "rediss://h:6380/0?ssl_ca_certs=%2Fc+a.pem&ssl_keyfile=%2Fk.pem#x"
    assert RedisConnection("redis://h", None, None, None, None).url_with_tls() == "redis://h"
    settings = connection.settings()
    assert (settings.tls_ca_file, settings.tls_key_file, settings.url) == (
        Path("/c a.pem"),
        Path("/k.pem"),
        connection.url,
    )


def test_a_bad_variable_is_named_with_its_flag() -> None:
    result = CliRunner().invoke(cli, ["operator"], env={"ELECTOR_TTL": "10", "ELECTOR_NAMESPACE": "apps"})
    assert result.exit_code == 2
    assert "--ttl" in result.stderr and "no unit" in result.stderr
    result = CliRunner().invoke(cli, ["operator", "--namespace", "apps"], env={"ELECTOR_LOCK": "a b"})
    assert result.exit_code == 2
    assert "invalid setting --lock (set by ELECTOR_LOCK): 'a b' is not a valid lock name" in " ".join(
        result.stderr.split()
    )


def test_the_options_module_is_light() -> None:
    heavy = ("redis", "aiohttp", "structlog", "elector.daemon.settings")
    code = f"import sys, elector.cli.options; sys.exit(1 if [m for m in {heavy} if m in sys.modules] else 0)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
