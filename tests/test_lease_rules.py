"""The domain's rules of lock names, identities, priorities and ttls (elector/lease.py), and the
promise that comes with keeping them there: the library and the daemon refuse the same values
with the same words, naming the setting each its own way."""

from __future__ import annotations

import dataclasses
import os
import socket
from typing import Any

import pytest
from click.testing import CliRunner

import elector.daemon.service
from elector import Elector, ElectorConfigError
from elector.cli.main import cli
from elector.daemon.settings import SettingsError, build_settings
from elector.lease import (
    MAX_PRIORITY,
    MIN_PRIORITY,
    InvalidValueError,
    check_identity,
    check_lock_name,
    check_priority,
    check_ttl,
    default_identity,
)

# --- lock names ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["app", "a", "0lock", "my-app", "team/app.v2", "ns:app@prod", "A_b-c.d", "x" * 200]
)
def test_typical_lock_names_pass(name: str) -> None:
    assert check_lock_name(name) == name


@pytest.mark.parametrize(
    "name",
    ["", "{x}", "a{b", "a}b", "a b", " a", "a\tb", "a\nb", "abc\n", "a\x00b", "a\x1bb", "-leading-dash",
     ".hidden", "x" * 201, "ünicode", None, 7],
    ids=repr,
)  # fmt: skip
def test_lock_names_that_cannot_be_a_key_are_refused(name: object) -> None:
    with pytest.raises(InvalidValueError) as caught:
        check_lock_name(name)
    assert caught.value.setting == "lock"
    assert str(caught.value).startswith(f"{name!r} is not a valid lock name: 1-200 characters")


# --- identities -----------------------------------------------------------------------------------


@pytest.mark.parametrize("identity", ["pod-0", "web-7f9c-abcde", "réplica 1", "i" * 253])
def test_identities_pass(identity: str) -> None:
    assert check_identity(identity) == identity


@pytest.mark.parametrize(
    ("identity", "message"),
    [
        ("", "must be 1-253 characters, got 0"),
        ("i" * 254, "must be 1-253 characters, got 254"),
        (" pod", "' pod' has control characters or surrounding blanks"),
        ("pod ", "'pod ' has control characters or surrounding blanks"),
        ("pod\n", "'pod\\n' has control characters or surrounding blanks"),
        ("pod\x1b[31m", "control characters"),
        (None, "must be a str, got None"),
    ],
    ids=repr,
)
def test_bad_identities_are_refused(identity: object, message: str) -> None:
    with pytest.raises(InvalidValueError) as caught:
        check_identity(identity)
    assert caught.value.setting == "identity"
    assert message in str(caught.value)


def test_default_identity_prefers_pod_name() -> None:
    assert default_identity({"POD_NAME": "web-0", "HOSTNAME": "ignored"}) == "web-0"


@pytest.mark.parametrize("environ", [{}, {"POD_NAME": ""}])
def test_default_identity_falls_back_to_the_host_name(environ: dict[str, str]) -> None:
    assert default_identity(environ) == socket.gethostname()


def test_default_identity_reads_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAME", "from-env-0")
    assert default_identity() == "from-env-0"
    monkeypatch.delenv("POD_NAME")
    assert default_identity() == socket.gethostname()


# --- priorities and the ttl's bound -------------------------------------------------------------


@pytest.mark.parametrize("priority", [MIN_PRIORITY, -1, 0, 5, MAX_PRIORITY])
def test_priorities_in_range_pass(priority: int) -> None:
    assert check_priority(priority) == priority


@pytest.mark.parametrize(
    ("priority", "message"),
    [
        (MAX_PRIORITY + 1, "must be between -1000000 and 1000000, got 1000001"),
        (MIN_PRIORITY - 1, "must be between -1000000 and 1000000, got -1000001"),
        (2 * 10**9, "got 2000000000"),
        (True, "must be an int, got True"),
        ("5", "must be an int, got '5'"),
        (1.0, "must be an int, got 1.0"),
    ],
)
def test_priorities_out_of_range_or_not_ints_are_refused(priority: object, message: str) -> None:
    with pytest.raises(InvalidValueError) as caught:
        check_priority(priority)
    assert caught.value.setting == "priority"
    assert message in str(caught.value)


def test_a_ttl_of_a_day_passes_and_a_longer_one_does_not() -> None:
    assert check_ttl(86_400.0) == 86_400.0
    with pytest.raises(InvalidValueError) as caught:
        check_ttl(86_401.0)
    assert (caught.value.setting, str(caught.value)) == ("ttl", "ttl must be at most 24h, got 86401s")


# --- the same words in the library and the daemon ----------------------------------------------

GOOD_ELECTOR: dict[str, Any] = {"lock": "jobs", "redis": "redis://localhost:6379/0", "identity": "pod-a"}
GOOD_SETTINGS: dict[str, Any] = {"lock": "jobs", "identity": "pod-a", "redis_url": "redis://localhost:6379/0"}
GOOD_ARGV = ["--lock", "jobs", "--identity", "pod-a"]


@dataclasses.dataclass(frozen=True)
class BadValue:
    """One bad value, as `Elector(parameter=value)`, `build_settings(setting=value)` and
    `elector run flag text` take it."""

    parameter: str
    setting: str
    value: object
    flag: str
    text: str


SAME_BAD_VALUES = {
    "lock": BadValue("lock", "lock", "a b", "--lock", "a b"),
    "identity": BadValue("identity", "identity", " pod", "--identity", " pod"),
    "priority": BadValue("priority", "priority", 2 * 10**9, "--priority", "2000000000"),
    "ttl": BadValue("ttl_s", "ttl", 25 * 3600.0, "--ttl", "25h"),
    "redis-port": BadValue("redis", "redis_url", "redis://h:0", "--redis-url", "redis://h:0"),
    "redis-db": BadValue("redis", "redis_url", "redis://h/abc", "--redis-url", "redis://h/abc"),
}


@pytest.mark.parametrize("bad", SAME_BAD_VALUES.values(), ids=SAME_BAD_VALUES.keys())
def test_the_library_and_the_daemon_refuse_a_bad_value_with_the_same_message(
    monkeypatch: pytest.MonkeyPatch, bad: BadValue
) -> None:
    with pytest.raises(ElectorConfigError) as library:
        Elector(**(GOOD_ELECTOR | {bad.parameter: bad.value}))
    with pytest.raises(SettingsError) as daemon:
        build_settings(**(GOOD_SETTINGS | {bad.setting: bad.value}))
    assert library.value.parameter == bad.parameter and daemon.value.setting == bad.flag
    message = str(library.value).removeprefix(f"{bad.parameter}: ")
    assert message != str(library.value), "the library names the parameter in front"
    assert str(daemon.value) == f"{bad.flag}: {message}"
    # ...and the command line says it with the same words.
    for key in [key for key in os.environ if key.startswith("ELECTOR_")]:
        monkeypatch.delenv(key)
    started: list[object] = []
    monkeypatch.setattr(elector.daemon.service, "run_daemon", started.append)
    result = CliRunner().invoke(cli, ["run", *GOOD_ARGV, bad.flag, bad.text])
    assert result.exit_code == 2 and started == [], result.output
    assert f"invalid setting {bad.flag}: {message}" in " ".join(result.stderr.split())


def test_an_out_of_range_priority_is_refused_when_the_elector_is_made() -> None:
    """Not at run time, as a ValueError of the backend that crashed the election."""
    with pytest.raises(ElectorConfigError, match=r"^priority: must be between -1000000 and 1000000") as info:
        Elector(**GOOD_ELECTOR, priority=2 * 10**9)
    assert info.value.parameter == "priority"
    assert Elector(**GOOD_ELECTOR, priority=MAX_PRIORITY).lock == "jobs"
