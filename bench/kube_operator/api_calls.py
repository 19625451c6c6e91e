"""operator_api_calls: Kubernetes API requests per minute of `elector operator` for 200 LeaderElections.

The operator runs as in production, `python -m elector operator` in a process of its own (logged in
with a kubeconfig), against the kmock API emulator served from this process, with its own lease and
the 200 locks on a private redis-server. (With the operator inside this process, kmock and 200
watchers on one GIL on a loaded machine made it miss its own lease's renewals.) Each
LeaderElection has two candidate pods; each lock is held by one of them for the whole run (no
transitions). After the warm-up (every holder's pod labelled "true", every status written), every
request kmock receives in the window is counted by method and resource; watch requests are long
streams, counted once each. The operator's production settings (poll 1 s) are used.

Runs on its own, too, against whichever `elector` is importable: the "before" figure in the notes
came from the commit before the shared pod watch (its `elector` on PYTHONPATH):
`PYTHONPATH=<old checkout> python bench/kube_operator/api_calls.py --elections 200 --seconds 60`.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime
import json
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

NAME = "operator_api_calls"
ELECTIONS = 200
WINDOW_S = 60.0
QUICK_WINDOW_S = 20.0
NAMESPACE = "apps"
LE_RESOURCE = "elector.io/v1alpha1/leaderelections"
LEASES = "coordination.k8s.io/v1/leases"
#: After the operator settled: time for the Events of the first terms to be posted.
SETTLE_S = 5.0
#: The longest warm-up: then the window starts however many LeaderElections are settled (the
#: figures say how many were), so that an operator that cannot keep up is measured too.
MAX_WARMUP_S = 180.0
CRD = Path(__file__).resolve().parents[2] / "helm" / "elector-operator" / "files" / "leaderelection-crd.yaml"
#: Figures of the commit before the shared pod watch (9159d15), measured with this module on its own
#: (`PYTHONPATH=<that checkout> python bench/kube_operator/api_calls.py --elections N --seconds 60`).
BEFORE_NOTE = (
    "Before the shared pod watch (commit 9159d15, this module run on its own with that checkout on "
    "PYTHONPATH, 2026-11-28, on a machine shared with seven other sessions): 20 LeaderElections, 220 "
    "pod LISTs a minute (all settled; 12 a minute each, as the 5 s period says); 200 LeaderElections, "
    "57 pod LISTs and 202 Lease GETs a minute with only 146 of 200 settled: kmock, one Python loop, "
    "could not answer 40 LISTs a second, and the operator's 10 s request timeouts and back-off set the "
    "pace. After: 0 pod LISTs at either size (one watch)."
)


def _meta(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": NAMESPACE, "uid": str(uuid.uuid4()), "resourceVersion": "1", **extra}


async def measure(*, elections: int, window_s: float, redis_url: str, seed: Any) -> dict[str, Any]:
    """Run the operator for `elections` LeaderElections; requests in the window by (method, resource)."""
    import kmock
    import yaml

    from bench.harness.common import spawn, stop
    from elector.backend import RedisLeaseBackend, RedisSettings, make_client

    # Leases with the API server's PUT and resourceVersion checks (kmock has neither), Events named.
    from tests.kube.lease_support import LeaseEmulator as emulator_cls

    async with emulator_cls() as emulator, kmock.Server(emulator) as server:
        emulator.resources.load_bundled()
        crd = yaml.safe_load(CRD.read_text())
        version = next(v for v in crd["spec"]["versions"] if v["served"])
        emulator.resources[LE_RESOURCE] = kmock.ResourceInfo(
            kind="LeaderElection",
            singular="leaderelection",
            namespaced=True,
            subresources=set(version.get("subresources") or {}),
            verbs={"get", "list", "watch", "patch", "create", "delete"},
        )
        client = make_client(RedisSettings(url=redis_url, request_timeout_s=5.0))
        try:
            # The cluster as a running operator leaves it (as after an operator restart): each lock
            # held by its "-a" pod, the pods labelled, the status and the Lease mirror naming the
            # holder. The window then shows what the operator costs while nothing changes; building
            # it all through the operator made kmock, one Python loop, the bottleneck of the warm-up.
            now = datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            for i in range(elections):
                lock = f"job-{i}"
                seed(lock)
                granted = await RedisLeaseBackend(client, lock=lock).acquire(f"{lock}-a", ttl_ms=3_600_000)
                token = granted.lease.fencing_token  # type: ignore[union-attr]
                for replica, leads in (("a", "true"), ("b", "false")):
                    labels = {"app": lock, "elector.io/leader": leads}
                    emulator.objects["v1/pods", NAMESPACE, f"{lock}-{replica}"] = {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": _meta(f"{lock}-{replica}", labels=labels),
                        "spec": {"containers": [{"name": "main", "image": "example/worker:1"}]},
                    }
                emulator.objects[LE_RESOURCE, NAMESPACE, lock] = {
                    "apiVersion": "elector.io/v1alpha1",
                    "kind": "LeaderElection",
                    "metadata": _meta(lock),
                    "spec": {
                        "lock": lock,
                        "redis": {"url": redis_url},
                        "selector": {"matchLabels": {"app": lock}},
                    },
                    "status": {
                        "lock": lock,
                        "holder": f"{lock}-a",
                        "holderPod": f"{lock}-a",
                        "fencingToken": token,
                        "transitions": 1,
                    },
                }
                emulator.objects[LEASES, NAMESPACE, lock] = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": _meta(
                        lock,
                        labels={"elector.io/leader-election": lock},
                        annotations={"elector.io/fencing-token": str(token)},
                    ),
                    "spec": {
                        "holderIdentity": f"{lock}-a",
                        "leaseDurationSeconds": 3600,
                        "acquireTime": now,
                        "renewTime": now,
                        "leaseTransitions": 0,
                    },
                }
            for lock in ("elector-operator", f"elector-operator/namespaces/{NAMESPACE}"):  # old, new default
                seed(lock)
            workdir = Path(tempfile.mkdtemp(prefix="elector-bench-operator-"))
            kubeconfig = workdir / "kubeconfig"
            kubeconfig.write_text(json.dumps(_kubeconfig(str(server.url).rstrip("/"))))
            operator = spawn(
                [sys.executable, "-m", "elector", "operator", "--namespace", NAMESPACE],
                log_path=workdir / "operator.log",
                env={
                    "KUBECONFIG": str(kubeconfig),
                    "ELECTOR_REDIS_URL": redis_url,
                    "ELECTOR_HTTP_ADDRESS": "127.0.0.1:0",
                    "ELECTOR_IDENTITY": "operator-0",
                    "ELECTOR_LOG_LEVEL": "warning",
                },
            )
            warmup_started = time.monotonic()
            try:
                settled_before = await _settled(emulator, elections, timeout_s=MAX_WARMUP_S)
                if settled_before == elections:
                    await asyncio.sleep(SETTLE_S)  # kopf posts the first terms' Events from a queue
                warmup_s = time.monotonic() - warmup_started
                first = len(list(emulator))
                await asyncio.sleep(window_s)
                requests = list(emulator)[first:]
                settled_after = await _settled(emulator, elections, timeout_s=0)
                if operator.poll() is not None:
                    raise RuntimeError(f"the operator exited with {operator.returncode}: see {workdir}")
            finally:
                await asyncio.to_thread(stop, operator, timeout_s=30.0)
                await asyncio.sleep(0.1)
        finally:
            await client.aclose()
    counts: collections.Counter[str] = collections.Counter()
    for request in requests:
        plural = request.resource.plural if request.resource is not None else str(request.url.path)
        watch = str(request.params.get("watch", "")).lower() in ("true", "1")
        verb = str(getattr(request.method, "value", request.method)).upper()
        method = "WATCH" if watch else ("LIST" if verb == "GET" and request.name is None else verb)
        counts[f"{method} {plural}"] += 1
    per_minute = {key: value * 60.0 / window_s for key, value in sorted(counts.items())}
    return {
        "elections": elections,
        "window_s": window_s,
        "warmup_s": round(warmup_s, 1),
        # LeaderElections whose holder's pod, status and Lease were right at the window's start, end
        "settled": [settled_before, settled_after],
        "per_minute": per_minute,
        "total_per_minute": sum(per_minute.values()),
    }


def _kubeconfig(server: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kmock", "cluster": {"server": server}}],
        "users": [{"name": "bench", "user": {"token": "bench"}}],
        "contexts": [
            {"name": "kmock", "context": {"cluster": "kmock", "user": "bench", "namespace": NAMESPACE}}
        ],
        "current-context": "kmock",
    }


async def _settled(emulator: Any, elections: int, *, timeout_s: float) -> int:
    """How many LeaderElections have their holder's pod labelled "true", their Lease naming the holder
    and their status written by the operator: waits until all have, at most `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        done = 0
        for i in range(elections):
            try:
                pod = emulator.objects["v1/pods", NAMESPACE, f"job-{i}-a"].raw
                status = emulator.objects[LE_RESOURCE, NAMESPACE, f"job-{i}"].raw.get("status") or {}
                lease = emulator.objects[LEASES, NAMESPACE, f"job-{i}"].raw.get("spec") or {}
            except KeyError:
                continue
            labels = (pod.get("metadata") or {}).get("labels") or {}
            holder = f"job-{i}-a"
            if (
                labels.get("elector.io/leader") == "true"
                and status.get("holder") == holder
                and status.get("conditions")  # written by the operator's first look at the lock
                and lease.get("holderIdentity") == holder
            ):
                done += 1
        if done == elections or time.monotonic() >= deadline:
            return done
        await asyncio.sleep(0.5)


def run(ctx: Any) -> Any:
    """The `python -m bench` entry: one run, its requests per minute as a table."""
    from bench.harness.common import BenchResult, RedisLab, Table, Target

    window_s = QUICK_WINDOW_S if ctx.quick else WINDOW_S
    with RedisLab() as lab:
        figures = asyncio.run(
            measure(elections=ELECTIONS, window_s=window_s, redis_url=lab.url, seed=lab.seed)
        )
    result = BenchResult(
        NAME, "Operator: Kubernetes API requests per minute, 200 LeaderElections", __doc__ or ""
    )
    before, after = figures["settled"]
    table = Table(
        f"Requests per minute in a {window_s:g} s window after a {figures['warmup_s']} s warm-up "
        f"(LeaderElections settled at its start and end: {before}, {after} of {ELECTIONS})",
        ["request", "per minute"],
    )
    for key, value in figures["per_minute"].items():
        table.add(key, f"{value:.0f}")
    table.add("total", f"{figures['total_per_minute']:.0f}")
    result.tables.append(table)
    result.notes.append(BEFORE_NOTE)
    lists = figures["per_minute"].get("LIST pods", 0.0)
    result.targets.append(
        Target(
            "pod LISTs per minute, 200 LeaderElections",
            "independent of the number of LeaderElections (one shared watch)",
            f"{lists:.0f}",
            lists < 10,
        )
    )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--elections", type=int, default=ELECTIONS)
    parser.add_argument("--seconds", type=float, default=WINDOW_S)
    args = parser.parse_args()
    from bench.harness.common import RedisLab, stop_all

    # SIGTERM (a `timeout`, a kill): stop the operator child too, as `python -m bench` does.
    signal.signal(signal.SIGTERM, lambda signum, _: sys.exit(128 + signum))
    try:
        with RedisLab() as lab:
            figures = asyncio.run(
                measure(elections=args.elections, window_s=args.seconds, redis_url=lab.url, seed=lab.seed)
            )
    finally:
        stop_all()
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.path.append(str(Path(__file__).resolve().parents[2]))  # after PYTHONPATH: an older elector wins
    sys.exit(main())
