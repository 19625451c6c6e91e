"""The lease backends of one client share its registered scripts (redis_lease.registered_script)."""

from __future__ import annotations

import redis.asyncio

from elector.backend import RedisLeaseBackend
from elector.backend.lua import lease as scripts
from elector.backend.redis_lease import registered_script


def test_backends_of_one_client_share_its_scripts_and_other_clients_get_their_own() -> None:
    client = redis.asyncio.Redis(host="127.0.0.1", port=1)  # never connected
    other = redis.asyncio.Redis(host="127.0.0.1", port=1)
    first = RedisLeaseBackend(client, lock="a")
    second = RedisLeaseBackend(client, lock="b")
    assert first._renew is second._renew and first._acquire is second._acquire
    assert first._renew.registered_client is client
    elsewhere = RedisLeaseBackend(other, lock="a")
    assert elsewhere._renew is not first._renew and elsewhere._renew.registered_client is other
    assert registered_script(client, scripts.RELEASE) is first._release
    assert first._renew.script == scripts.RENEW and first._release.script == scripts.RELEASE
