"""peers: the same exec-mode workload against elector and four peers, in one run.

Systems: elector (`elector run --ttl 2s -- CMD`), etcd (`etcdctl lock --ttl 2 L -- CMD`),
ZooKeeper 3.8 with kazoo's `Election` (session timeout 2 s), python-redis-lock (expire 2,
auto renewal) and redis-py's `Lock` (timeout 2) with a reacquire thread; the Python peers through
bench/peers/candidates/candidate.py. CMD (bench/peers/candidates/work.py) journals `time.time()` as
its first act and sleeps until SIGTERM.

Per system, three candidates:
- crash trials: SIGKILL of the leader candidate at a uniform random point of its first ttl as
  leader, timed to the next CMD's journal line; the killed one's orphaned CMD is killed and the
  candidate restarted as a waiter. The systems' crash trials run at the same time (one thread
  each): they mostly wait for leases to run out, and so the module stays within 8 minutes.
- graceful trials: SIGTERM to the leader candidate (etcd: to its CMD, see systems.py),
  timed from right before os.kill to the new leader's CMD journal line; one system at a time,
  round-robin (one trial of each system per round, then one spawn-floor sample), so that the
  load of a shared machine, which swings over minutes, falls on every system alike.
- an idle window with one holder and two waiters: requests per waiter (bench/peers/probes.py),
  each waiter's RSS and CPU.
"""

from __future__ import annotations

import random
import threading
import time
import traceback
from pathlib import Path

from bench.harness import plots
from bench.harness.common import BenchError, BenchResult
from bench.harness.context import Context
from bench.peers.report import Outcome, build_result
from bench.peers.systems import System, all_systems, tool_versions, work_cmd
from bench.peers.trials import Cluster, crash_trials, graceful_trials, idle_window, spawn_floor

NAME = "peers"
#: After a graceful trial, before the next system's: the replacement candidate's start-up is done.
SETTLE_S = 1.0


def _elector_python(ctx: Context) -> tuple[str, str]:
    """The runtime-only venv run the container image's way (PYTHONOPTIMIZE=2), else this venv."""
    try:
        return ctx.runtime_python_as_image(), "runtime-only venv, as the image runs it"
    except BenchError as exc:
        ctx.say(f"peers: runtime venv unavailable ({exc}); elector runs from the dev venv")
        return ctx.dev_python, "dev venv"


def _brief(exc: Exception) -> str:
    """The message's first line, plus the last line of a log tail it carries (the actual error)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    return lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"


def _start(system: System, outcome: Outcome) -> Cluster | None:
    reason = system.unavailable()
    if reason is not None:
        outcome.skipped = reason
        return None
    try:
        system.start_server()
        cluster = Cluster(system)
        cluster.start()
        return cluster
    except Exception as exc:  # a peer that cannot start is a skipped row, not a failed module
        traceback.print_exc()
        outcome.skipped = f"could not start: {_brief(exc)}"
        return None


def _crash_phase(clusters: dict[str, Cluster], outcomes: dict[str, Outcome], *, runs: int, seed: int) -> None:
    def one(key: str, cluster: Cluster, rng: random.Random) -> None:
        try:
            outcomes[key].crash = crash_trials(cluster, runs=runs, rng=rng)
        except Exception as exc:
            traceback.print_exc()
            outcomes[key].errors.append(f"crash trials: {_brief(exc)}")

    threads = [
        # Daemon threads: on Ctrl-C or SIGTERM the main thread stops every process at once.
        threading.Thread(
            target=one, args=(key, cluster, random.Random(seed + i)), name=f"crash-{key}", daemon=True
        )
        for i, (key, cluster) in enumerate(clusters.items())
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _graceful_phase(
    clusters: dict[str, Cluster],
    outcomes: dict[str, Outcome],
    *,
    runs: int,
    seed: int,
    floor_cmd: tuple[list[str], Path],
) -> list[float]:
    """Round-robin: each round one graceful trial of each system in turn, then one spawn-floor
    sample; the floor samples. On a shared machine whose load swings over minutes, every system's
    trials (and the floor) then meet the same load, and the ratios compare like with like."""
    rngs = {key: random.Random(seed + 100 + i) for i, key in enumerate(clusters)}
    floor: list[float] = []
    for _ in range(runs):
        for key, cluster in clusters.items():
            outcome = outcomes[key]
            if outcome.errors:
                continue  # a system that failed a trial has no more of them
            try:
                outcome.handoff += graceful_trials(cluster, runs=1, rng=rngs[key])
                # The stopped candidate's replacement starts now (an interpreter and its imports:
                # up to a second of CPU for a Python one): let it settle before the next system's
                # trial, which would otherwise run beside it.
                cluster.wait_ready()
                time.sleep(SETTLE_S)
            except Exception as exc:
                traceback.print_exc()
                outcome.errors.append(_brief(exc))
        floor += spawn_floor(*floor_cmd, runs=1)
    return floor


def _close(cluster: Cluster, closed: set[str]) -> None:
    # Each cluster is stopped once: a second stop could signal a process group of reused PIDs.
    if cluster.system.key not in closed:
        closed.add(cluster.system.key)
        cluster.close()
        cluster.system.close()


def run(ctx: Context) -> BenchResult:
    runs = 8 if ctx.quick else 20
    idle_s, alone_s = (10.0, 5.0) if ctx.quick else (30.0, 10.0)
    elector_python, elector_venv = _elector_python(ctx)
    systems = all_systems(ctx, lambda key: ctx.dir(f"peers-{key}"), elector_python=elector_python)
    outcomes = {s.key: Outcome(s.key, s.label) for s in systems}

    floor_journal = ctx.dir("peers-floor") / "journal"
    floor_cmd = (work_cmd(floor_journal, "floor"), floor_journal)
    floor = spawn_floor(*floor_cmd, runs=10)
    phases: dict[str, float] = {}
    mark = time.monotonic()

    def phase(name: str) -> None:
        nonlocal mark
        now = time.monotonic()
        phases[name] = now - mark
        mark = now

    clusters: dict[str, Cluster] = {}
    closed: set[str] = set()
    try:
        for system in systems:
            print(f"  peers: starting {system.key}", flush=True)
            cluster = _start(system, outcomes[system.key])
            if cluster is not None:
                clusters[system.key] = cluster
        phase("start")
        print(f"  peers: crash trials ({runs} per system, systems in parallel)", flush=True)
        _crash_phase(clusters, outcomes, runs=runs, seed=ctx.seed)
        phase("crash trials")
        print(f"  peers: graceful trials ({runs} per system, one system at a time, interleaved)", flush=True)
        floor += _graceful_phase(clusters, outcomes, runs=runs, seed=ctx.seed, floor_cmd=floor_cmd)
        phase("graceful trials")
        for key, cluster in clusters.items():
            print(f"  peers: {key}: idle window", flush=True)
            outcome = outcomes[key]
            try:
                if not outcome.errors:
                    outcome.idle = idle_window(cluster, seconds=idle_s, alone_seconds=alone_s)
            except Exception as exc:
                traceback.print_exc()
                outcome.errors.append(_brief(exc))
            finally:
                # Stopped now, so that the next system's idle window runs without this one's load.
                _close(cluster, closed)
        phase("idle windows")
    finally:
        for cluster in clusters.values():
            _close(cluster, closed)
        for system in systems:
            system.close()

    images = _plots(outcomes)
    result = build_result(
        NAME,
        outcomes=list(outcomes.values()),
        floor=floor,
        runs=runs,
        idle_s=idle_s,
        alone_s=alone_s,
        versions=f"{tool_versions()}; elector from the {elector_venv}",
    )
    result.images = images
    result.notes.append("phases: " + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in phases.items()))
    return result


def _plots(outcomes: dict[str, Outcome]) -> list[tuple[Path, str]]:
    images = []
    try:
        for field, title in (("crash", "Crash takeover"), ("handoff", "Graceful handoff")):
            path = plots.image_path(f"peers-{field}")
            samples = {o.key: [s * 1000 for s in getattr(o, field)] for o in outcomes.values()}
            plots.plot_distributions(
                path, samples=samples, xlabel="ms to the new leader's CMD journal line", title=title
            )
            images.append((path, f"{title} per system (ms, every run a dot)"))
    except plots.PlotsUnavailable:
        pass
    return images
