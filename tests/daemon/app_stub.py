"""A real HTTP health endpoint for the app-health tests: the app beside a daemon, whose answer
the test switches (healthy, failing, hung, hostile) while the daemon checks it."""

from __future__ import annotations

import http.server
import socket
import socketserver
import threading
import time


class AppStub:
    """Serves GET /healthz on 127.0.0.1 from threads of the test process.

    `mode`: "ok" (200), "sick" (503), "hang" (accepts, never answers), "huge" (a head far above
    the checker's budget), "drip" (a head one byte every 5 ms), "garbage" (not HTTP).
    """

    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode
        self.requests = 0
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                stub.requests += 1
                mode = stub.mode
                if mode == "hang":
                    time.sleep(30)
                    return
                if mode == "drip":  # a status line one byte at a time, never finished
                    for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"y" * 10_000:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                        time.sleep(0.005)
                    return
                if mode == "garbage":
                    self.wfile.write(b"\x00\x01 not http at all\r\n\r\n")
                    return
                if mode == "huge":
                    self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                    for _ in range(2000):  # ~64 KiB of headers: over the checker's 8 KiB
                        self.wfile.write(b"X-Padding: " + b"x" * 20 + b"\r\n")
                    return
                self.send_response(200 if mode == "ok" else 503)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok" if mode == "ok" else b"no")

            def log_message(self, format: str, *args: object) -> None:
                pass

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/healthz"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
