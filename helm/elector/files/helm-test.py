"""`helm test`: every replica's sidecar answers /healthz, and exactly one of them reports leading.

Standard library only; runs in elector's image as the chart's test Pod. The replicas are the addresses of
the headless metrics Service (it publishes not-ready pods too), or ADDRESSES (host:port,...) when set.
A leader change can be under way at any moment, so both checks are retried until DEADLINE_SECONDS.
"""

import json
import os
import socket
import sys
import time
import urllib.error
import urllib.request

SERVICE = os.environ.get("SERVICE", "")
PORT = int(os.environ.get("PORT", "0") or 0)
REPLICAS = int(os.environ.get("REPLICAS", "0") or 0)
DEADLINE_SECONDS = float(os.environ.get("DEADLINE_SECONDS", "60"))


def replicas() -> list[str]:
    given = os.environ.get("ADDRESSES", "")
    if given:
        return sorted(part.strip() for part in given.split(",") if part.strip())
    try:
        infos = socket.getaddrinfo(SERVICE, PORT, proto=socket.IPPROTO_TCP)
    except OSError as error:
        return [f"<{SERVICE} does not resolve: {error}>"]
    hosts = sorted({info[4][0] for info in infos})
    return [f"[{host}]:{PORT}" if ":" in host else f"{host}:{PORT}" for host in hosts]


def get(address: str, path: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=2) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        try:
            return error.code, json.load(error)
        except ValueError:
            return error.code, {}
        finally:
            error.close()
    except (OSError, ValueError) as error:
        return 0, {"error": str(error)}


def check() -> list[str]:
    """The problems found now (empty: all good)."""
    addresses = replicas()
    problems = []
    if REPLICAS and len(addresses) != REPLICAS:
        problems.append(f"{len(addresses)} replicas answer for {SERVICE} ({addresses}), expected {REPLICAS}")
    leaders = []
    for address in addresses:
        status, body = get(address, "/healthz")
        if status != 200:
            problems.append(f"{address}: /healthz answered {status} {body}")
        status, body = get(address, "/leader")
        if status == 200 and body.get("is_leader") is True:
            leaders.append(f"{address} ({body.get('identity')})")
        elif status not in (200, 503):
            problems.append(f"{address}: /leader answered {status} {body}")
    if len(leaders) != 1:
        problems.append(f"{len(leaders)} replicas report leading, expected exactly 1: {leaders}")
    return problems


def main() -> int:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while True:
        problems = check()
        if not problems:
            print(f"ok: {len(replicas())} replicas healthy, exactly one leads", flush=True)
            return 0
        if time.monotonic() >= deadline:
            for problem in problems:
                print(f"FAILED: {problem}", file=sys.stderr, flush=True)
            return 1
        time.sleep(1)


if __name__ == "__main__":
    sys.exit(main())
