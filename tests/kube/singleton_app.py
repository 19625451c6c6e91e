"""A singleton kopf operator for the tests: run as a child process by tests/kube/test_singleton.py.

    python tests/kube/singleton_app.py --identity a --redis-url URL --kube-url URL --events FILE

Its kopf handler records every ConfigMap it handles, and the hooks record each term's start and
kopf's stop, as JSON lines in --events with `time.monotonic()` (one clock for all processes of
the machine on Linux), so the test can line them up with its own observations of Redis.
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import kopf

import elector
from elector.kube import run_singleton_blocking


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--identity", required=True)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--kube-url", required=True)
    parser.add_argument("--events", type=Path, required=True)
    parser.add_argument("--lock", default="singleton-test")
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--ttl-s", type=float, default=3.0)
    parser.add_argument("--stop-work-s", type=float, default=0.5)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(threadName)s %(name)s %(message)s")
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

    @kopf.on.create("v1", "configmaps", registry=registry)
    async def created(name: str, **_: Any) -> None:
        record("handled", name=name)

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
    )
    record("exited")


if __name__ == "__main__":
    main()
