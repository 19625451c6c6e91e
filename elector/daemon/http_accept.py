"""The HTTP server's lobby: connections taken from the kernel's queue that wait for a slot, and
the probes answered as they are accepted.

Why: under a flood of large heads on a loaded machine, fresh probes would time out in the
kernel's accept queue while the HTTP thread reads the flood's heads. That thread then gets a small
share of a core, so its loop's turns are long, and an ordinary connection needs about five turns
(accept, transport, task, read, answer) before its answer leaves. The kernel's queue is first come, first
served and the loop's turns are as long as all that is ready in them; the lobby is neither.

At each turn the server takes every connection the kernel has queued (up to the lobby's room)
and looks at what each has sent without consuming it (MSG_PEEK):

- one whole request without a body that asks for `Connection: close` (as a kubelet's probes
  do), to a route the application answers without waiting (`AnswersAtOnce`): it is answered and
  closed right there, in the turn it was accepted, without a slot (`answer_at_once`);
- another whose whole head has arrived within PRIORITY_HEAD_BYTES (a scrape, a keep-alive
  probe) is `ready` and gets the next slot before any other;
- the rest follow in arrival order. One that has sent nothing yet is watched (a reader on its
  socket) and looked at again when its first bytes come: a probe connects, then writes.

The lobby holds at most `limit` connections, so HTTP holds at most twice the connection cap in
descriptors. When it is full, a new arrival takes the place of the oldest one that cannot be a
probe: first one whose first bytes were not a small complete head, then a silent one once it is
`grace_s` old (a probe's request follows its connect at once); when none may go, the server
stops accepting (the kernel's queue holds the rest) until one leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable

import h11

from elector.daemon.http_connection import MAX_HEAD_BYTES, AnswersAtOnce, parse_request, response_event

#: A request head that has fully arrived within this many bytes goes first (see the module doc).
PRIORITY_HEAD_BYTES = 2048
#: The largest answer given at once: what a fresh TCP socket's send buffer takes whole (Linux's
#: smallest default, net.ipv4.tcp_wmem's middle value, is 16 KiB). Larger ones (a /leader of many
#: locks) take the ordinary way, written as the client reads them.
AT_ONCE_MAX_BYTES = 16 * 1024
#: The end of a request head; h11 also takes bare line feeds.
_HEAD_ENDS = (b"\r\n\r\n", b"\n\n", b"\n\r\n")


class Arrival:
    """One accepted connection without a slot yet."""

    __slots__ = ("accepted_at", "counted", "sock", "watched")

    def __init__(self, sock: socket.socket, *, accepted_at: float) -> None:
        self.sock = sock
        self.accepted_at = accepted_at
        #: Whether it was counted as deferred (it waited for a slot).
        self.counted = False
        #: Whether a reader watches its socket for its first bytes.
        self.watched = False


def _complete_small_head(data: bytes) -> bool:
    return any(end in data for end in _HEAD_ENDS)


def answer_at_once(sock: socket.socket, data: bytes, app: AnswersAtOnce) -> bool:
    """Answer and close a connection in one go, if `data` (what it has sent, peeked) is one whole
    request without a body that asks for `Connection: close` and the application answers it
    without waiting; False (nothing consumed) when it must take the ordinary way, with a slot.

    A kubelet's probe is such a request: answered here, in the turn its connection is accepted,
    it never waits for a slot, a task, or the several turns of the loop an ordinary connection
    takes (each as long as everything else that is ready then: a flood's heads, for instance).
    """
    protocol = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
    protocol.receive_data(data)
    try:
        event = protocol.next_event()
        if not isinstance(event, h11.Request) or protocol.next_event() != h11.EndOfMessage():
            return False
    except h11.RemoteProtocolError:
        return False  # the ordinary way answers 400 and lingers
    if protocol.trailing_data[0]:  # pipelined: more than one request
        return False
    closes = any(name == b"connection" and b"close" in value.lower() for name, value in event.headers)
    if not closes:  # a keep-alive client may send its next request while we close
        return False
    request = parse_request(event)
    response = app.answer_now(request)
    if response is None:
        return False
    answer = protocol.send(response_event(response)) or b""
    if request.method != "HEAD":
        answer += protocol.send(h11.Data(data=response.body)) or b""
    answer += protocol.send(h11.EndOfMessage()) or b""
    if len(answer) > AT_ONCE_MAX_BYTES:
        return False
    with contextlib.suppress(OSError):
        # Consume what was peeked, so that the close is a FIN (unread input would make it a
        # reset, which may destroy the answer in the client's buffer), then answer and close.
        if sock.recv(len(data)) == data:
            sock.send(answer)
    sock.close()
    return True


class Lobby:
    """Accepted connections waiting for a slot: ready ones (a small complete head) first.

    `on_change` is called (from the loop) when an arrival became ready, or one left (the
    server then admits, or resumes accepting).
    """

    def __init__(
        self,
        *,
        limit: int,
        grace_s: float,
        on_change: Callable[[], None],
        app: AnswersAtOnce | None = None,
    ) -> None:
        self._limit = limit
        #: Answers ready requests at once when it can (`answer_at_once`).
        self._app = app
        self._grace_s = grace_s
        self._on_change = on_change
        self._loop = asyncio.get_running_loop()
        #: Each in arrival order (dicts keep it): ready, silent (watched), and the others.
        self._ready: dict[Arrival, None] = {}
        self._silent: dict[Arrival, None] = {}
        self._others: dict[Arrival, None] = {}

    def __len__(self) -> int:
        return len(self._ready) + len(self._silent) + len(self._others)

    def has_room(self) -> bool:
        """Whether a new arrival can be taken (there is room, or an arrival may be cut for it)."""
        return len(self) < self._limit or self._droppable() is not None

    def add(self, sock: socket.socket) -> bool:
        """Take a just accepted connection (call `has_room` first); True if an older one was cut
        to make room for it."""
        victim = self._droppable() if len(self) >= self._limit else None
        if victim is not None:
            self._leave(victim)
            victim.sock.close()
        self._classify(Arrival(sock, accepted_at=self._loop.time()))
        return victim is not None

    def count_waiting(self) -> int:
        """How many of the lobby's connections wait for a slot and were not counted so before."""
        new = 0
        for line in (self._ready, self._silent, self._others):
            for arrival in line:
                if not arrival.counted:
                    arrival.counted = True
                    new += 1
        return new

    def has_ready(self) -> bool:
        return bool(self._ready)

    def pop(self) -> Arrival | None:
        """The arrival to admit next, out of the lobby (its socket unwatched), or None."""
        arrival = next(iter(self._ready), None)
        if arrival is None:  # the others in arrival order, silent or not
            other, silent = next(iter(self._others), None), next(iter(self._silent), None)
            if other is None or (silent is not None and silent.accepted_at < other.accepted_at):
                other = silent
            arrival = other
        if arrival is not None:
            self._leave(arrival)
        return arrival

    def next_grace_end(self) -> float | None:
        """When the oldest silent arrival may be cut (loop time), if any is in the lobby."""
        oldest = next(iter(self._silent), None)
        return None if oldest is None else oldest.accepted_at + self._grace_s

    def close(self) -> None:
        for line in (self._ready, self._silent, self._others):
            for arrival in list(line):
                self._leave(arrival)
                arrival.sock.close()

    def _droppable(self) -> Arrival | None:
        oldest = next(iter(self._others), None)
        if oldest is not None:
            return oldest
        silent = next(iter(self._silent), None)
        if silent is not None and self._loop.time() >= silent.accepted_at + self._grace_s:
            return silent
        return None

    def _leave(self, arrival: Arrival) -> None:
        for line in (self._ready, self._silent, self._others):
            line.pop(arrival, None)
        if arrival.watched:
            arrival.watched = False
            self._loop.remove_reader(arrival.sock)

    def _classify(self, arrival: Arrival) -> None:
        """Look at what the connection has sent (without consuming it) and put it in its line."""
        try:
            data = arrival.sock.recv(PRIORITY_HEAD_BYTES, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            self._silent[arrival] = None
            arrival.watched = True
            self._loop.add_reader(arrival.sock, self._heard, arrival)
            return
        except OSError:  # reset while queued: nobody to answer
            arrival.sock.close()
            return
        if not data:  # closed before sending anything (a probe that gave up)
            arrival.sock.close()
            return
        if not _complete_small_head(data):
            self._others[arrival] = None
        elif self._app is None or not answer_at_once(arrival.sock, data, self._app):
            self._ready[arrival] = None
        # else: answered and closed

    def _heard(self, arrival: Arrival) -> None:
        """A silent arrival's first bytes (or its end) came: it changes line, and may go first."""
        if arrival not in self._silent:
            return
        self._leave(arrival)
        with contextlib.suppress(OSError):
            self._classify(arrival)
        self._on_change()
