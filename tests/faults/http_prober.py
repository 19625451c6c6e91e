"""Fresh-connection `GET /healthz` probes, as a kubelet sends them: one every `--period` seconds.

    python tests/faults/http_prober.py --port 8080 --seconds 10

prints one JSON object when done: `{"results": [[status, seconds], ...]}`, where status is the
HTTP status, or the name of what went wrong (`ConnectionRefusedError`, `TimeoutError`, `EOF`).
Each probe opens a new connection to 127.0.0.1, sends its request and reads the whole answer,
within `--timeout` (the kubelet's default timeoutSeconds is 1). Probes start on schedule whether
or not earlier ones have finished. It is stdlib only and runs as a process of its own
(tests/faults/http_measure.py starts it next to the attacker), so that nothing in the test's
process (its fault proxies, its watchers) delays a probe or its stopwatch.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

HOST = "127.0.0.1"
REQUEST = b"GET /healthz HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n"
#: (HTTP status, or the name of what went wrong; seconds from the connect to the answer's end)
Result = tuple[int | str, float]


async def probe(port: int, *, timeout_s: float) -> Result:
    started = time.monotonic()
    writer = None
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(HOST, port)
            writer.write(REQUEST)
            answer = await reader.read()  # Connection: close: the answer ends with the stream
    except (OSError, TimeoutError) as exc:
        return type(exc).__name__, time.monotonic() - started
    finally:
        if writer is not None:
            writer.close()
    took = time.monotonic() - started
    parts = answer.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        return "EOF" if not answer else "NotHTTP", took
    return int(parts[1]), took


async def run(
    port: int, *, seconds: float, period_s: float, timeout_s: float
) -> list[tuple[int | str, float]]:
    tasks = []
    started = time.monotonic()
    next_at = started
    while next_at < started + seconds:
        tasks.append(asyncio.ensure_future(probe(port, timeout_s=timeout_s)))
        next_at += period_s
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
    return list(await asyncio.gather(*tasks))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--port", type=int, required=True, help="the daemon's HTTP port on 127.0.0.1")
    parser.add_argument("--seconds", type=float, required=True, help="how long to probe (<= 3600)")
    parser.add_argument("--period", type=float, default=0.05, help="seconds between probe starts")
    parser.add_argument("--timeout", type=float, default=1.0, help="a probe's whole budget, seconds")
    args = parser.parse_args(argv)
    if not 0 < args.seconds <= 3600 or not 0 < args.period <= args.seconds or not args.timeout > 0:
        parser.error("--seconds must be in (0, 3600], --period in (0, seconds], --timeout positive")
    results = asyncio.run(run(args.port, seconds=args.seconds, period_s=args.period, timeout_s=args.timeout))
    print(json.dumps({"results": results}), flush=True)


if __name__ == "__main__":
    main()
