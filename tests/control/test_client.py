"""What `elector status` and `elector handoff` share (elector/control/client.py): one error type the
CLI tells apart by `usage`, the flag a bad setting is reported under, names made safe to print."""

from __future__ import annotations

from pathlib import Path

import pytest

from elector.control.client import ControlError, printable, redis_settings, run_command, who
from elector.control.handoff import HandoffError
from elector.control.status import StatusError
from elector.lease import BackendErrorKind, Holder, LeaseBackendError


def test_both_commands_errors_are_control_errors_with_a_usage_flag() -> None:
    for error in (StatusError, HandoffError):
        exc = error("bad", usage=True)
        assert isinstance(exc, ControlError) and exc.usage and str(exc) == "bad"
        assert error("redis down").usage is False


def test_names_read_from_redis_are_printed_with_control_characters_escaped() -> None:
    assert printable("pod-a") == "pod-a"
    assert printable("pod\x1b[2Ja\n") == "pod\\x1b[2Ja\\n"
    assert who(Holder(identity="evil\r", fencing_token=7)) == "evil\\r (fencing token 7)"


@pytest.mark.parametrize(
    ("kwargs", "timeout_flag", "flag"),
    [
        ({"redis_url": "http://x"}, "--timeout", "--redis-url"),
        ({"password_file": Path("/nonexistent/password")}, "--timeout", "--redis-password-file"),
        ({"request_timeout_s": 0.0}, "--timeout", "--timeout"),
        # `elector handoff`'s --timeout is the wait for the handoff, not a request timeout.
        ({"request_timeout_s": 0.0}, None, "--redis-url"),
    ],
)
def test_a_bad_setting_is_a_usage_error_naming_the_commands_flag(
    kwargs: dict[str, object], timeout_flag: str | None, flag: str
) -> None:
    arguments: dict[str, object] = {"redis_url": "redis://localhost:6379/0", "password_file": None}
    arguments |= {"request_timeout_s": 1.0} | kwargs
    with pytest.raises(StatusError) as info:
        redis_settings(**arguments, timeout_flag=timeout_flag, error=StatusError)  # type: ignore[arg-type]
    assert info.value.usage and str(info.value).startswith(f"invalid setting {flag}: ")


def test_a_redis_failure_names_the_server_without_its_password() -> None:
    async def failing() -> None:
        raise LeaseBackendError("connection refused", kind=BackendErrorKind.CONNECTION)

    with pytest.raises(HandoffError) as info:
        run_command(failing(), redis_url="redis://:hunter2@db:6379/0", error=HandoffError)
    assert not info.value.usage
    assert "connection refused" in str(info.value) and "hunter2" not in str(info.value)
