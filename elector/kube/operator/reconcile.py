"""What the operator does on a transition: pod labels, Events, status. No Redis here.

Pods are matched to identities by name: a candidate's identity is its pod's name (elector's
`--identity` defaults to `$POD_NAME`). A pod whose name is not the holder's gets "false".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from elector.kube.operator import resource
from elector.lease import Candidate, Holder

#: The conditions the operator maintains on every LeaderElection.
REDIS_REACHABLE = "RedisReachable"
HAS_LEADER = "HasLeader"
SPEC_VALID = "SpecValid"
#: Only while the spec keeps a Lease mirror: False when a Lease of that name is someone else's.
LEASE_MIRRORED = "LeaseMirrored"


class EventPoster(Protocol):
    def __call__(self, obj: Mapping[str, Any], *, type: str, reason: str, message: str) -> None: ...


@dataclasses.dataclass(frozen=True, slots=True)
class Transition:
    """The lock changed hands (or became free, or got its first holder)."""

    previous: Holder | None
    current: Holder | None


def detect_transition(previous: Holder | None, current: Holder | None) -> Transition | None:
    # A new fencing token with the same identity is a new term (a re-acquisition) as well.
    if previous == current:
        return None
    return Transition(previous=previous, current=current)


def holder_from_status(status: Mapping[str, Any]) -> Holder | None:
    """The holder a previous operator recorded, so a restart does not count a transition again."""
    identity, token = status.get("holder"), status.get("fencingToken")
    if isinstance(identity, str) and identity and isinstance(token, int) and not isinstance(token, bool):
        return Holder(identity=identity, fencing_token=token)
    return None


def pod_ref(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The object reference an Event needs (list items may lack apiVersion and kind)."""
    meta = pod.get("metadata") or {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"), "uid": meta.get("uid")},
    }


def label_changes(pods: Sequence[Mapping[str, Any]], *, holder: Holder | None, label: str) -> dict[str, str]:
    """Pod name -> the value its leader label must get ("true"/"false"), only where it differs."""
    changes: dict[str, str] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        name = meta.get("name")
        if not isinstance(name, str):
            continue
        wanted = "true" if holder is not None and holder.identity == name else "false"
        if (meta.get("labels") or {}).get(label) != wanted:
            changes[name] = wanted
    return changes


def post_transition_events(
    post: EventPoster,
    *,
    election: Mapping[str, Any],
    lock: str,
    transition: Transition,
    pods: Mapping[str, Mapping[str, Any]],
) -> None:
    """LeaderLost for the old holder, LeaderElected for the new one: on the LeaderElection and pods."""
    old, new = transition.previous, transition.current
    if old is not None and (
        new is None or new.identity != old.identity or new.fencing_token != old.fencing_token
    ):
        after = f"; now {new.identity}" if new is not None else "; the lock is free"
        message = f"{old.identity} lost lock {lock} (fencing token {old.fencing_token}){after}"
        post(election, type="Normal", reason="LeaderLost", message=message)
        if old.identity in pods and (new is None or new.identity != old.identity):
            post(pod_ref(pods[old.identity]), type="Normal", reason="LeaderLost", message=message)
    if new is not None:
        message = f"{new.identity} holds lock {lock} (fencing token {new.fencing_token})"
        post(election, type="Normal", reason="LeaderElected", message=message)
        if new.identity in pods:
            post(pod_ref(pods[new.identity]), type="Normal", reason="LeaderElected", message=message)


def build_status(
    *,
    previous: Mapping[str, Any],
    lock: str,
    holder: Holder | None,
    holder_pod: str | None,
    transitions: int,
    last_transition_time: str | None,
    candidates: Sequence[Candidate] | None,
    redis_error: str | None,
    lease_clash: str | None = None,
    lease_mirror: bool = False,
) -> dict[str, Any]:
    """The status to write. During an outage the last known holder stays, flagged by the condition.
    With `lease_mirror`, a LeaseMirrored condition: False with `lease_clash` when the Lease of that
    name is not the mirror's to write."""
    old_conditions = previous.get("conditions") or []
    conditions = [
        resource.condition(
            REDIS_REACHABLE,
            ok=redis_error is None,
            reason="Reachable" if redis_error is None else "Unreachable",
            message="" if redis_error is None else redis_error,
            previous=old_conditions,
        ),
        resource.condition(
            HAS_LEADER,
            ok=holder is not None,
            reason="Held" if holder is not None else "Free",
            message=f"held by {holder.identity}" if holder is not None else "nobody holds the lock",
            previous=old_conditions,
        ),
        resource.condition(SPEC_VALID, ok=True, reason="Valid", message="", previous=old_conditions),
    ]
    if lease_mirror:
        conditions.append(
            resource.condition(
                LEASE_MIRRORED,
                ok=lease_clash is None,
                reason="Mirrored" if lease_clash is None else "LeaseNotOwned",
                message=lease_clash or "",
                previous=old_conditions,
            )
        )
    status: dict[str, Any] = {
        "lock": lock,
        "holder": holder.identity if holder is not None else None,
        "holderPod": holder_pod,
        "fencingToken": holder.fencing_token if holder is not None else None,
        "transitions": transitions,
        "lastTransitionTime": last_transition_time,
        "conditions": conditions,
    }
    if candidates is not None:
        status["candidates"] = [{"identity": c.identity, "priority": c.priority} for c in candidates]
    elif "candidates" in previous:
        status["candidates"] = previous["candidates"]
    return status


def invalid_spec_status(previous: Mapping[str, Any], message: str) -> dict[str, Any]:
    conditions = [c for c in previous.get("conditions") or [] if c.get("type") != SPEC_VALID]
    conditions.append(
        resource.condition(SPEC_VALID, ok=False, reason="InvalidSpec", message=message, previous=())
    )
    return {"conditions": conditions}


def without_times(status: Mapping[str, Any]) -> dict[str, Any]:
    """`status` without condition timestamps: to compare what a patch would change."""
    out = dict(status)
    out["conditions"] = [
        {k: v for k, v in c.items() if k != "lastTransitionTime"} for c in status.get("conditions") or []
    ]
    return out
