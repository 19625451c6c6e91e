"""What the peers benchmark reads about a waiter: its process tree's RSS and CPU time from /proc,
and the requests it sends to its server.

Requests, per server:
- Redis: a MONITOR connection sees every command with the client's address; each address is
  attributed to a waiter through the waiter's own TCP sockets (/proc/PID/fd -> socket inode ->
  /proc/net/tcp local port). Commands run inside Lua scripts show as `[0 lua]` and are not
  counted: a script call is one request.
- etcd: the server-wide `grpc_server_msg_received_total` of /metrics (every gRPC message,
  keep-alives included); ZooKeeper: `zk_packets_received` of the `mntr` four-letter word. These
  are totals, so the waiters' share is found by difference (see bench/peers/trials.py).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import threading
import urllib.request
from collections import Counter
from pathlib import Path

_CLK_TCK = os.sysconf("SC_CLK_TCK")
_MONITOR_ADDR = re.compile(rb"^\+[\d.]+ \[\d+ ([^\]]+)\]")


# -- /proc -----------------------------------------------------------------------------------


def _ppid_map() -> dict[int, int]:
    parents = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = (entry / "stat").read_text()
            # Field 4 (ppid) follows the command name in parentheses, which may contain blanks.
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parents


def process_tree(pid: int) -> list[int]:
    """PID and all its descendants alive now."""
    parents = _ppid_map()
    tree, frontier = [pid], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        tree += children
        frontier = children
    return tree


def rss_kib(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of the processes (not of their reaped children)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # fields 14 and 15 of stat(5)
    return total / _CLK_TCK


def local_tcp_ports(pids: list[int]) -> set[int]:
    """Local ports of the TCP sockets the processes hold open."""
    inodes: set[str] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith("socket:["):
                        inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if len(fields) > 9 and fields[9] in inodes:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


# -- Redis: MONITOR --------------------------------------------------------------------------


class RedisMonitor:
    """Counts the commands of each client address while it runs (a thread reading MONITOR)."""

    def __init__(self, host: str, port: int) -> None:
        self._sock = socket.create_connection((host, port), timeout=5)
        self._sock.sendall(b"MONITOR\r\n")
        self._file = self._sock.makefile("rb")
        if not self._file.readline().startswith(b"+OK"):
            raise OSError("MONITOR was refused")
        self._sock.settimeout(None)
        self.counts: Counter[str] = Counter()
        self._thread = threading.Thread(target=self._read, name="redis-monitor", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            for line in self._file:
                match = _MONITOR_ADDR.match(line)
                if match is not None:
                    self.counts[match.group(1).decode()] += 1

    def close(self) -> Counter[str]:
        """Stop counting; the counts per address ("127.0.0.1:PORT", or "lua")."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(timeout=5)
        return Counter(self.counts)


def requests_of(counts: Counter[str], ports: set[int]) -> int:
    """The commands sent from any of these local ports."""
    return sum(
        n
        for addr, n in counts.items()
        if addr.rsplit(":", 1)[-1].isdigit() and int(addr.rsplit(":", 1)[1]) in ports
    )


# -- etcd and ZooKeeper: server-wide totals --------------------------------------------------


def etcd_messages_received(endpoint: str) -> float:
    with urllib.request.urlopen(f"{endpoint}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("grpc_server_msg_received_total{")
    )


def zk_four_letter(port: int, word: str) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(word.encode())
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def zk_packets_received(port: int) -> float:
    """`zk_packets_received` of mntr; the mntr connection adds its own packet (the same in every
    window, so it cancels out of a difference)."""
    for line in zk_four_letter(port, "mntr").splitlines():
        key, _, value = line.partition("\t")
        if key == "zk_packets_received":
            return float(value)
    raise OSError("mntr has no zk_packets_received (is 4lw.commands.whitelist set?)")
