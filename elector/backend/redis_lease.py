"""The lease protocol of one lock on Redis. No election logic: one request per method."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import redis.asyncio
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript
from redis.typing import EncodableT, KeyT

from elector.backend import candidates, protocol
from elector.backend.codec import parse_holder, release_announcement, remaining_ms
from elector.backend.errors import invalid_request, translate_error
from elector.backend.lua import batch as batch_scripts
from elector.backend.lua import lease as scripts
from elector.backend.packed import resp_bulks
from elector.backend.pipeline import ScriptBatcher
from elector.backend.pubsub import LeaseEventSource
from elector.backend.pubsub.subscriptions import RedisEventSubscription
from elector.backend.replication import ReplicaAck, ReplicationAckError, run_script_acked
from elector.backend.script_registry import preload_scripts_soon, registered_script
from elector.lease import (
    AcquireResult,
    BackendErrorKind,
    Candidate,
    Granted,
    Handoff,
    Held,
    Lease,
    LeaseBackendError,
    LeaseEventSubscription,
    Lost,
    Observation,
    QuietPeriod,
    Renewed,
    RenewResult,
    StandBack,
)

T = TypeVar("T")

__all__ = ["RedisLeaseBackend", "registered_script"]

#: `renew_result` of the batch form's plain renewal: nothing to report (one object for all).
_PLAIN_RENEWAL = Renewed()


class RedisLeaseBackend:
    """The `LeaseBackend` of one named lock on one Redis (standalone) server.

    Several backends (one per lock) may share one client and its connection pool, one event
    source (a `LeaseEventSource` such as the `EventHub`: one pub/sub connection for every lock's
    announcements) and one `ScriptBatcher` (script calls that fall due together go out as one
    pipeline). Without them: a pub/sub connection per subscription, a round trip per call.

    Every method raises only LeaseBackendError, a bad argument too (a priority out of range, a
    ttl or handoff window that is not positive: DATA, as the scripts would answer it).

    With `replica_ack` (--min-replicas-ack) every grant and renewal is followed by a WAIT on the
    same connection; too few acknowledgements make it a failed request (ReplicationAckError),
    and an unacknowledged grant is released first.
    """

    def __init__(
        self,
        client: redis.asyncio.Redis,
        *,
        lock: str,
        key_prefix: str = "elector",
        hub: LeaseEventSource | None = None,
        batcher: ScriptBatcher | None = None,
        replica_ack: ReplicaAck | None = None,
    ) -> None:
        if (
            batcher is not None
            and batcher.client is not client
            and (isinstance(client, RedisCluster) or isinstance(batcher.client, RedisCluster))
        ):
            # A cluster's batcher batches per hash slot on that very cluster client (pipeline.py).
            raise ValueError("a Redis Cluster client needs a ScriptBatcher of that same client")
        self._client = client
        self._replica_ack = replica_ack
        self._hub = hub
        self._batcher = batcher
        self._lock = lock
        self.keys = scripts.LockKeys(lock, prefix=key_prefix)
        #: RENEW's keys, in its order: the same at every renewal.
        self._renew_keys = (
            self.keys.lease,
            self.keys.candidates,
            self.keys.candidate_expiry,
            self.keys.handoff,
            self.keys.meta,
            self.keys.candidate_instances,
        )
        #: RENEW's keys in RESP, and the lease, priority, arguments and RESP pieces of the last
        #: `renew_soon` (a term renews with the same ones every time, see packed.py).
        self._renew_keys_resp = resp_bulks(self._renew_keys)
        self._renew_packed: tuple[Lease, int, tuple[str | int, ...], tuple[bytes, bytes]] | None = None
        self._acquire = registered_script(client, scripts.ACQUIRE)
        self._renew = registered_script(client, scripts.RENEW)
        self._release = registered_script(client, scripts.RELEASE)
        self._observe = registered_script(client, scripts.OBSERVE)
        self._withdraw = registered_script(client, scripts.WITHDRAW)
        self._request_handoff = registered_script(client, scripts.REQUEST_HANDOFF)
        self._candidates = registered_script(client, scripts.CANDIDATES)
        self._uncertain_token: str | None = None
        #: What this contender has seen of the lock, for ACQUIRE (see lua/lease.py): the longest ttl
        #: in use and the highest fencing token.
        self._ttls = protocol.TtlMemory()
        self._highest_token = 0
        #: This instance's nonce in the candidate registry (lua/lease.py): another live process
        #: registering our identity under another nonce is a clash (`Granted.identity_clash`).
        self.nonce = secrets.token_hex(8)
        #: Whether a registration of ours was answered: the first one's clash is not reported,
        #: since the entry it finds may be a restarted predecessor's (it lives on for 3 ttl).
        self._registered = False

    @property
    def lock(self) -> str:
        return self._lock

    async def _call(self, what: str, request: Callable[[], Awaitable[T]]) -> T:
        try:
            return await request()
        except LeaseBackendError:
            raise
        except Exception as exc:  # every client failure becomes the one domain error
            raise self._translate(exc, what=what) from exc

    def _translate(self, exc: BaseException, *, what: str) -> LeaseBackendError:
        # Every key a script reads without pcall: the server key too (ACQUIRE GETs it).
        keys = (
            f"{self.keys.lease} or {self.keys.fencing} or {self.keys.quiet} or {self.keys.server} "
            f"or {self.keys.meta}"
        )
        return translate_error(exc if isinstance(exc, Exception) else Exception(exc), what=what, keys=keys)

    async def _run(
        self,
        script: AsyncScript,
        *,
        keys: Sequence[KeyT],
        args: Sequence[EncodableT] = (),
        batch_form: str | None = None,
    ) -> Any:
        """Every script call goes through here: pipelined with other calls when there is a batcher
        (and with `batch_form`, lua/batch.py, carried in one batch script call with them)."""
        if self._batcher is not None:
            return await self._batcher.run_script(script, keys=keys, args=args, batch_form=batch_form)
        return await script(keys=keys, args=args)

    async def _run_acked(
        self, script: AsyncScript, *, keys: Sequence[KeyT], args: Sequence[EncodableT], batch_form: str
    ) -> tuple[Any, int | None]:
        """`_run` followed by the WAIT of --min-replicas-ack on the same connection, when set;
        the reply and how many replicas acknowledged it (None without the setting)."""
        ack = self._replica_ack
        if ack is None:
            return await self._run(script, keys=keys, args=args, batch_form=batch_form), None
        if self._batcher is not None:
            reply, acked = await self._batcher.run_script(
                script, keys=keys, args=args, ack=ack, batch_form=batch_form
            )
            return reply, acked
        return await run_script_acked(self._client, script, keys=keys, args=args, ack=ack)

    async def acquire(self, identity: str, *, ttl_ms: int, priority: int = 0) -> AcquireResult:
        if ttl_ms <= 0:
            raise invalid_request("acquire", f"ttl must be positive, got {ttl_ms} ms")
        candidates.check_priority(priority, what="acquire")
        # After an attempt whose answer was lost (timeout, broken connection) Redis may have granted
        # it: retry with the same owner token, so the script can hand that grant back to us.
        owner_token = self._uncertain_token or secrets.token_hex(16)
        self._uncertain_token = owner_token
        try:
            reply, acked = await self._call(
                "acquire",
                lambda: self._run_acked(
                    self._acquire,
                    keys=[
                        self.keys.lease,
                        self.keys.fencing,
                        self.keys.quiet,
                        self.keys.server,
                        self.keys.candidates,
                        self.keys.candidate_expiry,
                        self.keys.handoff,
                        self.keys.meta,
                        self.keys.candidate_instances,
                    ],
                    args=[
                        candidates.encode_identity(identity),
                        owner_token,
                        ttl_ms,
                        self.keys.channel,
                        priority,
                        self._ttls.longest_ms(),
                        self._highest_token,
                        self.nonce,
                    ],
                    batch_form=batch_scripts.ACQUIRE_BATCH,
                ),
            )
        except LeaseBackendError as exc:
            if exc.kind not in (BackendErrorKind.TIMEOUT, BackendErrorKind.CONNECTION):
                self._uncertain_token = None
            raise
        self._uncertain_token = None
        preload_scripts_soon(self._client)  # the scripts of a term, once per client
        try:
            code = int(reply[0])
            if code == 4:
                raise LeaseBackendError(
                    "acquire: " + self._unknown_protocol(f"the meta hash {self.keys.meta}", reply[1]),
                    kind=BackendErrorKind.DATA,
                )
            clash = self._clash(reply, 3)
            if code == 1:
                fencing_token, value = int(reply[1]), bytes(reply[2]).decode("utf-8")
                self._saw_token(fencing_token)
                lease = Lease(
                    lock=self._lock,
                    identity=identity,
                    fencing_token=fencing_token,
                    ttl_ms=ttl_ms,
                    value=value,
                )
                if acked is not None and self._replica_ack is not None and acked < self._replica_ack.replicas:
                    await self._release_unacknowledged(
                        lease, owner_token=owner_token, acked=acked, ack=self._replica_ack
                    )
                return Granted(lease=lease, identity_clash=clash)
            if code == 0:
                return self._held(bytes(reply[1]), int(reply[2]), identity_clash=clash)
            if code == 2:
                return QuietPeriod(remaining_ms=max(0, int(reply[2])), identity_clash=clash)
            if code == 3:
                handoff = candidates.parse_handoff(reply[1], reply[2], what="acquire")
                return StandBack(handoff=handoff, identity_clash=clash)
        except (IndexError, TypeError, ValueError) as exc:
            raise translate_error(exc, what="acquire") from exc
        raise LeaseBackendError(f"acquire: unexpected reply code {code}", kind=BackendErrorKind.DATA)

    def _clash(self, reply: Any, index: int) -> bool:
        """The clash flag at `reply[index]` (0 when the reply has none), as reported: never on
        this instance's first answered registration (see `_registered`)."""
        clash = len(reply) > index and bool(int(reply[index])) and self._registered
        self._registered = True
        return clash

    def _held(self, raw: bytes, pttl: int, *, identity_clash: bool = False) -> Held:
        """Held, after checking the value's protocol and noting its token and ttl."""
        version = protocol.lease_version(raw)
        if version not in protocol.KNOWN_LEASE_VERSIONS:
            # Held all the same (nothing here overwrites a live lease), but nobody is told who holds it
            # from a format this code does not know: a DATA error names the problem instead.
            raise LeaseBackendError(
                "acquire: " + self._unknown_protocol(f"the lease value {self.keys.lease}", version),
                kind=BackendErrorKind.DATA,
            )
        holder = parse_holder(raw)
        if holder is not None:
            self._saw_token(holder.fencing_token)
        if holder is not None:
            # A protocol-1 value does not say its ttl: its remaining time is a lower bound of it.
            # (A value elector did not write says nothing about elector's ttls.)
            ttl_ms = protocol.lease_ttl_ms(raw) or (pttl if pttl > 0 else None)
            if ttl_ms is not None:
                self._ttls.note(min(ttl_ms, protocol.MAX_TTL_MS))
        return Held(holder=holder, remaining_ms=remaining_ms(pttl), identity_clash=identity_clash)

    def _saw_token(self, token: int) -> None:
        if 0 <= token < 10**15:
            self._highest_token = max(self._highest_token, token)

    def _unknown_protocol(self, where: str, version: object) -> str:
        if isinstance(version, bytes):
            version = version.decode("utf-8", "replace")
        return protocol.unknown_protocol_message(lock=self._lock, where=where, version=version)

    async def renew(self, lease: Lease, *, priority: int = 0) -> RenewResult:
        candidates.check_priority(priority, what="renew")
        keys = self._renew_keys
        identity = candidates.encode_identity(lease.identity)
        args: list[str | int] = [lease.value, lease.ttl_ms, identity, priority, self.nonce]
        reply, acked = await self._call(
            "renew",
            lambda: self._run_acked(self._renew, keys=keys, args=args, batch_form=batch_scripts.RENEW_BATCH),
        )
        return self._renew_result(reply, acked)

    @property
    def renews_in_rounds(self) -> bool:
        """Whether `renew_soon` can be used: renewals go through a batcher, with no WAIT after them."""
        return self._batcher is not None and self._replica_ack is None

    def renew_soon(self, lease: Lease, *, priority: int = 0) -> asyncio.Future[Any]:
        """`renew` without a coroutine (a round of many leases' renewals, daemon/many_locks/rounds.py): the
        future of its raw reply, sent with the batcher's next flush; `renew_result` reads it."""
        assert self._batcher is not None, "see renews_in_rounds"
        assert self._replica_ack is None, "see renews_in_rounds"
        candidates.check_priority(priority, what="renew")
        cached = self._renew_packed
        if cached is None or cached[0] is not lease or cached[1] != priority:
            identity = candidates.encode_identity(lease.identity)
            args = (lease.value, lease.ttl_ms, identity, priority, self.nonce)
            # The same keys and arguments at every renewal of a term: encoded once (packed.py).
            cached = self._renew_packed = (lease, priority, args, (self._renew_keys_resp, resp_bulks(args)))
        return self._batcher.submit(
            self._renew,
            keys=self._renew_keys,
            args=cached[2],
            batch_form=batch_scripts.RENEW_BATCH,
            packed=cached[3],
        )

    def renew_result(self, reply: asyncio.Future[Any]) -> RenewResult:
        """What `renew` returns (or raises) for the done future of `renew_soon`."""
        exc = reply.exception()
        if exc is not None:
            raise exc if isinstance(exc, LeaseBackendError) else self._translate(exc, what="renew")
        raw = reply.result()
        if raw == batch_scripts.RENEWED:
            return _PLAIN_RENEWAL
        return self._renew_result(raw, None)

    def _renew_result(self, reply: Any, acked: int | None) -> RenewResult:
        if reply == batch_scripts.RENEWED:  # the batch form's plain renewal (lua/batch.py)
            reply = [1, b"", 0, b"", 0, 0, 0]
        try:
            if int(reply[0]) == 1:
                clash = self._clash(reply, 6)
                if acked is not None and self._replica_ack is not None and acked < self._replica_ack.replicas:
                    raise ReplicationAckError("renew", acked=acked, ack=self._replica_ack)
                handoff, rival = candidates.parse_renewed(reply)
                return Renewed(handoff=handoff, best_rival=rival, identity_clash=clash)
            clash = self._clash(reply, 3)
            holder = parse_holder(bytes(reply[1]))
            if holder is not None:
                self._saw_token(holder.fencing_token)
            return Lost(holder=holder, remaining_ms=remaining_ms(int(reply[2])), identity_clash=clash)
        except (IndexError, TypeError, ValueError) as exc:
            raise translate_error(exc, what="renew") from exc

    async def _release_unacknowledged(
        self, lease: Lease, *, owner_token: str, acked: int, ack: ReplicaAck
    ) -> None:
        """Give back a grant too few replicas acknowledged, then raise ReplicationAckError."""
        try:
            released = await self.release(lease)
        except LeaseBackendError:
            # It lapses with its ttl, unless a retry (same owner token) adopts it and WAITs again.
            self._uncertain_token = owner_token
            released = False
        raise ReplicationAckError("acquire", acked=acked, ack=ack, released=released)

    async def release(
        self, lease: Lease, *, handoff_to: str | None = None, handoff_window_ms: int = 0
    ) -> bool:
        handoff = ""
        if handoff_to is not None:
            if handoff_window_ms <= 0:
                raise invalid_request(
                    "release", f"a handoff window must be positive, got {handoff_window_ms} ms"
                )
            handoff = candidates.handoff_value(from_identity=lease.identity, to_identity=handoff_to)
        message = release_announcement(
            identity=lease.identity, fencing_token=lease.fencing_token, to=handoff_to
        )
        keys = [self.keys.lease, self.keys.handoff]
        args: list[str | int] = [lease.value, self.keys.channel, message, handoff, max(0, handoff_window_ms)]
        reply: Any = await self._call(
            "release",
            lambda: self._run(self._release, keys=keys, args=args, batch_form=batch_scripts.RELEASE_BATCH),
        )
        try:
            return bool(int(reply))
        except (TypeError, ValueError) as exc:
            raise translate_error(exc, what="release") from exc

    async def withdraw(self, identity: str) -> None:
        keys = [self.keys.candidates, self.keys.candidate_expiry, self.keys.candidate_instances]
        args = [candidates.encode_identity(identity)]
        await self._call("withdraw", lambda: self._run(self._withdraw, keys=keys, args=args))

    async def candidates(self) -> list[Candidate]:
        """The live registered candidates, by priority (highest first) then identity."""
        keys = [self.keys.candidates, self.keys.candidate_expiry, self.keys.candidate_instances]
        reply: Any = await self._call("candidates", lambda: self._run(self._candidates, keys=keys, args=[]))
        return candidates.parse_candidates(reply)

    async def request_handoff(self, *, to: str | None, window_ms: int) -> Handoff | None:
        """Ask the holder to hand the lease over (to `to`, or to anyone else when None).

        Returns the handoff started, or None when nobody (elector) holds the lock. Raises
        HandoffRefusedError when `to` already holds it, LeaseBackendError as every method.
        """
        if window_ms <= 0:
            raise invalid_request("handoff", f"a handoff window must be positive, got {window_ms} ms")
        keys = [self.keys.lease, self.keys.handoff]
        args: list[str | int] = [candidates.encode_identity(to), window_ms, self.keys.channel]
        reply: Any = await self._call(
            "handoff", lambda: self._run(self._request_handoff, keys=keys, args=args)
        )
        try:
            code = int(reply[0])
            if code == 0:
                return None
            if code == 1:
                return candidates.parse_handoff(reply[1], reply[2], what="handoff")
            if code == 2:
                raise candidates.HandoffRefusedError(bytes(reply[1]).decode("utf-8", "replace"))
        except (IndexError, TypeError, ValueError) as exc:
            raise translate_error(exc, what="handoff") from exc
        raise LeaseBackendError(f"handoff: unexpected reply code {code}", kind=BackendErrorKind.DATA)

    async def observe(self) -> Observation:
        reply: Any = await self._call(
            "observe",
            lambda: self._run(
                self._observe, keys=[self.keys.lease, self.keys.fencing, self.keys.quiet, self.keys.meta]
            ),
        )
        try:
            raw_value, pttl, raw_counter, quiet_pttl, raw_meta = (
                bytes(reply[0]),
                int(reply[1]),
                bytes(reply[2]),
                int(reply[3]),
                bytes(reply[4]).decode("utf-8", "replace"),
            )
        except (IndexError, TypeError, ValueError) as exc:
            raise translate_error(exc, what="observe") from exc
        holder = parse_holder(raw_value) if raw_value else None
        try:
            counter = int(raw_counter) if raw_counter else None
        except ValueError:
            raise LeaseBackendError(
                f"observe: the fencing counter {self.keys.fencing} is not a number",
                kind=BackendErrorKind.DATA,
            ) from None
        unknown = []
        if raw_meta and raw_meta != str(protocol.PROTOCOL):
            unknown.append(f"protocol {raw_meta} in the meta hash {self.keys.meta}")
        version = protocol.lease_version(raw_value) if raw_value else 1
        if version not in protocol.KNOWN_LEASE_VERSIONS:
            unknown.append(f"protocol {version} in the lease value {self.keys.lease}")
        return Observation(
            holder=holder,
            unrecognised_value=bool(raw_value) and holder is None,
            remaining_ms=remaining_ms(pttl) if raw_value else None,
            last_fencing_token=counter,
            quiet_remaining_ms=max(0, quiet_pttl),
            unknown_protocol="; ".join(unknown) or None,
        )

    async def subscribe(self, *, keepalive_s: float = 60.0) -> LeaseEventSubscription:
        hub = self._hub
        if hub is not None:
            # The hub's one connection carries every lock's channel and keeps itself alive.
            return await self._call("subscribe", lambda: hub.subscribe(self.keys.channel))
        if isinstance(self._client, RedisCluster):
            # ClusterPubSub picks the node serving the channel's slot from the client's slot
            # map, which is empty until the client's first command: fill it first.
            await self._call("subscribe", self._client.initialize)
        pubsub = self._client.pubsub()
        try:
            await self._call("subscribe", lambda: pubsub.subscribe(self.keys.channel))
            # The SUBSCRIBE confirmation proves the subscription is live before we return.
            await self._call("subscribe", lambda: pubsub.get_message(timeout=self._request_timeout()))
        except BaseException:
            await pubsub.aclose()  # type: ignore[no-untyped-call]
            raise
        return RedisEventSubscription(
            pubsub, request_timeout_s=self._request_timeout(), keepalive_s=keepalive_s
        )

    @property
    def client(self) -> redis.asyncio.Redis:
        """The client this backend sends through (backends built on this one run scripts on it)."""
        return self._client

    async def call_script(
        self, what: str, script: AsyncScript, *, keys: Sequence[KeyT], args: Sequence[EncodableT] = ()
    ) -> Any:
        """Run a script registered on `client` like the backend's own: batched, errors translated."""
        return await self._call(what, lambda: self._run(script, keys=keys, args=args))

    def _request_timeout(self) -> float:
        if isinstance(self._client, RedisCluster):
            kwargs = self._client.get_connection_kwargs()
        else:
            kwargs = self._client.connection_pool.connection_kwargs
        timeout = kwargs.get("socket_timeout")
        return float(timeout) if timeout else 1.0
