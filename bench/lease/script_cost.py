"""`python -m bench.lease.script_cost`: the server-side cost of protocol 2's scripts against protocol 1's.

Protocol 2 (elector/backend/protocol.py) adds an `INFO replication` and a meta-hash read to
ACQUIRE's free-lock path and a meta-hash read (and, at most once per ttl, a write) to RENEW.
This measures what that costs Redis: Redis's own `usec_per_call` of EVALSHA (INFO commandstats,
reset before each run), so client and network overhead are left out. Protocol 1's scripts come
from git history (commit cbaaac6). Each figure is the median of RUNS runs of CALLS calls.

The last column calls protocol 2's scripts as the backend does since the identity-clash check
(issue 24): with the candidate instances hash and this instance's nonce, which add a few hash
and sorted-set reads and one hash write to every registration.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import redis

from bench.harness.common import REPO
from elector.backend.lua import lease as scripts
from elector.testing.redis_server import RedisServerProcess

PREVIOUS_RELEASE = "cbaaac6"
RUNS = 7
CALLS = 3000
KEYS = scripts.LockKeys("bench")


def previous_scripts() -> dict[str, Any]:
    source = subprocess.run(
        ["git", "show", f"{PREVIOUS_RELEASE}:elector/backend/lua/lease.py"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    namespace: dict[str, Any] = {}
    exec(compile(source, f"{PREVIOUS_RELEASE}:scripts.py", "exec"), namespace)
    return namespace


def usec_per_call(client: redis.Redis, call: Callable[[], object]) -> float:
    runs = []
    for _ in range(RUNS):
        client.config_resetstat()
        for _ in range(CALLS):
            call()
        stats = client.info("commandstats")["cmdstat_evalsha"]
        runs.append(float(stats["usec_per_call"]))
    return statistics.median(runs)


def measure(client: redis.Redis, *, new: bool, nonces: bool = False) -> dict[str, float]:
    source = scripts.__dict__ if new else previous_scripts()
    acquire = client.register_script(source["ACQUIRE"])
    renew = client.register_script(source["RENEW"])
    release = client.register_script(source["RELEASE"])
    client.flushall()
    client.set(KEYS.fencing, 1)
    client.set(KEYS.server, client.info("server")["run_id"])
    acquire_keys = [KEYS.lease, KEYS.fencing, KEYS.quiet, KEYS.server, KEYS.candidates]
    acquire_keys += [KEYS.candidate_expiry, KEYS.handoff] + ([KEYS.meta] if new else [])
    renew_keys = [KEYS.lease, KEYS.candidates, KEYS.candidate_expiry, KEYS.handoff]
    renew_keys += [KEYS.meta] if new else []
    extra: list[object] = [0, 0] if new else []
    nonce: list[object] = []
    if nonces:
        acquire_keys.append(KEYS.candidate_instances)
        renew_keys.append(KEYS.candidate_instances)
        nonce = ["0123456789abcdef"]
        extra += nonce

    def grant(identity: str) -> str:
        reply = acquire(keys=acquire_keys, args=[json.dumps(identity), "ab" * 16, 10_000, "ch", 0, *extra])
        assert int(reply[0]) == 1, reply
        return bytes(reply[2]).decode()

    value = grant("leader")
    figures = {
        "RENEW (leader)": usec_per_call(
            client,
            lambda: renew(keys=renew_keys, args=[value, 10_000, json.dumps("leader"), 0, *nonce]),
        ),
        "ACQUIRE, held (follower)": usec_per_call(
            client,
            lambda: acquire(
                keys=acquire_keys, args=[json.dumps("follower"), "cd" * 16, 10_000, "ch", 0, *extra]
            ),
        ),
    }
    release(keys=[KEYS.lease, KEYS.handoff], args=[value, "ch", "{}", "", 0])

    def grant_and_release() -> None:
        granted = grant("cycler")
        release(keys=[KEYS.lease, KEYS.handoff], args=[granted, "ch", "{}", "", 0])

    # Two EVALSHA per cycle: the figure is the mean of the grant and the release.
    figures["ACQUIRE grant + RELEASE (mean)"] = usec_per_call(client, grant_and_release)
    return figures


def main() -> int:
    with RedisServerProcess() as server:
        client = redis.Redis.from_url(server.url)
        old = measure(client, new=False)
        new = measure(client, new=True)
        nonced = measure(client, new=True, nonces=True)
        client.close()
    print(f"Redis-side usec per EVALSHA (median of {RUNS} runs of {CALLS} calls; redis-server on this host)")
    print("| script | protocol 1 (cbaaac6) | protocol 2 | difference | protocol 2 with instance nonces |")
    print("|---|---|---|---|---|")
    for name, before in old.items():
        after = new[name]
        print(f"| {name} | {before:.2f} | {after:.2f} | {after - before:+.2f} | {nonced[name]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
