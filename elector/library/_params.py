"""The parameters of `elector.Elector`, checked with errors that name the parameter.

The rules are the daemon's, from where both take them (lock names, identities, priorities and
the ttl's bound from `elector.lease`, timings from the election, Redis URLs from the backend's
`RedisSettings`), with the same messages: only the name in front differs.
`ElectorConfigError.parameter` is the keyword argument at fault, not a command-line flag.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
import warnings
from collections.abc import Callable, Sequence
from typing import ParamSpec, TypeVar

import redis.asyncio as aioredis

from elector.backend import InvalidRedisSettingsError, RedisSettings
from elector.election import ElectionTiming, InvalidTimingError
from elector.lease import InvalidValueError, check_ttl

T = TypeVar("T")
V = TypeVar("V")
P = ParamSpec("P")

#: Default time to stop leader work, as a share of the ttl (1 s for the default 10 s ttl).
DEFAULT_STOP_WORK_SHARE = 0.1


class ElectorConfigError(ValueError):
    """A parameter of `Elector` is invalid. `parameter` names it (several: comma-separated)."""

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(f"{parameter}: {message}")
        self.parameter = parameter


def checked(parameter: str, check: Callable[[V], T], value: V) -> T:
    """`check(value)`, its error (a rule of `elector.lease`) naming `parameter`."""
    try:
        return check(value)
    except InvalidValueError as exc:
        raise ElectorConfigError(parameter, str(exc)) from None


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def build_timing(
    *,
    ttl_s: float,
    renew_interval_s: float | None,
    renew_deadline_s: float | None,
    request_timeout_s: float | None,
    stop_work_s: float | None,
) -> ElectionTiming:
    """The daemon's timing rules, with errors naming this API's parameters."""
    for name, value in dict(locals()).items():  # the parameters, by their names
        if value is not None and not is_number(value):
            raise ElectorConfigError(name, f"must be a finite number of seconds, got {value!r}")
    checked("ttl_s", check_ttl, ttl_s)
    try:
        timing = ElectionTiming.from_ttl(
            ttl_s,
            renew_interval_s=renew_interval_s,
            renew_deadline_s=renew_deadline_s,
            request_timeout_s=request_timeout_s,
            stop_work_s=0.0 if stop_work_s is None else stop_work_s,
        )
        if stop_work_s is None:
            # Whatever the deadline leaves of the margin, up to a tenth of the ttl.
            room_s = max(0.0, timing.validity_s - timing.renew_deadline_s)
            timing = dataclasses.replace(timing, stop_work_s=min(DEFAULT_STOP_WORK_SHARE * ttl_s, room_s))
            timing.validate()
    except InvalidTimingError as exc:
        raise ElectorConfigError(", ".join(f"{name}_s" for name in exc.settings), str(exc)) from None
    return timing


def redis_source(
    redis: object, *, timing: ElectionTiming, key_prefix: str
) -> tuple[RedisSettings | None, aioredis.Redis | None]:
    """Settings to build our own client from a URL, or the user's client, checked."""
    plain = isinstance(key_prefix, str) and key_prefix.isprintable() and re.fullmatch(r"[^{}\s]+", key_prefix)
    if not plain:
        raise ElectorConfigError("key_prefix", f"must be non-empty, without braces or blanks: {key_prefix!r}")
    if isinstance(redis, str):
        settings = RedisSettings(url=redis, request_timeout_s=timing.request_timeout_s, key_prefix=key_prefix)
        try:
            settings.validate()
        except InvalidRedisSettingsError as exc:
            raise ElectorConfigError("redis", str(exc)) from None
        return settings, None
    if not isinstance(redis, aioredis.Redis):
        kind = type(redis).__name__
        raise ElectorConfigError("redis", f"expected a URL or a redis.asyncio.Redis, got {kind}")
    kwargs = redis.connection_pool.connection_kwargs
    if kwargs.get("decode_responses"):
        raise ElectorConfigError("redis", "the client must not decode responses (decode_responses=False)")
    retry = kwargs.get("retry")
    # Without a Retry object, redis-py retries once when asked to retry on some errors.
    retries = retry.get_retries() if retry is not None else int(bool(kwargs.get("retry_on_error")))
    if retries > 0:
        warnings.warn(
            f"the redis client retries failed requests ({retries} retries): a lease needs each "
            "request to fail fast; pass retry=Retry(NoBackoff(), 0) or a URL",
            RuntimeWarning,
            stacklevel=5,  # the program's line: through lease_source and the constructor
        )
    return None, redis


#: The topology settings of `RedisSettings.validate()`, and the Elector parameters that set them.
_TOPOLOGY_PARAMETERS = {"cluster": "cluster", "redlock_url": "redlock"}


def redlock_urls(redlock: object, *, redis: object) -> tuple[str, ...]:
    """`Elector(redlock=[...])`: the URLs of the Redlock servers, given instead of `redis`,
    checked as the daemon checks `--redlock-url` (an odd number >= 3 of plain servers)."""
    if redis is not None:
        raise ElectorConfigError("redis, redlock", "give one or the other: redlock lists every server")
    items = list(redlock) if isinstance(redlock, Sequence) and not isinstance(redlock, str) else None
    urls = tuple(url for url in items or () if isinstance(url, str))
    if items is None or len(urls) != len(items):
        raise ElectorConfigError(
            "redlock", f"must be a list of redis:// URLs, one per server, got {redlock!r}"
        )
    if not urls:
        raise ElectorConfigError("redlock", "needs the URLs of an odd number of at least 3 servers")
    # `url` is not used once `redlock_urls` is set: every server is checked as a redlock_url.
    _validated(RedisSettings(redlock_urls=urls))
    return urls


def lease_source(
    redis: object, *, cluster: object, redlock: object, timing: ElectionTiming, key_prefix: str
) -> tuple[RedisSettings | None, aioredis.Redis | None]:
    """Where the lease lives, from the `redis`, `cluster` and `redlock` parameters, checked:
    settings to build our own connections from, or the program's client."""
    urls = () if redlock is None else redlock_urls(redlock, redis=redis)
    # Redlock's first server stands in for `redis` where one URL and the key prefix are checked.
    settings, client = redis_source(urls[0] if urls else redis, timing=timing, key_prefix=key_prefix)
    return with_topology(settings, cluster=cluster, redlock=urls), client


def with_topology(
    settings: RedisSettings | None, *, cluster: object, redlock: tuple[str, ...]
) -> RedisSettings | None:
    """`settings` (from `redis_source`) for a Redis Cluster or a Redlock set, checked; unchanged
    for one server or a Sentinel set."""
    if not isinstance(cluster, bool):
        raise ElectorConfigError("cluster", f"must be True or False, got {cluster!r}")
    if not cluster and not redlock:
        return settings
    if settings is None:
        raise ElectorConfigError(
            "cluster",
            "a Redis Cluster is reached through the URL of one of its nodes (redis=URL), "
            "not through a client",
        )
    return _validated(dataclasses.replace(settings, cluster=cluster, redlock_urls=redlock))


def _validated(settings: RedisSettings) -> RedisSettings:
    try:
        settings.validate()
    except InvalidRedisSettingsError as exc:
        raise ElectorConfigError(_TOPOLOGY_PARAMETERS.get(exc.setting, "redis"), str(exc)) from None
    return settings


def checked_stand_back(stand_back_s: float | None) -> float | None:
    if stand_back_s is not None and (not is_number(stand_back_s) or stand_back_s < 0):
        raise ElectorConfigError("stand_back_s", f"must be a non-negative number, got {stand_back_s!r}")
    return stand_back_s


def checked_timeout(timeout: float | None) -> float | None:
    if timeout is not None and (not is_number(timeout) or timeout < 0):
        raise ElectorConfigError("timeout", f"must be a non-negative number of seconds, got {timeout!r}")
    return timeout


def factory_of(cls: Callable[P, T], *, name: str, doc: str) -> Callable[P, T]:
    """A function `name` that builds a `cls` from `cls`'s own parameters: one signature to keep.

    help() and `inspect.signature` show `cls`'s parameters, returning a `cls`; mypy checks calls
    against them (the ParamSpec)."""

    def build(*args: P.args, **kwargs: P.kwargs) -> T:
        return cls(*args, **kwargs)

    build.__module__ = cls.__module__
    build.__name__ = build.__qualname__ = name
    build.__doc__ = doc
    vars(build)["__signature__"] = inspect.signature(cls).replace(return_annotation=cls.__name__)
    return build
