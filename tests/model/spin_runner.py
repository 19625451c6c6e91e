"""Runs the spin models (model/lease.pml, the lease protocol; model/predecessor.pml, a lock renamed
with --predecessor-lock) in their checked configurations.

Each configuration is the model with some `-D` definitions: spin writes the verifier (pan.c),
gcc builds it, and pan searches every reachable state within the configuration's bounds. The
result is parsed from pan's report. `python -m tests.model.spin_runner` prints the table of all
configurations and mutants (what docs/model.md quotes).
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODEL = Path(__file__).resolve().parents[2] / "model" / "lease.pml"
PREDECESSOR_MODEL = MODEL.with_name("predecessor.pml")
INSTALL_HINT = "sudo apt-get install -y --no-install-recommends spin gcc (or scripts/system-deps.sh as root)"

#: The bounds of each checked configuration (see docs/model.md).
BASE = ("-DMAXG=3", "-DMAXF=0", "-DMAXP=1")
BASE3 = ("-DN=3", "-DMAXG=3", "-DMAXF=0", "-DMAXP=0")
RESTARTS = ("-DRESTARTS", "-DMAXG=2", "-DMAXF=1", "-DMAXP=0")
FAILOVERS = ("-DFAILOVERS", "-DTTL=4", "-DMAXG=3", "-DMAXF=2", "-DMAXP=0")
LIVE = ("-DLIVE",)
#: Mixed fleet: candidate 0 speaks protocol 1; failover, failback, failover again (3 faults).
MIXED = ("-DFAILOVERS", "-DMIXED", "-DTTL=3", "-DMAXG=2", "-DMAXF=3", "-DMAXP=0")
LIVE3 = ("-DLIVE", "-DN=3")
#: predecessor.pml: two replicas of two releases, 4 grants, 1 lost request or answer (docs/model.md).
RENAME = ("-DMAXG=4", "-DMAXL=1", "-DTTL=3")


@dataclasses.dataclass(frozen=True)
class Config:
    name: str
    defines: tuple[str, ...]
    #: What the run shows: the properties checked (real model) or the mechanism removed (mutant).
    about: str
    model: Path = MODEL


REAL = (
    Config("base", BASE, "2 candidates, no data loss, one pause: properties 1, 2, 4"),
    Config("base-3", BASE3, "3 candidates, no data loss: properties 1, 2, 4"),
    Config("restarts", RESTARTS, "empty restart or restart from an old snapshot: properties 1, 2"),
    Config("failovers", FAILOVERS, "failover to a lagging replica, then failback: properties 1, 2"),
    Config("live", LIVE, "no faults: properties 3, 5"),
    Config("mixed", MIXED, "protocol 1 beside protocol 2, three failovers: property 1 for protocol-2 grants"),
    Config("live-3", LIVE3, "no faults, 3 candidates: properties 3, 5"),
    Config(
        "rename-old-new",
        RENAME,
        "predecessor: 0.1.0 beside a renamed lock: properties 1, 2",
        PREDECESSOR_MODEL,
    ),
    Config(
        "rename-new-new",
        (*RENAME, "-DNEWNEW"),
        "predecessor: two renamed: properties 1, 2",
        PREDECESSOR_MODEL,
    ),
    Config(
        "rename-new-later",
        (*RENAME, "-DNEWLATER"),
        "predecessor: renamed beside a release without it: properties 1, 2",
        PREDECESSOR_MODEL,
    ),
)

MUTANTS = (
    Config("validity-from-answer", (*BASE, "-DMUT_VALIDITY_FROM_ANSWER"), "validity counted from the answer"),
    Config("no-drift-margin", (*BASE, "-DMUT_NO_DRIFT_MARGIN"), "the margin leaves the clock drift out"),
    Config("renew-recreates", (*BASE, "-DMUT_RENEW_RECREATES"), "a renewal re-creates a lapsed key"),
    Config("release-any", (*BASE, "-DMUT_RELEASE_ANY"), "a release without the owner check"),
    Config("no-quiet", (*RESTARTS, "-DMUT_NO_QUIET"), "no quiet period after lost data"),
    Config("no-runid", (*RESTARTS, "-DMUT_NO_RUNID"), "lost data seen by the replid only"),
    Config("token-no-clock", (*RESTARTS, "-DMUT_TOKEN_NO_CLOCK"), "fencing tokens without the clock floor"),
    Config(
        "failback-runid-only", (*FAILOVERS, "-DMUT_FAILBACK_RUNID_ONLY"), "the quiet period misses failback"
    ),
    Config("no-announce", (*LIVE, "-DMUT_NO_ANNOUNCE"), "a release is not announced"),
    Config(
        "served-any-stream",
        (*MIXED, "-DMUT_SERVED_ANY_STREAM"),
        "protocol 1's quiet period credited for any promotion",
    ),
    Config("no-meta-trusted", (*MIXED, "-DMUT_NO_META_TRUSTED"), "the server key trusted without a stream"),
    # The predecessor's mutants: each a counterexample of property 1 itself (EXCLUSIVE_ONLY).
    Config(
        "rename-no-predecessor",
        (*RENAME, "-DEXCLUSIVE_ONLY", "-DMUT_NO_PREDECESSOR"),
        "a rename without --predecessor-lock",
        PREDECESSOR_MODEL,
    ),
    Config(
        "rename-renew-one",
        (*RENAME, "-DEXCLUSIVE_ONLY", "-DMUT_RENEW_ONE"),
        "the predecessor left to lapse",
        PREDECESSOR_MODEL,
    ),
    Config(
        "rename-validity-from-last",
        (*RENAME, "-DNEWLATER", "-DEXCLUSIVE_ONLY", "-DMUT_VALIDITY_FROM_LAST"),
        "validity from the last acquire",
        PREDECESSOR_MODEL,
    ),
)


class ToolMissing(RuntimeError):
    """spin or gcc is not installed."""


@dataclasses.dataclass(frozen=True)
class Result:
    config: Config
    errors: int
    states: int
    depth: int
    complete: bool
    violation: str
    elapsed_s: float
    trail: str


def require_tools() -> None:
    missing = [tool for tool in ("spin", "gcc") if shutil.which(tool) is None]
    if missing:
        raise ToolMissing(f"{' and '.join(missing)} not found on PATH; install them: {INSTALL_HINT}")


def _run(cmd: list[str], *, cwd: Path, timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout_s, check=False)


def check(config: Config, *, timeout_s: float = 600.0, optimise: str = "-O2") -> Result:
    """Generate, build and run the verifier of one configuration; parse its report."""
    require_tools()
    with tempfile.TemporaryDirectory(prefix=f"spin-{config.name}-") as tmp:
        work = Path(tmp)
        name = config.model.name
        shutil.copy(config.model, work / name)
        started = time.monotonic()
        gen = _run(["spin", *config.defines, "-a", name], cwd=work, timeout_s=timeout_s)
        if gen.returncode != 0 or not (work / "pan.c").exists():
            raise RuntimeError(f"spin -a failed for {config.name}:\n{gen.stdout}{gen.stderr}")
        # COLLAPSE compresses stored states; SAFETY drops the cycle-detection machinery (the
        # properties are assertions); NOFAIR: there is one process.
        build = _run(
            ["gcc", optimise, "-w", "-DSAFETY", "-DNOFAIR", "-DCOLLAPSE", "-o", "pan", "pan.c"],
            cwd=work,
            timeout_s=timeout_s,
        )
        if build.returncode != 0:
            raise RuntimeError(f"gcc failed for {config.name}:\n{build.stderr[-2000:]}")
        # -m: the depth limit (runs are far shorter; reaching it would be reported below).
        pan = _run(["./pan", "-m1000000"], cwd=work, timeout_s=timeout_s)
        elapsed_s = time.monotonic() - started
        report = pan.stdout + pan.stderr
        trail = ""
        if (work / f"{name}.trail").exists():
            replay = _run(["spin", *config.defines, "-t", name], cwd=work, timeout_s=timeout_s)
            lines = (line.strip() for line in replay.stdout.splitlines())
            trail = "\n".join(line[len("MSC: ") :] for line in lines if line.startswith("MSC: "))
    errors = re.search(r"errors: (\d+)", report)
    states = re.search(r"(\d+) states, stored", report)
    depth = re.search(r"depth reached (\d+)", report)
    if errors is None or states is None or depth is None:
        raise RuntimeError(f"cannot parse pan's report for {config.name}:\n{report[-3000:]}")
    violation = re.search(r"pan:\d+: (.*?) \(at depth", report)
    return Result(
        config=config,
        errors=int(errors.group(1)),
        states=int(states.group(1)),
        depth=int(depth.group(1)),
        complete="max search depth too small" not in report and "Search not completed" not in report,
        violation=violation.group(1) if violation else "",
        elapsed_s=elapsed_s,
        trail=trail,
    )


def main() -> int:
    try:
        require_tools()
    except ToolMissing as exc:
        print(exc, file=sys.stderr)
        return 1
    print("| run | what | errors | states | seconds |")
    print("|---|---|---|---|---|")
    total_s = 0.0
    for config in (*REAL, *MUTANTS):
        result = check(config)
        total_s += result.elapsed_s
        print(
            f"| {config.name} | {config.about} | {result.errors} | {result.states} | {result.elapsed_s:.1f} |"
        )
    print(f"\ntotal {total_s:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
