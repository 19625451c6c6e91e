"""A coordination.k8s.io/v1 Lease that mirrors a LeaderElection's lock, for Kubernetes' own tools.

`kubectl get lease`, kube-state-metrics (`kube_lease_owner`, `kube_lease_renew_time`) and
client-go's leader-election observers read Leases, not Redis. The operator writes one per
LeaderElection (same namespace, by default the same name). It is a MIRROR, NEVER A LOCK: elector
never reads it to decide who leads, and a replica that writes it wins nothing. What it says:

* holderIdentity: the holder's identity (its pod's name); absent while the lock is free.
* leaseDurationSeconds: the lock's ttl, as seen in Redis (the largest time to live observed in
  the current term, rounded up: the replicas choose their ttl, the lock does not store it).
* renewTime: when the holder last renewed as far as Redis shows (now - (ttl - time to live)),
  so renewTime + leaseDurationSeconds is when the lease would expire on Redis.
* acquireTime: when the current term began; leaseTransitions: how often the lock went to
  another identity than the last holder's (free periods in between do not count; the first
  holder ever is 0).

Writes happen on a transition and otherwise only when the Lease, as last written, is half-way to
looking expired (renewTime + leaseDurationSeconds / 2), at least `min_write_interval_s` apart: a
bounded rate whatever the renewal rate, and observers never see a held lock's Lease expire
while the operator runs. Each write is an update (PUT) carrying the resourceVersion it read:
a 409 means someone else changed the Lease, so it is read again and the write redone; a 404
(deleted) means it is created again with the same content.

It writes only a Lease it owns: one it created, which carries the label `elector.io/leader-election`
naming its LeaderElection. A Lease of the same name that lacks it (a client-go program's own lock, a
Lease another LeaderElection mirrors into) is never written: the mirror reports the clash (`clash`,
which the watcher puts in the status and an Event) and reads the Lease again with back-off, so that
it takes over once the other Lease is gone.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from elector.kube.operator import resource
from elector.kube.operator.kubeapi import KubeApi, KubeApiError
from elector.lease import Holder

LEASE_API_VERSION = "coordination.k8s.io/v1"
#: The label naming the LeaderElection a Lease mirrors (so `kubectl get lease -l` finds them).
MIRROR_LABEL = "elector.io/leader-election"
#: The holder's fencing token: tells a restarted operator whether the term is still the same.
TOKEN_ANNOTATION = "elector.io/fencing-token"
#: The longest pause between retries after failed reads or writes of the Lease.
MAX_RETRY_DELAY_S = 30.0


def lease_path(namespace: str, name: str | None = None) -> str:
    base = f"/apis/{LEASE_API_VERSION}/namespaces/{quote(namespace)}/leases"
    return base if name is None else f"{base}/{quote(name)}"


def micro_time(wall_s: float) -> str:
    """Kubernetes' MicroTime: RFC 3339 with microseconds, UTC."""
    return datetime.datetime.fromtimestamp(wall_s, tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_micro_time(text: Any) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclasses.dataclass(frozen=True, slots=True)
class LeaseSpec:
    """The Lease's spec the mirror wants (Kubernetes field names in `as_dict`)."""

    holder_identity: str | None
    lease_duration_s: int | None
    acquire_time_s: float | None
    renew_time_s: float | None
    transitions: int

    def as_dict(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"leaseTransitions": self.transitions}
        if self.holder_identity is not None:
            spec["holderIdentity"] = self.holder_identity
        if self.lease_duration_s is not None:
            spec["leaseDurationSeconds"] = self.lease_duration_s
        if self.acquire_time_s is not None:
            spec["acquireTime"] = micro_time(self.acquire_time_s)
        if self.renew_time_s is not None:
            spec["renewTime"] = micro_time(self.renew_time_s)
        return spec


class LeaseMirror:
    """Keeps one Lease in line with one lock. `observe` is called on every watcher cycle."""

    def __init__(
        self,
        *,
        api: KubeApi,
        election: Mapping[str, Any],
        lease_name: str,
        logger: logging.Logger | logging.LoggerAdapter[logging.Logger],
        on_error: Callable[[], None],
        min_write_interval_s: float,
        wall_clock: Callable[[], float],
        clock: Callable[[], float],
    ) -> None:
        meta = election.get("metadata") or {}
        self._namespace: str = meta["namespace"]
        self._election_name: str = meta["name"]
        self._election_uid: str | None = meta.get("uid")
        self._name = lease_name
        self._api = api
        self._log = logger
        self._on_error = on_error
        self._min_write_interval_s = min_write_interval_s
        self._wall = wall_clock
        self._clock = clock
        #: The Lease as last read or written (None: read it before the next write).
        self._lease: dict[str, Any] | None = None
        self._loaded = False
        self._spec: LeaseSpec | None = None
        self._holder: Holder | None = None
        #: The identity of the last holder, across free periods (for leaseTransitions).
        self._last_identity: str | None = None
        self._term_max_remaining_ms = 0
        self._dirty = True
        self._last_write = -math.inf
        self._failures = 0
        self._retry_at = -math.inf
        #: Why the Lease is not written (another's Lease of that name), or None.
        self._clash: str | None = None
        #: Writes done (creates and updates): for tests and logs.
        self.writes = 0

    @property
    def name(self) -> str:
        return self._name

    @property
    def clash(self) -> str | None:
        """Why the Lease is not written: a Lease of that name belongs to someone else (None: ours)."""
        return self._clash

    async def observe(self, holder: Holder | None, *, remaining_ms: int | None) -> None:
        """The lock as just observed; writes the Lease when due. Never raises an API error."""
        now = self._clock()
        if not self._loaded:
            if now < self._retry_at:
                return
            if not await self._read():
                self._back_off(now)
                return
            self._loaded = True
        wall = self._wall()
        if self._spec is None or holder != self._holder:
            self._start_term(holder, wall)
        if holder is not None and remaining_ms is not None and remaining_ms > self._term_max_remaining_ms:
            self._term_max_remaining_ms = remaining_ms
            if self._duration_s() != (self._spec.lease_duration_s if self._spec else None):
                self._dirty = True
        if (not self._dirty and not self._refresh_due(wall, now)) or now < self._retry_at:
            return
        assert self._spec is not None
        renew = self._spec.renew_time_s
        if holder is not None and remaining_ms is not None:
            ttl_ms = self._term_max_remaining_ms
            renew = wall - max(0, ttl_ms - remaining_ms) / 1000.0
        self._spec = dataclasses.replace(self._spec, lease_duration_s=self._duration_s(), renew_time_s=renew)
        if await self._write():
            self._dirty = False
            self._last_write = now
            self._failures, self._retry_at = 0, -math.inf
        else:
            self._back_off(now)

    def _back_off(self, now: float) -> None:
        """After a failure (a 403 without the RBAC rule, an API outage): retry ever more slowly."""
        self._failures += 1
        delay_s = min(MAX_RETRY_DELAY_S, self._min_write_interval_s * 2**self._failures)
        self._retry_at = now + delay_s

    # -- what to write -------------------------------------------------------------------------

    def _duration_s(self) -> int | None:
        if self._term_max_remaining_ms <= 0:
            return None
        return max(1, math.ceil(self._term_max_remaining_ms / 1000.0))

    def _start_term(self, holder: Holder | None, wall: float) -> None:
        """A transition: a new holder (or a new term of the same one), or a free lock."""
        previous = self._spec
        transitions = previous.transitions if previous else 0
        self._term_max_remaining_ms = 0
        if holder is None:
            # Free: no holder; the old times stay as they were (client-go does the same on release).
            self._spec = LeaseSpec(
                holder_identity=None,
                lease_duration_s=previous.lease_duration_s if previous else None,
                acquire_time_s=previous.acquire_time_s if previous else None,
                renew_time_s=previous.renew_time_s if previous else None,
                transitions=transitions,
            )
        else:
            if self._last_identity is not None and self._last_identity != holder.identity:
                transitions += 1
            self._last_identity = holder.identity
            self._spec = LeaseSpec(
                holder_identity=holder.identity,
                lease_duration_s=None,
                acquire_time_s=wall,
                renew_time_s=wall,
                transitions=transitions,
            )
        self._holder = holder
        self._dirty = True

    def _refresh_due(self, wall: float, now: float) -> bool:
        """Half-way to looking expired (to observers reading renewTime + duration), rate-bounded."""
        spec = self._spec
        if self._holder is None or spec is None or spec.renew_time_s is None or not spec.lease_duration_s:
            return False
        if now - self._last_write < self._min_write_interval_s:
            return False
        return wall >= spec.renew_time_s + spec.lease_duration_s / 2

    # -- the API -------------------------------------------------------------------------------

    async def _read(self) -> bool:
        """Load the Lease (a previous operator's record counts: transitions, times). False when it
        cannot be read, or is not ours to write (then `clash` says whose it seems to be)."""
        try:
            lease = await self._api.request("GET", lease_path(self._namespace, self._name))
        except KubeApiError as exc:
            if exc.status != 404:
                self._failed("read", exc)
                return False
            lease = None
        lease = lease if isinstance(lease, dict) else None
        self._clash = None if lease is None else self._not_ours(lease)
        if self._clash is not None:
            self._lease, self._loaded = None, False
            self._log.debug("%s", self._clash)
            return False
        self._lease = lease
        if self._lease is not None and self._spec is None:
            spec = self._lease.get("spec") or {}
            transitions = spec.get("leaseTransitions")
            identity = spec.get("holderIdentity")
            duration = spec.get("leaseDurationSeconds")
            self._spec = LeaseSpec(
                holder_identity=identity if isinstance(identity, str) and identity else None,
                lease_duration_s=duration if isinstance(duration, int) and duration > 0 else None,
                acquire_time_s=parse_micro_time(spec.get("acquireTime")),
                renew_time_s=parse_micro_time(spec.get("renewTime")),
                transitions=transitions if isinstance(transitions, int) and transitions >= 0 else 0,
            )
            self._last_identity = self._spec.holder_identity
            token = ((self._lease.get("metadata") or {}).get("annotations") or {}).get(TOKEN_ANNOTATION)
            if self._spec.holder_identity is not None and isinstance(token, str) and token.isdigit():
                # The same holder and token after an operator restart: the same term, no transition.
                self._holder = Holder(identity=self._spec.holder_identity, fencing_token=int(token))
                self._term_max_remaining_ms = (self._spec.lease_duration_s or 0) * 1000
        return True

    def _not_ours(self, lease: Mapping[str, Any]) -> str | None:
        """Why `lease` is not this mirror's to write, or None when it carries our label."""
        labels = (lease.get("metadata") or {}).get("labels") or {}
        owner = labels.get(MIRROR_LABEL)
        if owner == self._election_name:
            return None
        whose = (
            f"it mirrors LeaderElection {owner} (label {MIRROR_LABEL})"
            if isinstance(owner, str)
            else f"it has no label {MIRROR_LABEL}={self._election_name}: another program's Lease"
        )
        return (
            f"Lease {self._name} exists and is not this LeaderElection's: {whose}. It is left as it "
            "is and not mirrored into; set spec.kubernetesLease.name to another name (or delete that "
            "Lease if it is a leftover)"
        )

    def _body(self) -> dict[str, Any]:
        assert self._spec is not None
        meta: dict[str, Any] = dict((self._lease or {}).get("metadata") or {})
        meta.update(name=self._name, namespace=self._namespace)
        meta["labels"] = {**(meta.get("labels") or {}), MIRROR_LABEL: self._election_name}
        annotations = dict(meta.get("annotations") or {})
        annotations.pop(TOKEN_ANNOTATION, None)
        if self._holder is not None:
            annotations[TOKEN_ANNOTATION] = str(self._holder.fencing_token)
        meta["annotations"] = annotations
        if self._election_uid and not meta.get("ownerReferences"):
            # Deleting the LeaderElection deletes its Lease (garbage collection), and
            # kube-state-metrics' kube_lease_owner names the LeaderElection.
            meta["ownerReferences"] = [
                {
                    "apiVersion": resource.API_VERSION,
                    "kind": resource.KIND,
                    "name": self._election_name,
                    "uid": self._election_uid,
                    "controller": True,
                    "blockOwnerDeletion": False,
                }
            ]
        return {
            "apiVersion": LEASE_API_VERSION,
            "kind": "Lease",
            "metadata": meta,
            "spec": self._spec.as_dict(),
        }

    async def _write(self) -> bool:
        """Update (or create) the Lease; on a conflict read it again and retry once."""
        for _ in range(2):
            try:
                if self._lease is None:
                    body = self._body()
                    for key in ("resourceVersion", "uid", "creationTimestamp"):
                        body["metadata"].pop(key, None)
                    reply = await self._api.request("POST", lease_path(self._namespace), body=body)
                else:
                    reply = await self._api.request(
                        "PUT", lease_path(self._namespace, self._name), body=self._body()
                    )
            except KubeApiError as exc:
                if exc.status in (404, 409):
                    # 404: deleted (create it again); 409: changed by someone else, or created
                    # meanwhile: read it again and redo the write on the fresh resourceVersion.
                    self._log.info("Lease %s: %s; reading it again", self._name, exc)
                    if not await self._read():
                        return False  # unreadable, or someone else's now (clash)
                    continue
                self._failed("write", exc)
                return False
            self._lease = reply if isinstance(reply, dict) else None
            self.writes += 1
            return True
        self._on_error()
        return False

    def _failed(self, what: str, exc: KubeApiError) -> None:
        self._on_error()
        # Once per streak of failures: a missing RBAC rule must not flood the log.
        log = self._log.warning if self._failures == 0 else self._log.debug
        log("cannot %s the Lease %s (retrying with back-off): %s", what, self._name, exc)
