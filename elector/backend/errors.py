"""Every failure of the Redis client as the one domain error, `LeaseBackendError`.

The backend raises nothing else (the `LeaseBackend` protocol promises it): the lease, the pub/sub
hub and its link, the topologies and the subscriptions all translate what the client raises
here, so the same failure gets the same kind and message wherever it happens.
"""

from __future__ import annotations

import re

import redis.exceptions

from elector.lease import BackendErrorKind, LeaseBackendError

__all__ = ["invalid_request", "translate_error"]


def translate_error(exc: Exception, *, what: str, keys: str = "") -> LeaseBackendError:
    """One domain error for every client failure; redis-py messages carry no passwords.

    `what` names the request ("acquire", "subscribe"); `keys` the keys a WRONGTYPE may be about.
    """
    if isinstance(exc, TimeoutError | redis.exceptions.TimeoutError):
        return LeaseBackendError(f"{what}: Redis did not answer in time", kind=BackendErrorKind.TIMEOUT)
    if isinstance(exc, redis.exceptions.AuthenticationError | redis.exceptions.NoPermissionError):
        refused = _access_refused(exc)
        return LeaseBackendError(f"{what}: Redis refused access: {refused}", kind=BackendErrorKind.AUTH)
    if isinstance(exc, redis.exceptions.ConnectionError | OSError):
        return LeaseBackendError(f"{what}: cannot reach Redis: {exc}", kind=BackendErrorKind.CONNECTION)
    if isinstance(exc, redis.exceptions.ResponseError):
        return _translate_response(exc, what=what, keys=keys)
    if isinstance(exc, redis.exceptions.RedisError):
        return LeaseBackendError(f"{what}: {type(exc).__name__}: {exc}", kind=BackendErrorKind.SERVER)
    if isinstance(exc, redis.exceptions.RedisClusterException):
        # The cluster client's own state errors (no node serves the slot, a failed topology
        # refresh) are not RedisErrors, but neither are they garbage data: a server-side state.
        return LeaseBackendError(f"{what}: Redis Cluster: {exc}", kind=BackendErrorKind.SERVER)
    return LeaseBackendError(
        f"{what}: unexpected reply from Redis ({type(exc).__name__}: {exc})", kind=BackendErrorKind.DATA
    )


def _translate_response(exc: redis.exceptions.ResponseError, *, what: str, keys: str) -> LeaseBackendError:
    text = str(exc)
    # Drop the script-call noise ("Error running script (call to f_...): @user_script:6: ").
    text = re.sub(r"^Error running script \(call to f_[0-9a-f]+\): @user_script:\d+: ", "", text)
    if text.startswith("NOPERM") or "NOPERM" in text[:40]:
        return LeaseBackendError(f"{what}: Redis refused access: {text}", kind=BackendErrorKind.AUTH)
    if "WRONGTYPE" in text:
        return LeaseBackendError(
            f"{what}: a key of this lock ({keys}) is not a string (the meta key: not a hash): "
            "something other than elector wrote it; delete it to let elector use the lock",
            kind=BackendErrorKind.DATA,
        )
    if "elector:" in text:
        return LeaseBackendError(f"{what}: {text.removeprefix('ERR ')}", kind=BackendErrorKind.DATA)
    if text.startswith(("NOAUTH", "WRONGPASS", "NOPERM")):
        return LeaseBackendError(f"{what}: Redis refused access: {text}", kind=BackendErrorKind.AUTH)
    return LeaseBackendError(f"{what}: Redis answered an error: {text}", kind=BackendErrorKind.SERVER)


def _access_refused(exc: Exception) -> str:
    """redis-py's words for a server that wants a password and got none are the protocol's
    (`HELLO must be called with the client already authenticated, ...`): said plainly instead."""
    text = str(exc)
    if text.startswith(("HELLO must be called with the client already", "Authentication required")):
        return "it requires a password and none was given (redis://:PASSWORD@host:port/db, or user:PASSWORD@)"
    return text


def invalid_request(what: str, problem: str) -> LeaseBackendError:
    """A request the scripts would refuse (a priority out of range, a ttl that is not positive),
    refused before it is sent, with the kind the scripts' own refusal gets (DATA)."""
    return LeaseBackendError(f"{what}: {problem}", kind=BackendErrorKind.DATA)
