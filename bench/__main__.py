"""`python -m bench [--quick] [--only NAME ...]`: run the benchmarks, print their tables, and
rewrite docs/benchmarks.md.

Everything started (redis-servers, daemons, etcd, etcdctl and their children) is stopped by PID
or process group on the way out, also on an exception, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType, ModuleType

from bench.execmode import handoff_trace
from bench.harness import report
from bench.harness.common import REPO, BenchResult, stop_all
from bench.harness.context import Context, machine_facts
from bench.kube_operator import api_calls as operator_api_calls
from bench.lease import handoff, idle_requests, idle_resources, startup, takeover
from bench.library_peers import benchmark as library_peers
from bench.many_locks import benchmark as many_locks
from bench.overrun import kill_cost as overrun_kill
from bench.peers import benchmark as peers

BENCHMARKS: list[ModuleType] = [
    takeover,
    handoff,
    handoff_trace,
    idle_requests,
    idle_resources,
    startup,
    many_locks,
    peers,
    library_peers,
    overrun_kill,
    operator_api_calls,
]
NAMES = [module.NAME for module in BENCHMARKS]
DOCS = REPO / "docs" / "benchmarks.md"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer runs and shorter idle windows (~4 min)")
    parser.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help=f"run only this benchmark (repeatable or comma-separated): {', '.join(NAMES)}",
    )
    args = parser.parse_args(argv)
    only = [name for item in args.only or [] for name in item.split(",") if name]
    unknown = sorted(set(only) - set(NAMES))
    if unknown:
        parser.error(f"unknown benchmark {', '.join(unknown)}; choose from {', '.join(NAMES)}")
    args.only = only
    return args


def _terminate(signum: int, frame: FrameType | None) -> None:
    # Turn SIGTERM into an exception so that every `finally` stops what it started.
    raise SystemExit(128 + signum)


def source_of(module: ModuleType) -> str:
    """The benchmark's file, from the repository's root, as docs/benchmarks.md names it."""
    return Path(module.__file__ or module.__name__).resolve().relative_to(REPO).as_posix()


def run_one(module: ModuleType, ctx: Context) -> BenchResult:
    print(f"\n>> {module.NAME}", flush=True)
    started = time.monotonic()
    try:
        result: BenchResult = module.run(ctx)
    except Exception as exc:
        traceback.print_exc()
        result = BenchResult(module.NAME, module.NAME, (module.__doc__ or "").strip(), error=str(exc))
    result.seconds = time.monotonic() - started
    result.source = source_of(module)
    print(report.render_console(result), flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, _terminate)
    selected = [m for m in BENCHMARKS if not args.only or m.NAME in args.only]
    command = "python -m bench" + (" --quick" if args.quick else "")
    command += "".join(f" --only {name}" for name in args.only)
    date = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    started = time.monotonic()
    ctx = Context(quick=args.quick)
    results: list[BenchResult] = []
    print(f"{command}: {', '.join(m.NAME for m in selected)} ({'quick' if args.quick else 'full'} run)")
    try:
        for module in selected:
            results.append(run_one(module, ctx))
        facts = machine_facts(ctx)
    finally:
        stop_all()
        ctx.close()
    total = time.monotonic() - started
    run = report.RunInfo(command, date, "quick" if args.quick else "full", total, facts, ctx.log)
    report.update_docs(DOCS, results, run, NAMES)
    print(f"\nTotal runtime {total:.0f} s ({total / 60:.1f} min); wrote {DOCS}")
    for result in results:
        for target in result.targets:
            print(f"  {result.name:15} {target.verdict:12} {target.what}: {target.figure}")
        if result.error:
            print(f"  {result.name:15} {'FAILED':12} {result.error.splitlines()[0]}")
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
