"""Pipelining of the lease scripts' calls that fall due together.

A daemon holding many locks renews each of them every 0.3 x ttl. Calls issued in the same
event-loop iteration (renewal timers that fire together, the burst of acquisitions at start-up)
are sent as ONE non-transactional pipeline of EVALSHA commands: one write, one pooled connection
and one round trip for the lot, instead of one of each per call. A call alone in its iteration
(renewals spread over time) is sent as a plain script call. Each script stays its own
command, atomic on its own; nothing is wrapped in MULTI, so one call's failure never touches
another's.

Each caller gets its own reply or its own exception, the very exception a single
`Script.__call__` would have raised (a redis-py error): the backend translates it exactly as it
translates a single call's. A NOSCRIPT reply (Redis restarted, SCRIPT FLUSH) is answered by one
more pipeline that loads the missing scripts and retries those calls once. A failing connection
fails the callers of its batch only; other batches run on other pooled connections.

Timeouts stay per request: the client's socket timeout bounds every read of the pipeline, and
each caller keeps its own deadline. A caller that gives up (cancelled) is dropped from a batch
not yet sent and its reply is discarded otherwise; the batch itself runs in a task of its own,
so the cancellation never reaches the shared connection.

Latency: every caller of a batch gets its reply once the whole batch has been read, so when a
thousand renewals fall due at one instant the last ones wait for all of them (docs/benchmarks.md,
many_locks); spread renewals keep batches small and replies prompt.
A linger (`linger_s`) trades latency for fewer round trips when calls are spread: off by default.

Flush spacing (`min_flush_interval_s`, on by default): a batch goes out at most once per this
interval. A call that finds no batch sent within the interval goes out at once (the lone renewal
of a single-lock daemon, a handoff's acquire: no added latency); a call that comes sooner waits
for the rest of the interval, collecting the others that come meanwhile. A daemon of 10,000
locks makes ~3,300 calls a second, spread evenly: sent one by one, each costs a write, a read
and redis-py's per-command bookkeeping (most of a renewal's CPU, the kernel's send() a good part
of it); spaced by 2 ms they go out ~7 at a time, each waiting 2 ms at most.

Calls made with `ack` (--min-replicas-ack, see replication.py) get a WAIT appended to their
pipeline: one WAIT at the end covers every write of the batch, since WAIT waits for all writes
of its connection. Such callers get `(reply, replicas_acknowledged)`.

Batch scripts (lua/batch.py). Calls of a script with a batch form (ACQUIRE, RENEW, RELEASE: the
backend names it) that go out together are not sent as one EVALSHA each: the calls of one script
become ONE call of its batch form (at most `MAX_LEASES_PER_CALL` leases each), which runs the
single script's own body once per lease and answers each lease its own reply or error. Redis
then parses one command instead of N, and the client packs and parses one. Nothing changes for
a call alone in its flush (sent as before, at once), and nothing waits longer: batching only
regroups calls that go out together anyway.
Calls that go out together are concurrent (their callers did not wait for each other), so their
order inside a round trip is not specified, as it never was (a burst is split into pipelines
that run on different connections).

Redis Cluster (a `RedisCluster` client): every key of one script call must lie in one hash slot,
so calls are batched per slot (the first key's: every key of a lock shares its `{<lock>}` tag)
and each slot's command is its own request, routed by redis-py to the slot's master (MOVED/ASK
followed there), all of a flush at once. redis-py's cluster pipelines refuse EVALSHA. Calls with
`ack` are not batched on a cluster (a cluster's backends take no --min-replicas-ack).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import math
from collections.abc import Sequence
from typing import Any, cast

import redis.asyncio
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, ResponseError
from redis.typing import EncodableT, KeyT

from elector.backend.packed import pack_batch
from elector.backend.packed import round_trip as packed_round_trip
from elector.backend.replication import ReplicaAck, acknowledged, run_script_acked

#: Default flush spacing, seconds (see the module doc): the most a call waits for others to join.
DEFAULT_MIN_FLUSH_INTERVAL_S = 0.002

#: Most calls in one batch script call: Redis runs a script alone, so a batch of N holds every
#: other client for N single calls' time (~40 us each for RENEW): 100 is ~4 ms at most.
MAX_LEASES_PER_CALL = 100

#: Upper bound of the commands in one pipeline: a bigger burst is split, so that one slow batch
#: holds no more than this many callers, and Redis answers each batch without a long stall.
DEFAULT_MAX_BATCH = 256


@dataclasses.dataclass(slots=True)
class _Call:
    script: AsyncScript
    numkeys: int
    keys_and_args: tuple[Any, ...]
    future: asyncio.Future[Any]
    #: WAIT for replicas after this call; its future then gets (reply, replicas acknowledged).
    ack: ReplicaAck | None = None
    #: The source of the script's batch form (lua/batch.py), if it has one.
    batch_form: str | None = None
    #: The call's keys and arguments already in RESP (`resp_bulks`), for `_execute_packed`.
    packed: tuple[bytes, bytes] | None = None


@dataclasses.dataclass(slots=True)
class _Command:
    """One EVALSHA of a round trip: a single call, or a batch script carrying several calls."""

    script: AsyncScript
    numkeys: int
    keys_and_args: tuple[Any, ...]
    calls: list[_Call]
    batched: bool

    @property
    def ack(self) -> ReplicaAck | None:
        ack: ReplicaAck | None = None
        for call in self.calls:
            if call.ack is not None:
                ack = call.ack.widest(ack)
        return ack


@dataclasses.dataclass(slots=True)
class BatcherStats:
    """Counters for tests and benchmarks."""

    calls: int = 0
    #: Round trips: pipelines sent (NOSCRIPT reload-and-retry ones included) and lone calls.
    pipelines: int = 0
    largest_batch: int = 0
    #: Commands that met NOSCRIPT and were retried after loading their script.
    noscript_retries: int = 0
    #: Batch script calls sent, and the calls they carried.
    batch_scripts: int = 0
    batched_calls: int = 0


class ScriptBatcher:
    """Sends the script calls of one event-loop iteration as one pipeline."""

    def __init__(
        self,
        client: redis.asyncio.Redis | RedisCluster,
        *,
        max_batch: int = DEFAULT_MAX_BATCH,
        linger_s: float = 0.0,
        min_flush_interval_s: float = DEFAULT_MIN_FLUSH_INTERVAL_S,
    ) -> None:
        if max_batch < 1 or linger_s < 0 or min_flush_interval_s < 0:
            raise ValueError("max_batch must be positive, linger_s and min_flush_interval_s not negative")
        self._client = client
        self._cluster = client if isinstance(client, RedisCluster) else None
        #: The batch forms in use, registered on the client, by their source.
        self._batch_forms: dict[str, AsyncScript] = {}
        self._max_batch = max_batch
        self._linger_s = linger_s
        self._min_flush_interval_s = min_flush_interval_s
        #: Loop time of the last flush.
        self._flushed_at = -math.inf
        self._queue: list[_Call] = []
        self._flush_handle: asyncio.Handle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.stats = BatcherStats()

    @property
    def client(self) -> redis.asyncio.Redis | RedisCluster:
        return self._client

    async def run_script(
        self,
        script: AsyncScript,
        *,
        keys: Sequence[KeyT] = (),
        args: Sequence[EncodableT] = (),
        ack: ReplicaAck | None = None,
        batch_form: str | None = None,
    ) -> Any:
        """Run `script` (registered on any client of the same server); its reply, or its error.

        With `ack`: WAIT for replicas after it, and return `(reply, replicas acknowledged)`.
        `batch_form`: the source of the script's batch form (lua/batch.py), with which the calls
        of `script` that go out together become one script call.
        """
        return await self.submit(script, keys=keys, args=args, ack=ack, batch_form=batch_form)

    def submit(
        self,
        script: AsyncScript,
        *,
        keys: Sequence[KeyT] = (),
        args: Sequence[EncodableT] = (),
        ack: ReplicaAck | None = None,
        batch_form: str | None = None,
        packed: tuple[bytes, bytes] | None = None,
    ) -> asyncio.Future[Any]:
        """`run_script` without a coroutine: the future of the call's reply (or error). A caller
        that gives up cancels it. Many calls submitted in one go (a round of renewals, see
        daemon/many_locks/rounds.py) go out in the same flush at the cost of a future each.

        `packed`: `keys` and `args` already encoded by `resp_bulks` (a lease's renewal sends the
        same ones every time): a flush of such calls only is sent without redis-py's packing."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._queue.append(_Call(script, len(keys), (*keys, *args), future, ack, batch_form, packed))
        self.stats.calls += 1
        if len(self._queue) >= self._max_batch:
            self._flush()
        elif self._flush_handle is None:
            # call_soon runs after every callback already queued for this iteration, so all
            # the calls made meanwhile (timers that fired together) join this batch.
            delay_s = max(self._linger_s, self._flushed_at + self._min_flush_interval_s - loop.time())
            if delay_s > 0:
                self._flush_handle = loop.call_later(delay_s, self._flush)
            else:
                self._flush_handle = loop.call_soon(self._flush)
        return future

    async def aclose(self) -> None:
        """Send what is queued and wait for every batch in flight."""
        if self._queue:
            self._flush()
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _flush(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        # A caller cancelled before the batch went out is not sent at all.
        calls = [call for call in self._queue if not call.future.done()]
        self._queue = []
        loop = asyncio.get_running_loop()
        self._flushed_at = loop.time()
        for start in range(0, len(calls), self._max_batch):
            task = loop.create_task(self._execute(calls[start : start + self._max_batch]))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _batch_form(self, call: _Call) -> AsyncScript | None:
        if call.batch_form is None or (self._cluster is not None and call.ack is not None):
            return None
        form = self._batch_forms.get(call.batch_form)
        if form is None:
            form = self._batch_forms[call.batch_form] = self._client.register_script(call.batch_form)
        return form

    def _commands(self, calls: list[_Call]) -> list[_Command]:
        """The calls as commands: those of one script with a batch form share one batch call
        (per hash slot on a cluster), the others go as they are."""
        commands: list[_Command] = []
        open_batches: dict[tuple[str, int, int, int], _Command] = {}
        for call in calls:
            form = self._batch_form(call)
            if form is None:
                commands.append(_Command(call.script, call.numkeys, call.keys_and_args, [call], False))
                continue
            slot = -1 if self._cluster is None else self._cluster.keyslot(call.keys_and_args[0])
            group = (form.sha, call.numkeys, len(call.keys_and_args) - call.numkeys, slot)
            command = open_batches.get(group)
            if command is None or len(command.calls) >= MAX_LEASES_PER_CALL:
                command = _Command(form, 0, (), [], True)
                open_batches[group] = command
                commands.append(command)
            command.calls.append(call)
        for command in commands:
            if not command.batched:
                continue
            if len(command.calls) == 1:  # alone after all: its own script, as it is
                call = command.calls[0]
                command.script, command.numkeys, command.keys_and_args = (
                    call.script,
                    call.numkeys,
                    call.keys_and_args,
                )
                command.batched = False
                continue
            first = command.calls[0]
            keys: list[Any] = []
            args: list[Any] = [first.numkeys, len(first.keys_and_args) - first.numkeys]
            for call in command.calls:
                keys += call.keys_and_args[: call.numkeys]
                args += call.keys_and_args[call.numkeys :]
            command.numkeys, command.keys_and_args = len(keys), (*keys, *args)
            self.stats.batch_scripts += 1
            self.stats.batched_calls += len(command.calls)
        return commands

    async def _execute(self, calls: list[_Call]) -> None:
        self.stats.largest_batch = max(self.stats.largest_batch, len(calls))
        if len(calls) == 1:
            await self._execute_one(calls[0])
            return
        if self._packable(calls):
            await self._execute_packed(calls)
            return
        commands = self._commands(calls)
        if self._cluster is not None:
            await asyncio.gather(*(self._execute_alone(command) for command in commands))
            return
        if len(commands) == 1 and commands[0].ack is None:
            await self._execute_alone(commands[0])
            return
        try:
            replies, wait_reply = await self._pipeline([], commands)
            waits = [wait_reply] * len(commands)
            missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
            if missing:
                self.stats.noscript_retries += len(missing)
                retried, retried_wait = await self._pipeline(
                    list({commands[i].script.sha: commands[i].script for i in missing}.values()),
                    [commands[i] for i in missing],
                )
                for i, reply in zip(missing, retried, strict=True):
                    replies[i] = reply
                    waits[i] = retried_wait  # the first WAIT covered no write of a retried call
        except Exception as exc:  # the connection failed: every caller of this batch gets it
            for call in calls:
                if not call.future.done():
                    call.future.set_exception(copy.copy(exc))
            return
        for command, reply, wait in zip(commands, replies, waits, strict=True):
            self._deliver(command, reply, wait)

    def _packable(self, calls: list[_Call]) -> bool:
        """Whether the calls can go as `_execute_packed` sends them: each with its keys and
        arguments packed, of one script with a batch form, shaped alike, no WAIT, no cluster."""
        first = calls[0]
        if (
            self._cluster is not None
            or first.batch_form is None
            or getattr(self._client, "single_connection_client", True)
        ):
            return False
        shape = (first.script.sha, first.numkeys, len(first.keys_and_args))
        return all(
            call.packed is not None
            and call.ack is None
            and (call.script.sha, call.numkeys, len(call.keys_and_args)) == shape
            for call in calls
        )

    async def _execute_packed(self, calls: list[_Call]) -> None:
        """Calls of one script whose keys and arguments come packed (packed.py): one batch script
        call per MAX_LEASES_PER_CALL of them, in one round trip; NOSCRIPT is answered by loading
        the batch form and sending again those that met it (once)."""
        first = calls[0]
        assert first.batch_form is not None
        form = self._batch_form(first)
        assert form is not None
        keys, args = first.numkeys, len(first.keys_and_args) - first.numkeys
        commands = [
            _Command(form, 0, (), calls[start : start + MAX_LEASES_PER_CALL], True)
            for start in range(0, len(calls), MAX_LEASES_PER_CALL)
        ]
        payloads = [
            pack_batch(form.sha, keys_per_call=keys, args_per_call=args, packed=[c.packed for c in cmd.calls])  # type: ignore[misc]
            for cmd in commands
        ]
        self.stats.batch_scripts += len(commands)
        self.stats.batched_calls += len(calls)
        client = cast(redis.asyncio.Redis, self._client)
        try:
            self.stats.pipelines += 1
            replies = await packed_round_trip(client, payloads)
            missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
            if missing:
                self.stats.noscript_retries += len(missing)
                self.stats.pipelines += 1
                await client.script_load(form.script)
                for i, reply in zip(
                    missing, await packed_round_trip(client, [payloads[i] for i in missing]), strict=True
                ):
                    replies[i] = reply
        except Exception as exc:  # the connection failed: every caller of this flush gets it
            for call in calls:
                if not call.future.done():
                    call.future.set_exception(copy.copy(exc))
            return
        for command, reply in zip(commands, replies, strict=True):
            self._deliver(command, reply, None)

    async def _execute_alone(self, command: _Command) -> None:
        """One command as its own request (the script call reloads its script on NOSCRIPT)."""
        if not command.batched:
            await self._execute_one(command.calls[0])
            return
        self.stats.pipelines += 1
        keys = command.keys_and_args[: command.numkeys]
        args = command.keys_and_args[command.numkeys :]
        try:
            reply = await command.script(keys=keys, args=args, client=self._client)
        except Exception as exc:
            reply = exc
        self._deliver(command, reply, None)

    def _deliver(self, command: _Command, reply: Any, wait: Any) -> None:
        """Each caller of `command` its own reply (of a batch: its element) or exception."""
        if command.batched:
            if isinstance(reply, Exception):
                replies: list[Any] = [copy.copy(reply) for _ in command.calls]
            elif isinstance(reply, list) and len(reply) == len(command.calls):
                replies = reply
            else:
                count = len(command.calls)
                problem = ResponseError(f"a batch script answered {count} leases with {reply!r:.100}")
                replies = [copy.copy(problem) for _ in command.calls]
        else:
            replies = [reply]
        for call, one in zip(command.calls, replies, strict=True):
            if call.future.done():
                continue  # the caller gave up; its reply is dropped
            if isinstance(one, Exception):
                call.future.set_exception(one)
            elif call.ack is None:
                call.future.set_result(one)
            else:
                try:
                    call.future.set_result((one, acknowledged(wait)))
                except Exception as exc:  # WAIT itself failed (e.g. sent to a replica)
                    call.future.set_exception(exc)

    async def _execute_one(self, call: _Call) -> None:
        # A batch of one (renewals spread over time) skips the pipeline's bookkeeping: the plain
        # script call, which reloads the script on NOSCRIPT by itself.
        self.stats.pipelines += 1
        keys, args = call.keys_and_args[: call.numkeys], call.keys_and_args[call.numkeys :]
        try:
            if call.ack is None:
                reply = await call.script(keys=keys, args=args, client=self._client)
            else:
                # (A cluster's backends take no replica_ack: the cluster client has no such pipeline.)
                client = cast(redis.asyncio.Redis, self._client)
                reply = await run_script_acked(client, call.script, keys=keys, args=args, ack=call.ack)
        except Exception as exc:
            if not call.future.done():
                call.future.set_exception(exc)
            return
        if not call.future.done():
            call.future.set_result(reply)

    async def _pipeline(self, load: list[AsyncScript], commands: list[_Command]) -> tuple[list[Any], Any]:
        """One round trip: SCRIPT LOAD each of `load`, EVALSHA each command, then one WAIT if a
        call asked for replicas' acknowledgement; the commands' replies and WAIT's (None without)."""
        pipe = self._client.pipeline(transaction=False)
        for script in load:
            pipe.script_load(script.script)
        ack: ReplicaAck | None = None
        for command in commands:
            pipe.evalsha(command.script.sha, command.numkeys, *command.keys_and_args)
            command_ack = command.ack
            if command_ack is not None:
                ack = command_ack.widest(ack)
        if ack is not None:
            pipe.execute_command("WAIT", ack.replicas, ack.timeout_ms)
        self.stats.pipelines += 1
        replies: list[Any] = await pipe.execute(raise_on_error=False)
        if ack is None:
            return replies[len(load) :], None
        return replies[len(load) : -1], replies[-1]
