"""The memory footprint of a process tree (a daemon, its keeper and its command), as a container
would be charged for it.

A container's memory accounting charges each page once. Summing RSS over the tree counts the pages
its processes share (the interpreter, shared libraries, a keeper forked from nothing but sharing
libpython's file pages with the daemon) once per process. PSS divides each shared page among the
processes mapping it, so that the tree's PSS sums to what the tree costs - when nothing outside the
tree maps the same files. On a shared host that is not so: every Python process of the machine
maps the same libpython, and the host's PSS of the tree comes out lower than in a container.

So three figures:
- `pss_kib`: /proc/PID/smaps_rollup `Pss:` summed over the tree (as the host sees it);
- `rss_kib`: VmRSS summed over the tree (shared pages counted once per process);
- `own_kib`: the tree's distinct resident pages (from /proc/PID/pagemap's page frame numbers:
  root only), i.e. its PSS in a container of its own, whatever else runs on the host; None when
  the frame numbers cannot be read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import struct
from pathlib import Path

from bench.peers.probes import process_tree

PAGE = os.sysconf("SC_PAGE_SIZE")
_PRESENT = 1 << 63
_PFN_MASK = (1 << 55) - 1


@dataclasses.dataclass(frozen=True)
class TreeMemory:
    pids: tuple[int, ...]
    pss_kib: int
    rss_kib: int
    own_kib: int | None

    @property
    def container_pss_kib(self) -> int:
        """The tree's PSS in a container of its own: `own_kib` where known, else the host's PSS."""
        return self.own_kib if self.own_kib is not None else self.pss_kib


def _field_kib(path: Path, key: str) -> int:
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1])
    return 0


def _frames(pid: int) -> set[int] | None:
    """Page frame numbers of PID's resident pages; None when they read as zero (not root)."""
    frames: set[int] = set()
    try:
        with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/pagemap", "rb") as pagemap:
            for line in maps:
                start, end = (int(x, 16) for x in line.split(maxsplit=1)[0].split("-"))
                if line.rstrip().endswith("[vsyscall]"):
                    continue
                pagemap.seek(start // PAGE * 8)
                data = pagemap.read((end - start) // PAGE * 8)
                for (entry,) in struct.iter_unpack("Q", data[: len(data) // 8 * 8]):
                    if entry & _PRESENT:
                        frame = entry & _PFN_MASK
                        if frame == 0:
                            return None
                        frames.add(frame)
    except OSError:
        return None
    return frames


def tree_memory(pid: int) -> TreeMemory:
    pids = tuple(process_tree(pid))
    pss = sum(_field_kib(Path(f"/proc/{p}/smaps_rollup"), "Pss:") for p in pids)
    rss = sum(_field_kib(Path(f"/proc/{p}/status"), "VmRSS:") for p in pids)
    union: set[int] | None = set()
    for p in pids:
        frames = _frames(p)
        if frames is None or union is None:
            union = None
            continue
        union |= frames
    own = None if union is None else len(union) * PAGE // 1024
    return TreeMemory(pids, pss, rss, own)
