"""A singleton kopf operator for the tests: run as a child process by tests/kube/test_singleton.py.

    python tests/kube/singleton_app.py --identity a --redis-url URL --kube-url URL --events FILE

With `--stuck-on NAME --unblock FILE`, the ConfigMap NAME is handled by a synchronous handler
that blocks until FILE exists: kopf cannot stop while it runs (kopf shields executor threads),
which is what `--on-stuck` is about.
Its kopf handler records every ConfigMap it handles, and the hooks record each term's start and
kopf's stop, as JSON lines in --events with `time.monotonic()` (one clock for all processes of
the machine on Linux), so the test can line them up with its own observations of Redis.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import signal
import threading
import time
from pathlib import Path
from typing import Any

import kopf

import elector
from elector.kube import run_singleton_blocking


def main() -> None:
    # The test sends SIGUSR1 before it fails on a missing event: every thread's stack goes to the
    # log (stderr), so a kopf that did not stop shows where it waits.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    parser = argparse.ArgumentParser()
    parser.add_argument("--identity", required=True)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--kube-url", required=True)
    parser.add_argument("--events", type=Path, required=True)
    parser.add_argument("--lock", default="singleton-test")
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--ttl-s", type=float, default=3.0)
    parser.add_argument("--stop-work-s", type=float, default=0.5)
    parser.add_argument("--on-stuck", choices=["exit", "wait"], default="exit")
    parser.add_argument("--stuck-on", default=None, help="a ConfigMap whose handler blocks")
    parser.add_argument("--unblock", type=Path, default=None, help="the file that unblocks it")
    args = parser.parse_args()
    log_format = "%(asctime)s %(levelname)s %(threadName)s %(name)s %(message)s"
    logging.basicConfig(level=logging.INFO, format=log_format)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)

    guard = threading.Lock()

    def record(event: str, **fields: Any) -> None:
        line = json.dumps({"event": event, "identity": args.identity, "t": time.monotonic(), **fields})
        with guard, args.events.open("a") as out:
            out.write(line + "\n")

    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=args.kube_url, insecure=True)

    def is_stuck_one(name: str, **_: Any) -> bool:
        return name == args.stuck_on

    @kopf.on.create("v1", "configmaps", registry=registry, when=kopf.not_(is_stuck_one))
    async def created(name: str, **_: Any) -> None:
        record("handled", name=name)

    @kopf.on.create("v1", "configmaps", registry=registry, when=is_stuck_one)
    def stuck(name: str, **_: Any) -> None:  # synchronous: kopf runs it in its executor
        record("handled", name=name)
        record("stuck", name=name)
        while args.unblock is None or not args.unblock.exists():
            time.sleep(0.05)  # no cancellation reaches a thread
        record("unblocked", name=name)

    settings = kopf.OperatorSettings()
    settings.scanning.disabled = True
    settings.posting.enabled = False

    def on_leading(term: elector.Leadership) -> None:
        record("leading", fencing_token=term.fencing_token)

    def on_stopped(term: elector.Leadership) -> None:
        record("stopped", fencing_token=term.fencing_token)

    candidate = elector.Elector(
        args.lock,
        redis=args.redis_url,
        identity=args.identity,
        ttl_s=args.ttl_s,
        stop_work_s=args.stop_work_s,
    )
    record("started")
    run_singleton_blocking(
        candidate,
        registry=registry,
        settings=settings,
        namespaces=[args.namespace],
        on_leading=on_leading,
        on_stopped=on_stopped,
        on_stuck=args.on_stuck,
    )
    record("exited")


if __name__ == "__main__":
    main()
