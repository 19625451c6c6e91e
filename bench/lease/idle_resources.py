"""idle_resources: memory and CPU of an idle leader and an idle follower (ttl 10 s).

The install flavours run side by side on one redis-server: the dev venv (.venv, with the dev
extras), and a runtime-only venv (`pip install <elector>`, no extras: no rich/pygments, compiled at
optimization levels 0 and 2), as the container image has it, run plainly and the image's way
(PYTHONOPTIMIZE=2, no docstrings: bench/harness/context.py); each as a sidecar and in exec mode (`-- sleep
infinity`), each with its whole process tree's PSS beside the daemon's RSS (bench/harness/footprint.py).
The targets are judged on the image's way. RSS comes from /proc/PID/status (VmRSS = RssAnon +
RssFile + RssShmem); CPU from utime+stime in /proc/PID/stat, sampled at the start and end of the
idle window. The RSS is then broken down: per-import increments in the daemon's own import order
(OpenSSL left out as `elector run` does without TLS) measured in a fresh runtime-venv interpreter,
what the savings of issue 13 are worth (aiohttp -> h11, OpenSSL only for rediss://, no docstrings),
and the largest mappings (shared libraries, heap) of the idle leader run the image's way, from smaps.
"""

from __future__ import annotations

import collections
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

from bench.harness.common import BenchResult, Daemon, RedisLab, Table, Target
from bench.harness.context import Context
from bench.harness.footprint import tree_memory

NAME = "idle_resources"
TTL = "10s"
WARMUP_S = 5.0
RSS_TARGET_MIB = 32.0
#: Exec mode's whole tree (daemon, keeper, command) as a container is charged for it (issue 25).
EXEC_TREE_PSS_TARGET_MIB = 36.0
CPU_TARGET_PCT = 0.3
#: Why the memory targets are missed when they are: what each import adds to a daemon's RSS,
#: measured 2026-11-27 (`python -OO`, cached .opt-2.pyc, VmRSS after each import in turn).
WHY_RSS = (
    "what the daemon loads: the interpreter 10.6 MiB, asyncio 9.0 (its ssl import maps OpenSSL), "
    "structlog 5.4, redis.asyncio 6.6, prometheus_client 3.4, elector 2.7, click 1.6, h11 0.5 MiB "
    "(39.9 MiB in the dev venv); 32 MiB needs a lighter Redis client or logger than redis-py and "
    "structlog, which the guide names as the dependencies"
)
WHY_CPU = (
    "an idle daemon's CPU is its renewals (one every 3 s at ttl 10 s) or its follower's looks, "
    "plus the Python runtime's own wake-ups; it varies from run to run on this shared machine (the "
    "same daemons measured 0.27-0.35 % in one full run of 2026-11-27 and 0.30-0.37 % in the next), "
    "so the target is held without a margin; not profiled further"
)
WHY_EXEC_TREE_PSS = (
    "most of it is the daemon's imports (see the RSS target); the keeper, a second interpreter "
    "that loads only the standard library, adds its own private pages beside them"
)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

MODES = {"sidecar": (), "exec": ("--", "sleep", "infinity")}
DEV = "dev venv (.venv)"
RUNTIME = "runtime-only venv"
#: How the container image runs it (Dockerfile: ENV PYTHONOPTIMIZE=2, opt-2 .pyc compiled).
IMAGE = "runtime-only venv, PYTHONOPTIMIZE=2 (as the image runs)"
#: In the daemon's own order, shared dependencies first, so that each increment is what that
#: package adds on top of the ones before it.
IMPORT_STEPS = [
    ("asyncio (with ssl: asyncio imports it)", "import asyncio"),
    ("redis-py (redis.asyncio)", "import redis.asyncio"),
    ("h11 (the HTTP protocol layer)", "import h11"),
    ("prometheus_client", "import prometheus_client"),
    ("structlog", "import structlog"),
    ("click", "import click"),
    ("elector (cli, app and the rest)", "import elector.cli.main, elector.daemon.service"),
]
#: Everything the daemon imports, in its order.
DAEMON_IMPORTS = "import elector.cli.main, elector.daemon.service"
#: The savings: (label, python before, python after (DEV, RUNTIME or IMAGE), base statement,
#: statement before, statement after).
SAVINGS = [
    (
        "aiohttp (+ aiohttp.web) replaced by h11",
        DEV,
        DEV,
        "import ssl, asyncio, redis.asyncio",
        "import aiohttp, aiohttp.web",
        "import h11",
    ),
    (
        "docstrings (PYTHONOPTIMIZE=2, from opt-2 .pyc files: the image's ENV)",
        RUNTIME,
        IMAGE,
        "",
        DAEMON_IMPORTS,
        DAEMON_IMPORTS,
    ),
]
_IMPORT_PROBE = """
import json, sys
def rss():
    fields = {}
    for line in open("/proc/self/status"):
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            fields[key] = int(value.split()[0])
    return fields
steps = [("interpreter (python -c)", rss())]
for label, statement in json.loads(sys.argv[1]):
    exec(statement, {})
    steps.append((label, rss()))
print(json.dumps(steps))
"""


def status_kib(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
            fields[key] = int(value.split()[0])
    return fields


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # After the command name: field 14 (utime) and 15 (stime) are at offsets 11 and 12.
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def largest_mappings(pid: int, top: int = 8) -> list[tuple[str, int]]:
    """Rss (KiB) per mapped file or region ([heap], anonymous), largest first."""
    sizes: collections.Counter[str] = collections.Counter()
    current = "[anonymous]"
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split(maxsplit=5)
        if len(head) >= 5 and "-" in head[0] and not head[0].endswith(":"):
            # A mapping's header line: "start-end perms offset dev inode [path]".
            path = head[5] if len(head) == 6 else "[anonymous]"
            current = Path(path).name if path.startswith("/") else path
        elif line.startswith("Rss:"):
            sizes[current] += int(line.split()[1])
    return sizes.most_common(top)


def import_increments(
    python: str, steps: list[tuple[str, str]], repeats: int = 3
) -> list[tuple[str, dict[str, float]]]:
    """Median RSS (KiB) at start and after each import step, over fresh interpreters."""
    runs = []
    for _ in range(repeats):
        out = subprocess.run(
            [python, "-c", _IMPORT_PROBE, json.dumps(steps)],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        runs.append(json.loads(out.stdout))
    labels = [label for label, _ in runs[0]]
    return [
        (label, {key: statistics.median(run[i][1][key] for run in runs) for key in runs[0][i][1]})
        for i, label in enumerate(labels)
    ]


def import_alone(python: str, statement: str) -> float:
    """VmRSS (KiB) one import adds to a bare interpreter, dependencies included (median of 3)."""
    (_, before), (_, after) = import_increments(python, [("alone", statement)])
    return after["VmRSS"] - before["VmRSS"]


def mib(kib: float) -> str:
    return f"{kib / 1024:.1f}"


def run(ctx: Context) -> BenchResult:
    window_s = 30.0 if ctx.quick else 60.0
    flavours = {DEV: ctx.dev_python, RUNTIME: ctx.runtime_python(), IMAGE: ctx.runtime_python_as_image()}
    logs = ctx.dir("idle-resources")
    usage = Table(
        f"Idle daemons, ttl {TTL}, {window_s:g} s window (MiB = 1024*1024 bytes)",
        ["install", "mode", "role", "VmRSS MiB", "RssAnon MiB", "RssFile MiB", "RssShmem MiB",
         "CPU % of one core", "tree PSS MiB (own container)", "tree PSS MiB (host)", "tree VmRSS sum MiB",
         "processes"],
    )  # fmt: skip
    targets: list[Target] = []
    with RedisLab(ctx.redis_binary) as lab:
        daemons: list[tuple[str, str, str, Daemon]] = []
        try:
            for index, (flavour, python) in enumerate(flavours.items()):
                for mode, extra in MODES.items():
                    lock = f"bench-resources-{index}-{mode}"
                    lab.seed(lock)
                    for role in ("leader", "follower"):
                        daemon = Daemon(
                            python=python, redis_url=lab.url, lock=lock, identity=role, ttl=TTL,
                            log_path=logs / f"{index}-{mode}-{role}.log", extra_args=extra,
                        ).start()  # fmt: skip
                        if role == "leader":
                            daemon.wait_event("acquired", timeout_s=15)
                        else:
                            daemon.wait_following()
                        daemons.append((flavour, mode, role, daemon))
            time.sleep(WARMUP_S)
            before = [(time.monotonic(), cpu_seconds(d.pid)) for *_, d in daemons]
            time.sleep(window_s)
            for (flavour, mode, role, daemon), (t0, cpu0) in zip(daemons, before, strict=True):
                share = (cpu_seconds(daemon.pid) - cpu0) / (time.monotonic() - t0) * 100
                rss = status_kib(daemon.pid)
                tree = tree_memory(daemon.pid)
                usage.add(
                    flavour, mode, role, mib(rss["VmRSS"]), mib(rss["RssAnon"]), mib(rss["RssFile"]),
                    mib(rss["RssShmem"]), f"{share:.3f} %",
                    "-" if tree.own_kib is None else mib(tree.own_kib), mib(tree.pss_kib), mib(tree.rss_kib),
                    len(tree.pids),
                )  # fmt: skip
                if flavour == IMAGE and mode == "exec":
                    how = "own container" if tree.own_kib is not None else "host PSS: pagemap unreadable"
                    targets.append(Target(
                        f"exec-mode tree PSS <= {EXEC_TREE_PSS_TARGET_MIB:g} MiB ({flavour}, {role})",
                        f"<= {EXEC_TREE_PSS_TARGET_MIB:g} MiB",
                        f"{mib(tree.container_pss_kib)} MiB ({how}; host PSS {mib(tree.pss_kib)}, VmRSS sum "
                        f"{mib(tree.rss_kib)}, {len(tree.pids)} processes)",
                        tree.container_pss_kib / 1024 <= EXEC_TREE_PSS_TARGET_MIB,
                        reason=WHY_EXEC_TREE_PSS,
                    ))  # fmt: skip
                if flavour == IMAGE:  # the target is the image's install, run its way
                    targets.append(Target(
                        f"RSS <= {RSS_TARGET_MIB:g} MiB ({flavour}, {mode}, {role})",
                        f"<= {RSS_TARGET_MIB:g} MiB", f"{mib(rss['VmRSS'])} MiB",
                        rss["VmRSS"] / 1024 <= RSS_TARGET_MIB,
                        reason=WHY_RSS,
                    ))  # fmt: skip
                targets.append(Target(
                    f"CPU <= {CPU_TARGET_PCT:g} % ({flavour}, {mode}, {role})", f"<= {CPU_TARGET_PCT:g} %",
                    f"{share:.3f} %", share <= CPU_TARGET_PCT, reason=WHY_CPU,
                ))  # fmt: skip
            image_leader = next(
                d for f, m, r, d in daemons if f == IMAGE and m == "sidecar" and r == "leader"
            )
            leader_rss = status_kib(image_leader.pid)["VmRSS"]
            mappings = largest_mappings(image_leader.pid)
        finally:
            for *_, daemon in daemons:
                daemon.stop()
    return BenchResult(
        name=NAME,
        title="Idle memory and CPU",
        method=(
            f"An idle leader and an idle follower `elector run` at ttl {TTL}, as a sidecar and in exec mode "
            "(`-- sleep infinity`), from the dev "
            "venv (.venv, dev extras installed) and from a runtime-only venv built like the container image "
            "(`python3 -m venv /tmp/elector-bench-rt && pip install <elector>`, no extras: no "
            "rich/pygments; site-packages compiled at optimization levels 0 and 2 like the Dockerfile), "
            "the latter run plainly and the image's way (PYTHONOPTIMIZE=2 and PYTHONDONTWRITEBYTECODE=1, "
            "as the Dockerfile's ENV: no docstrings, read from the opt-2 .pyc files), both started in `/` "
            "like the image (WORKDIR /, so that `python -m elector` imports the installed copy, not the "
            f"work tree's), all twelve on one private redis-server, plain redis:// (no TLS, so no "
            f"OpenSSL). After a {WARMUP_S:g} s warm-up, CPU = "
            f"(utime+stime from /proc/PID/stat over the {window_s:g} s window) / wall time, as % of one "
            "core; RSS = VmRSS and its "
            "RssAnon/RssFile/RssShmem split from /proc/PID/status at the end of the window, of the daemon "
            "alone; then of its whole process tree (daemon, keeper, command: bench/harness/footprint.py): "
            "its PSS in a container of its own (the tree's distinct resident pages, from the page frame "
            "numbers of /proc/PID/pagemap: what a container's accounting charges, each page once, whatever "
            "else on the host maps the same files), the host's PSS (smaps_rollup `Pss:` summed over the "
            "tree: lower here, where every Python process of the machine shares libpython's pages) and "
            "VmRSS summed over the tree (shared pages once per process). "
            f"Targets: <= {RSS_TARGET_MIB:g} MB RSS (read as MiB) for the runtime-only install run the "
            f"image's way (the plain rows beside it), exec mode's whole tree <= {EXEC_TREE_PSS_TARGET_MIB:g} "
            f"MiB PSS in its own container (leader and follower, the image's way), <= {CPU_TARGET_PCT:g} % "
            "of one core for all."
        ),
        tables=[
            usage,
            _imports_table(flavours[IMAGE], leader_rss),
            _savings_table(flavours),
            _mappings_table(mappings),
        ],
        targets=targets,
        notes=[_extra_modules_note({DEV: flavours[DEV], RUNTIME: flavours[RUNTIME]}), _bytecode_note(ctx)],
    )


def _bytecode_note(ctx: Context) -> str:
    return (
        "Bytecode for the image's way (PYTHONOPTIMIZE=2 reads only *.opt-2.pyc; a module without one is "
        "compiled from source in memory at every start): " + "; ".join(ctx.runtime_bytecode) + "."
    )


def _extra_modules_note(flavours: dict[str, str]) -> str:
    """Which modules the dev venv loads on top of the runtime-only one (e.g. rich via structlog.dev)."""
    probe = (
        f"import sys, json; {DAEMON_IMPORTS}; "
        "print(json.dumps(sorted(name for name, module in sys.modules.items() if module is not None)))"
    )
    loaded = {
        flavour: set(json.loads(subprocess.run([python, "-c", probe], capture_output=True, text=True,
                                               timeout=60, check=True).stdout))
        for flavour, python in flavours.items()
    }  # fmt: skip
    dev, runtime = loaded.values()
    extra = sorted({name.split(".")[0] for name in dev - runtime})
    return (
        f"After importing elector.cli.main and elector.daemon.service the dev venv has {len(dev)} modules "
        f"loaded, the "
        f"runtime-only venv {len(runtime)}; the dev venv's extra top-level packages: "
        f"{', '.join(extra) or 'none'} (structlog.dev imports rich when it is installed)."
    )


def _imports_table(python: str, daemon_rss_kib: int) -> Table:
    table = Table(
        "Where the RSS of the image's way goes (runtime-only venv, PYTHONOPTIMIZE=2): per-import "
        "increments in import order, and each import alone on a bare interpreter (fresh interpreters, "
        "medians of 3)",
        ["step", "VmRSS after MiB", "+VmRSS MiB", "+RssAnon MiB", "+RssFile MiB", "+VmRSS alone MiB"],
    )
    previous: dict[str, float] | None = None
    steps = import_increments(python, IMPORT_STEPS)
    statements = dict(IMPORT_STEPS)
    for label, rss in steps:
        base = previous or dict.fromkeys(rss, 0.0)
        alone = mib(import_alone(python, statements[label])) if label in statements else ""
        deltas = (mib(rss[k] - base[k]) for k in ("VmRSS", "RssAnon", "RssFile"))
        table.add(label, mib(rss["VmRSS"]), *deltas, alone)
        previous = rss
    last = steps[-1][1]["VmRSS"]
    running = mib(daemon_rss_kib - last)
    table.add("running daemon (loop, connections, HTTP)", mib(daemon_rss_kib), running, "", "", "")
    return table


def _savings_table(pythons: dict[str, str]) -> Table:
    table = Table(
        "Where the saved MiB came from: the same imports before and after, on the same base "
        "(fresh interpreters, medians of 3; aiohttp measured in the dev venv, which still has it; "
        "the docstrings: all of the daemon's imports, plain and the image's way)",
        ["change", "on top of", "before +VmRSS MiB", "after +VmRSS MiB", "saved MiB"],
    )
    for label, python_before, python_after, base, before, after in SAVINGS:
        added = []
        for python, statement in ((python_before, before), (python_after, after)):
            steps = [("base", base or "pass"), ("measured", statement)]
            _, (_, with_base), (_, done) = import_increments(pythons[python], steps)
            added.append(done["VmRSS"] - with_base["VmRSS"])
        table.add(label, base.removeprefix("import ") or "a bare interpreter", mib(added[0]), mib(added[1]),
                  mib(added[0] - added[1]))  # fmt: skip
    return table


def _mappings_table(mappings: list[tuple[str, int]]) -> Table:
    table = Table(
        "Largest mappings of the idle leader run the image's way (smaps Rss)", ["mapping", "Rss MiB"]
    )
    for name, kib in mappings:
        table.add(name, mib(kib))
    return table
