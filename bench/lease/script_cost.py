"""`python -m bench.lease.script_cost`: the server-side cost of protocol 2's scripts against protocol 1's.

Protocol 2 (elector/backend/protocol.py) adds an `INFO replication` and a meta-hash read to
ACQUIRE's free-lock path and a meta-hash read (and, at most once per ttl, a write) to RENEW.
This measures what that costs Redis: Redis's own `usec_per_call` of EVALSHA (INFO commandstats,
reset before each run), so client and network overhead are left out. Protocol 1's scripts come
from git history (commit cbaaac6). Each figure is the median of RUNS runs of CALLS calls; the
runs of the variants interleave, so that a change of load on a shared host hits each alike.

The last column calls protocol 2's scripts as the backend does since the identity-clash check
(issue 24): with the candidate instances hash and this instance's nonce, which add two reads
(ZSCORE, HGET) to every registration, and a write only when the identity's last registrant
changes.
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
#: The leader's lease must outlive the follower's RUNS x CALLS attempts, however slowly a loaded
#: host runs them (at 10 s it lapsed mid-run and the follower was granted).
TTL_MS = 600_000


def previous_scripts() -> dict[str, Any]:
    source = subprocess.run(
        # The scripts lived at PREVIOUS_RELEASE:elector/backend/scripts.py (in lua/lease.py since).
        ["git", "show", f"{PREVIOUS_RELEASE}:elector/backend/scripts.py"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    namespace: dict[str, Any] = {}
    exec(compile(source, f"{PREVIOUS_RELEASE}:scripts.py", "exec"), namespace)
    return namespace


def usec_per_call(client: redis.Redis, call: Callable[[], object]) -> float:
    """One run: CALLS calls, Redis's own mean usec per EVALSHA."""
    client.config_resetstat()
    for _ in range(CALLS):
        call()
    return float(client.info("commandstats")["cmdstat_evalsha"]["usec_per_call"])


def calls(
    client: redis.Redis, *, name: str, new: bool, nonces: bool = False
) -> dict[str, Callable[[], object]]:
    """The measured calls of one variant, each figure's on locks of the variant's own."""
    source = scripts.__dict__ if new else previous_scripts()
    acquire = client.register_script(source["ACQUIRE"])
    renew = client.register_script(source["RENEW"])
    release = client.register_script(source["RELEASE"])
    held, free = scripts.LockKeys(f"bench-{name}"), scripts.LockKeys(f"bench-{name}-cycle")

    def keys_of(keys: scripts.LockKeys) -> tuple[list[str], list[str]]:
        acquire_keys = [keys.lease, keys.fencing, keys.quiet, keys.server, keys.candidates]
        acquire_keys += [keys.candidate_expiry, keys.handoff] + ([keys.meta] if new else [])
        renew_keys = [keys.lease, keys.candidates, keys.candidate_expiry, keys.handoff]
        renew_keys += [keys.meta] if new else []
        if nonces:
            acquire_keys.append(keys.candidate_instances)
            renew_keys.append(keys.candidate_instances)
        client.set(keys.fencing, 1)
        client.set(keys.server, client.info("server")["run_id"])
        return acquire_keys, renew_keys

    nonce: list[str] = ["0123456789abcdef"] if nonces else []
    extra: list[str | int] = [0, 0, *nonce] if new else []

    def grant(keys: list[str], identity: str) -> str:
        reply = acquire(keys=keys, args=[json.dumps(identity), "ab" * 16, TTL_MS, "ch", 0, *extra])
        assert int(reply[0]) == 1, reply
        return bytes(reply[2]).decode()

    held_acquire, held_renew = keys_of(held)
    free_acquire, _ = keys_of(free)
    value = grant(held_acquire, "leader")

    def grant_and_release() -> None:
        granted = grant(free_acquire, "cycler")
        release(keys=[free.lease, free.handoff], args=[granted, "ch", "{}", "", 0])

    return {
        "RENEW (leader)": lambda: renew(
            keys=held_renew, args=[value, TTL_MS, json.dumps("leader"), 0, *nonce]
        ),
        "ACQUIRE, held (follower)": lambda: acquire(
            keys=held_acquire, args=[json.dumps("follower"), "cd" * 16, TTL_MS, "ch", 0, *extra]
        ),
        # Two EVALSHA per cycle: the figure is the mean of the grant and the release.
        "ACQUIRE grant + RELEASE (mean)": grant_and_release,
    }


def main() -> int:
    with RedisServerProcess() as server:
        client = redis.Redis.from_url(server.url)
        variants = {
            "protocol 1 (cbaaac6)": calls(client, name="p1", new=False),
            "protocol 2": calls(client, name="p2", new=True),
            "protocol 2 with instance nonces": calls(client, name="p2n", new=True, nonces=True),
        }
        # Runs interleave the variants, so that a change of load on a shared host hits each alike.
        runs: dict[tuple[str, str], list[float]] = {}
        for _ in range(RUNS):
            for figure in variants["protocol 2"]:
                for variant, measured in variants.items():
                    runs.setdefault((variant, figure), []).append(usec_per_call(client, measured[figure]))
        client.close()
    median = {key: statistics.median(values) for key, values in runs.items()}
    print(
        f"Redis-side usec per EVALSHA (median of {RUNS} interleaved runs of {CALLS} calls; "
        "redis-server on this host)"
    )
    print("| script | " + " | ".join(variants) + " |")
    print("|---" * (len(variants) + 1) + "|")
    for figure in variants["protocol 2"]:
        cells = [f"{median[(variant, figure)]:.2f}" for variant in variants]
        print(f"| {figure} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
