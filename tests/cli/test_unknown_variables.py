"""An `ELECTOR_*` variable that is no setting stops `elector run` and `elector operator` (exit 2),
naming it and the closest setting: `ELECTOR_TLL=5s` used to leave the default ttl in force.

The variables that are set legitimately without being settings (the app container's
ELECTOR_LEADER_URL, exec mode's ELECTOR_FENCING_TOKEN, test hooks) are listed in
`elector.cli.options.NOT_SETTINGS`; a scan of the repository keeps that list complete, so a new
tool variable exported in a developer's shell never stops a daemon.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import elector.daemon.service
from elector.cli.main import cli
from elector.cli.options import NOT_SETTINGS, unknown_variables
from elector.daemon.settings import Settings
from elector.daemon.testing_hooks import BLOCK_LOOP_ENV
from elector.testing.redis_server import ENV_VAR as REDIS_SERVER_ENV

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def no_daemon(monkeypatch: pytest.MonkeyPatch) -> list[Settings]:
    """`elector run` never starts a daemon here; the process's own ELECTOR_* variables are cleared."""
    for key in list(os.environ):
        if key.startswith("ELECTOR_"):
            monkeypatch.delenv(key)
    started: list[Settings] = []
    monkeypatch.setattr(elector.daemon.service, "run_daemon", lambda settings: started.append(settings) or 0)
    return started


def _one_line(text: str) -> str:
    return " ".join(text.split())


def test_a_mistyped_variable_stops_run_naming_it_and_the_closest_setting(no_daemon: list[Settings]) -> None:
    result = CliRunner().invoke(cli, ["run", "--lock", "jobs"], env={"ELECTOR_TLL": "5s"})
    assert result.exit_code == 2, result.output
    message = _one_line(result.stderr)
    assert "ELECTOR_TLL is no setting of `elector run` (did you mean ELECTOR_TTL?)" in message, message
    assert no_daemon == []


def test_every_unknown_variable_is_named_at_once() -> None:
    env = {"ELECTOR_REDIS_UR": "redis://r", "ELECTOR_RENEW_DEADLNE": "3s", "ELECTOR_FOO": "1"}
    result = CliRunner().invoke(cli, ["run", "--lock", "jobs"], env=env)
    assert result.exit_code == 2
    message = _one_line(result.stderr)
    assert "ELECTOR_REDIS_UR is no setting of `elector run` (did you mean ELECTOR_REDIS_URL?)" in message
    assert "(did you mean ELECTOR_RENEW_DEADLINE?)" in message
    assert "ELECTOR_FOO is no setting of `elector run`;" in message or message.count("ELECTOR_FOO") == 1


def test_a_setting_of_another_command_is_named_as_its() -> None:
    result = CliRunner().invoke(cli, ["run", "--lock", "jobs"], env={"ELECTOR_ALL_NAMESPACES": "true"})
    assert result.exit_code == 2
    assert "ELECTOR_ALL_NAMESPACES is a setting of `elector operator`, not of `elector run`" in _one_line(
        result.stderr
    )


def test_the_operator_refuses_an_unknown_variable_too() -> None:
    result = CliRunner().invoke(cli, ["operator"], env={"ELECTOR_NAMESPACES": "apps"})
    assert result.exit_code == 2
    assert "ELECTOR_NAMESPACES is no setting of `elector operator` (did you mean ELECTOR_NAMESPACE?)" in (
        _one_line(result.stderr)
    )
    result = CliRunner().invoke(cli, ["operator"], env={"ELECTOR_PRIORITY": "3"})
    assert result.exit_code == 2
    assert "ELECTOR_PRIORITY is a setting of `elector run`, not of `elector operator`" in _one_line(
        result.stderr
    )


def test_variables_that_are_no_setting_but_legitimate_do_not_stop_run(no_daemon: list[Settings]) -> None:
    env = dict.fromkeys(NOT_SETTINGS, "x")
    env["ELECTOR_TTL"] = "5s"
    result = CliRunner().invoke(cli, ["run", "--lock", "jobs"], env=env)
    assert result.exit_code == 0, result.output
    assert [settings.timing.ttl_s for settings in no_daemon] == [5.0]


def test_the_list_names_the_hooks_by_their_constants() -> None:
    assert {BLOCK_LOOP_ENV, REDIS_SERVER_ENV, "ELECTOR_LEADER_URL"} <= set(NOT_SETTINGS)
    assert all(re.fullmatch(r"ELECTOR_[A-Z0-9_]+", name) for name in NOT_SETTINGS)


def test_no_listed_variable_is_a_setting_of_the_checked_commands() -> None:
    """A name both listed and a setting of `run` or `operator` would be listed for nothing.
    (ELECTOR_REDIS_SERVER is `elector demo`'s setting and the test hook of every command.)"""
    for command in (cli.commands["run"], cli.commands["operator"]):
        assert unknown_variables(command, dict.fromkeys(NOT_SETTINGS, "")) == []
        variables = {param.envvar for param in command.params if isinstance(param.envvar, str)}
        assert not variables & set(NOT_SETTINGS), command.name


#: How the repository reads a variable from an environment (a constant, a lookup, a shell expansion).
_READS = re.compile(
    r"""(?:environ(?:\.get)?\(?\[?\s*|getenv\(\s*|envvar\s*=\s*|ENV(?:_VAR)?\s*=\s*|[A-Z_]+_ENV\s*=\s*)["'](ELECTOR_[A-Z0-9_]+)["']"""
    r"""|\$\{?(ELECTOR_[A-Z0-9_]+)"""
)
#: Given by tests to a child that is no `elector run` (the exec-mode supervisor's own test).
_CHILD_ONLY = {"ELECTOR_TEST_ROLE", "ELECTOR_TEST_INHERITED"}


def test_every_variable_the_repository_reads_is_a_setting_or_listed() -> None:
    """A tool variable added without being listed would stop every `elector run` of a developer
    who exports it; a setting renamed in the code but not in a script shows here too."""
    settings = {
        param.envvar
        for command in cli.commands.values()
        for param in command.params
        if isinstance(param.envvar, str)
    }
    read: dict[str, set[str]] = {}
    for top in ("elector", "tests", "bench", "scripts", "helm", "docs", "deploy"):
        for path in (REPO / top).rglob("*"):
            if path.suffix not in {".py", ".sh", ".tpl", ".yaml", ".md", ".txt"} or ".venv" in path.parts:
                continue
            for match in _READS.finditer(path.read_text(errors="replace")):
                read.setdefault(match.group(1) or match.group(2), set()).add(str(path.relative_to(REPO)))
    assert (
        "ELECTOR_TESTING_BLOCK_LOOP_ON_SIGUSR2_S" in read and "ELECTOR_LEADER_URL" in read
    )  # the scan works
    unaccounted = {
        name: sorted(paths)
        for name, paths in read.items()
        if name not in settings and name not in NOT_SETTINGS and name not in _CHILD_ONLY
    }
    assert unaccounted == {}, "add these to elector.cli.options.NOT_SETTINGS (or make them settings)"


def test_the_console_script_exits_2_on_an_unknown_variable() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ELECTOR_")}
    env["ELECTOR_TLL"] = "5s"
    completed = subprocess.run(
        [str(Path(sys.executable).with_name("elector")), "run", "--lock", "jobs"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert completed.returncode == 2, completed.stderr
    assert "ELECTOR_TLL" in completed.stderr and "ELECTOR_TTL" in completed.stderr
