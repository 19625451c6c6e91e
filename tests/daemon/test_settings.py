"""The daemon's settings: `build_settings` and the flags its errors name.

The rules themselves (lock names, identities, priorities, the ttl's bound) are the domain's and
tested in tests/test_lease_rules.py; durations are parsed by the command line (tests/cli).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from elector.daemon.settings import (
    RUN_SETTINGS,
    SettingsError,
    build_settings,
    flag_of,
    validate_identity,
    validate_lock_name,
)

# Never contacted: build_settings only checks the URL's shape.
UNREACHABLE_URL = "redis://127.0.0.1:1/0"


def _settings(**overrides: Any) -> Any:
    kwargs: dict[str, Any] = {"lock": "app", "identity": "pod-0", "redis_url": UNREACHABLE_URL}
    kwargs.update(overrides)
    return build_settings(**kwargs)


# --- the domain's rules, naming the daemon's flags ----------------------------------------


@pytest.mark.parametrize("name", ["{x}", "a b", "x" * 201])
def test_a_bad_lock_name_names_the_lock_flag(name: str) -> None:
    with pytest.raises(SettingsError) as caught:
        validate_lock_name(name)
    assert (caught.value.names, caught.value.setting) == (("lock",), "--lock")
    assert str(caught.value).startswith("--lock: ")
    assert "1-200 characters" in str(caught.value)


@pytest.mark.parametrize(("identity", "fragment"), [("", "got 0"), ("pod\n", "control characters")])
def test_a_bad_identity_names_the_identity_flag(identity: str, fragment: str) -> None:
    with pytest.raises(SettingsError, match=r"^--identity: ") as caught:
        validate_identity(identity)
    assert caught.value.setting == "--identity"
    assert fragment in str(caught.value)


def test_good_names_pass_unchanged() -> None:
    assert validate_lock_name("team/app.v2") == "team/app.v2"
    assert validate_identity("réplica 1") == "réplica 1"


def test_every_setting_has_a_flag_of_its_own() -> None:
    flags = {flag_of(name) for name in RUN_SETTINGS}
    assert len(flags) == len(RUN_SETTINGS)
    assert {"--ttl", "--redis-tls-ca", "--redlock-url", "--kill-grace", "--lock"} <= flags


# --- build_settings -----------------------------------------------------------------------


def test_build_settings_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAME", "pod-from-downward-api")
    settings = build_settings(lock="app", identity=None, redis_url=UNREACHABLE_URL)
    assert settings.lock == "app"
    assert settings.identity == "pod-from-downward-api"
    timing = settings.timing
    assert timing.ttl_s == 10.0
    assert timing.ttl_ms == 10_000
    assert timing.renew_interval_s == pytest.approx(3.0)
    assert timing.renew_deadline_s == pytest.approx(6.667, abs=0.001)
    assert timing.request_timeout_s == pytest.approx(1.0)
    # The Redis client uses the election's per-request timeout.
    assert settings.redis.request_timeout_s == pytest.approx(1.0)
    assert settings.redis.url == UNREACHABLE_URL
    assert settings.redis.password_file is None
    assert (settings.http.host, settings.http.port) == ("0.0.0.0", 8080)
    assert (settings.logs.format, settings.logs.level) == ("auto", "info")
    assert settings.exit_on_loss is False


def test_build_settings_derives_a_short_request_timeout_from_a_short_ttl() -> None:
    settings = _settings(ttl=1.0)
    assert settings.timing.renew_interval_s == pytest.approx(0.3)
    assert settings.timing.request_timeout_s == pytest.approx(0.15)
    assert settings.redis.request_timeout_s == pytest.approx(0.15)


def test_build_settings_keeps_explicit_values(tmp_path: Path) -> None:
    password_file = tmp_path / "password"
    password_file.write_text("s3cret\n")
    settings = _settings(
        ttl=30.0,
        renew_interval=5.0,
        renew_deadline=20.0,
        request_timeout=0.5,
        redis_password_file=password_file,
        http_address="127.0.0.1:9090",
        log_format="json",
        log_level="debug",
        exit_on_loss=True,
    )
    assert (settings.timing.ttl_s, settings.timing.renew_interval_s) == (30.0, 5.0)
    assert (settings.timing.renew_deadline_s, settings.timing.request_timeout_s) == (20.0, 0.5)
    assert settings.redis.request_timeout_s == 0.5
    assert settings.redis.read_password() == "s3cret"
    assert (settings.http.host, settings.http.port) == ("127.0.0.1", 9090)
    assert (settings.logs.format, settings.logs.level) == ("json", "debug")
    assert settings.exit_on_loss is True


def test_renew_deadline_within_the_safety_margin_is_accepted() -> None:
    # 9s + (1% of 10s + 5ms) < 10s: valid by the documented invariant.
    assert _settings(ttl=10.0, renew_deadline=9.0).timing.renew_deadline_s == 9.0


def _empty_file(tmp_path: Path) -> Path:
    path = tmp_path / "empty-password"
    path.write_text("\n")
    return path


@pytest.mark.parametrize(
    ("overrides", "setting", "fragment"),
    [
        pytest.param({"ttl": 0.1}, "--ttl", "at least 500ms", id="ttl-too-short"),
        pytest.param({"ttl": 3.0, "renew_interval": 5.0}, "--renew-interval", "5000ms", id="interval"),
        pytest.param(
            {"renew_deadline": 1.0, "renew_interval": 2.0},
            "--renew-deadline",
            "must be longer than the renew interval",
            id="deadline-below-interval",
        ),
        pytest.param({"renew_deadline": 9.95}, "--renew-deadline", "safety margin", id="deadline-margin"),
        pytest.param({"request_timeout": 5.0}, "--request-timeout", "request timeout", id="request-timeout"),
        pytest.param({"redis_url": "http://x"}, "--redis-url", "redis://", id="url-scheme"),
        pytest.param({"redis_url": "redis://h:99999"}, "--redis-url", "invalid port", id="url-port"),
        pytest.param({"redis_url": "redis:///0"}, "--redis-url", "no host", id="url-no-host"),
        pytest.param({"redis_url": "unix://"}, "--redis-url", "socket path", id="url-unix-no-path"),
        pytest.param(
            {"redis_password_file": Path("/nonexistent/password")},
            "--redis-password-file",
            "/nonexistent/password",
            id="password-file-missing",
        ),
        pytest.param({"http_address": "nonsense"}, "--http-address", "no port", id="http-no-port"),
        pytest.param({"http_address": ":70000"}, "--http-address", "out of range", id="http-port"),
        pytest.param({"lock": "{x}"}, "--lock", "'{x}'", id="lock"),
        pytest.param({"identity": ""}, "--identity", "got 0", id="identity"),
        pytest.param({"log_format": "xml"}, "--log-format", "xml", id="log-format"),
        pytest.param({"log_level": "trace"}, "--log-level", "trace", id="log-level"),
    ],
)
def test_build_settings_names_the_bad_setting(overrides: dict[str, Any], setting: str, fragment: str) -> None:
    with pytest.raises(SettingsError) as caught:
        _settings(**overrides)
    error = caught.value
    assert isinstance(error, ValueError)
    assert setting in error.setting
    assert str(error).startswith(f"{error.setting}: ")
    assert fragment in str(error)


def test_build_settings_empty_password_file(tmp_path: Path) -> None:
    with pytest.raises(SettingsError) as caught:
        _settings(redis_password_file=_empty_file(tmp_path))
    assert caught.value.setting == "--redis-password-file"
    assert "empty" in str(caught.value)


@pytest.mark.parametrize(
    ("kwargs", "flags", "default_note"),
    [
        ({"ttl": 0.1}, "--ttl", None),
        ({"ttl": 3.0, "renew_interval": 5.0}, "--renew-deadline, --renew-interval", "2/3 of the ttl"),
        ({"ttl": 10.0, "request_timeout": 5.0}, "--request-timeout, --renew-interval", "0.3 x ttl"),
        ({"ttl": 10.0, "renew_deadline": 9.95}, "--renew-deadline, --ttl", None),
    ],
)
def test_build_settings_timing_error_names_exactly_the_flags_involved(
    kwargs: dict[str, float], flags: str, default_note: str | None
) -> None:
    with pytest.raises(SettingsError) as caught:
        _settings(**kwargs)
    assert caught.value.setting == flags
    if default_note is not None:
        assert f"defaults to {default_note}" in str(caught.value)
    else:
        assert "defaults to" not in str(caught.value)


def test_build_settings_never_shows_the_url_password() -> None:
    with pytest.raises(SettingsError) as caught:
        _settings(redis_url="redis://user:hunter2@h:99999/0")
    assert caught.value.setting == "--redis-url"
    assert "hunter2" not in str(caught.value)
    assert "user:***@h:99999" in str(caught.value)


def test_bad_url_mentioning_password_file_is_still_blamed_on_the_url() -> None:
    with pytest.raises(SettingsError) as caught:
        _settings(redis_url="http://password file")
    assert caught.value.setting == "--redis-url"


def test_bad_url_query_option_is_an_invalid_setting() -> None:
    with pytest.raises(SettingsError) as caught:
        _settings(redis_url="redis://127.0.0.1:1/0?socket_timeout=abc")
    assert caught.value.setting == "--redis-url"


# -- many locks, exec mode, leader file ----------------------------------------------------------


def test_several_locks_and_a_locks_file(tmp_path: Path) -> None:
    listing = tmp_path / "locks"
    listing.write_text("# nightly jobs\nreport-a\n\n  report-b  # the second\n")
    settings = build_settings(lock=["main"], locks_file=listing, identity="pod", redis_url=UNREACHABLE_URL)
    assert settings.locks == ("main", "report-a", "report-b")
    assert settings.lock == "main"


def test_a_bad_name_in_the_locks_file_names_file_and_line(tmp_path: Path) -> None:
    listing = tmp_path / "locks"
    listing.write_text("ok\nnot ok\n")
    with pytest.raises(SettingsError, match=r"--locks-file: .*locks:2: .*'not ok'"):
        build_settings(lock=[], locks_file=listing, identity="pod", redis_url=UNREACHABLE_URL)


def test_no_lock_at_all_is_refused() -> None:
    with pytest.raises(SettingsError, match="--lock: give at least one lock name"):
        build_settings(lock=[], identity="pod", redis_url=UNREACHABLE_URL)


@pytest.mark.parametrize(
    ("ttl_s", "expected_grace_s"),
    [(10.0, 2.0), (3.0, 0.6), (1.0, 0.2)],
)
def test_exec_mode_default_kill_grace_is_a_fifth_of_the_ttl_and_counts_in_the_margin(
    ttl_s: float, expected_grace_s: float
) -> None:
    settings = build_settings(
        lock="x", identity="pod", redis_url=UNREACHABLE_URL, ttl=ttl_s, command=["true"]
    )
    assert settings.exec is not None
    assert settings.exec.kill_grace_s == pytest.approx(expected_grace_s)
    timing = settings.timing
    # The command is gone (grace + reap slack) before the lease can expire on Redis.
    assert timing.renew_deadline_s + timing.safety_margin_s <= timing.ttl_s
    assert timing.stop_work_s == pytest.approx(expected_grace_s + 0.1)


def test_default_kill_grace_shrinks_to_fit_a_late_renew_deadline() -> None:
    settings = build_settings(
        lock="x",
        identity="pod",
        redis_url=UNREACHABLE_URL,
        ttl=10.0,
        renew_deadline=8.5,
        command=["true"],
    )
    assert settings.exec is not None
    assert settings.exec.kill_grace_s == pytest.approx(10 - 8.5 - 0.1 - 0.005 - 0.1)


def test_kill_grace_that_does_not_fit_says_how_much_does() -> None:
    with pytest.raises(
        SettingsError, match=r"--kill-grace: a kill grace of 5000ms does not fit.* at most 3128ms"
    ):
        build_settings(
            lock="x",
            identity="pod",
            redis_url=UNREACHABLE_URL,
            ttl=10.0,
            kill_grace=5.0,
            command=["true"],
        )


def test_leader_file_template_is_filled_per_lock(tmp_path: Path) -> None:
    settings = build_settings(
        lock=["a", "team/b"],
        identity="pod",
        redis_url=UNREACHABLE_URL,
        leader_file=str(tmp_path / "{lock}.json"),
    )
    assert settings.leader_file_for("team/b") == tmp_path / "team_b.json"
    # A leader file adds its update to the stop-work time.
    assert settings.timing.stop_work_s == pytest.approx(0.1)
