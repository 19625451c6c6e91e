"""The LeaderElection custom resource: names, spec parsing and validation, status building.

Pure data, no I/O: the handlers read a spec through `parse_spec` (a bad spec is a `SpecError`
naming the field) and write the dicts `build_status` makes.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

GROUP = "elector.io"
VERSION = "v1alpha1"
PLURAL = "leaderelections"
KIND = "LeaderElection"
API_VERSION = f"{GROUP}/{VERSION}"

#: The label put on candidate pods: "true" on the holder's pod, "false" on the others.
DEFAULT_LEADER_LABEL = "elector.io/leader"
#: The annotation that asks the operator for a handoff (an identity, or "any").
HANDOFF_ANNOTATION = "elector.io/handoff-to"
HANDOFF_ANY = "any"

# Kubernetes' qualified label name: an optional DNS-subdomain prefix and a name of at most 63.
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LOCK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@-]{0,199}")
_SELECTOR_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist"})
_MAX_WINDOW_S = 600.0
#: Query parameters that carry a secret (redis-py reads `password`; the others are refused too,
#: as elector's URL redaction masks them: none is a Redis option).
_CREDENTIAL_QUERY_KEYS = frozenset({"password", "pass", "pwd", "secret", "token"})


class SpecError(ValueError):
    """The LeaderElection's spec is invalid; the message names the field (never a secret)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"spec.{field}: {message}")
        self.field = field


@dataclasses.dataclass(frozen=True, slots=True)
class SecretKeyRef:
    """A key of a Secret in the LeaderElection's own namespace."""

    name: str
    key: str


@dataclasses.dataclass(frozen=True, slots=True)
class LeaderElectionSpec:
    lock: str
    #: The Redis URL, or None when it comes from `url_secret`.
    redis_url: str | None
    url_secret: SecretKeyRef | None
    password_secret: SecretKeyRef | None
    key_prefix: str
    #: A Kubernetes LabelSelector: matchLabels and matchExpressions.
    selector: Mapping[str, Any]
    leader_label: str
    handoff_window_s: float
    handoff_timeout_s: float
    #: Keep a coordination.k8s.io Lease that mirrors the lock (lease_mirror.py).
    kubernetes_lease: bool = True
    #: That Lease's name; None: the LeaderElection's own name.
    kubernetes_lease_name: str | None = None


def is_label_key(text: str) -> bool:
    prefix, slash, name = text.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)):
        return False
    return bool(_LABEL_NAME.fullmatch(name))


def _str(spec: Mapping[str, Any], field: str, path: str, *, default: str | None = None) -> str | None:
    value = spec.get(field, default)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise SpecError(path, f"must be a non-empty string, got {value!r}")
    return value


def _secret_ref(value: Any, path: str) -> SecretKeyRef | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise SpecError(path, "must be an object with name and key")
    name = _str(value, "name", f"{path}.name")
    key = _str(value, "key", f"{path}.key")
    if name is None or key is None:
        raise SpecError(path, "needs both name and key")
    return SecretKeyRef(name=name, key=key)


def _seconds(spec: Mapping[str, Any], field: str, *, default: float, maximum: float) -> float:
    value = spec.get(field, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= maximum:
        raise SpecError(field, f"must be a number of seconds in (0, {maximum:g}], got {value!r}")
    return float(value)


def _check_selector(selector: Any) -> Mapping[str, Any]:
    if not isinstance(selector, Mapping) or not (
        selector.get("matchLabels") or selector.get("matchExpressions")
    ):
        raise SpecError(
            "selector", "needs matchLabels or matchExpressions (an empty selector would take every pod)"
        )
    labels = selector.get("matchLabels") or {}
    if not isinstance(labels, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        raise SpecError("selector.matchLabels", "must map label names to string values")
    expressions = selector.get("matchExpressions") or []
    if not isinstance(expressions, Sequence):
        raise SpecError("selector.matchExpressions", "must be a list")
    for index, expr in enumerate(expressions):
        path = f"selector.matchExpressions[{index}]"
        if not isinstance(expr, Mapping) or not isinstance(expr.get("key"), str):
            raise SpecError(path, "needs a key")
        if expr.get("operator") not in _SELECTOR_OPERATORS:
            raise SpecError(f"{path}.operator", f"must be one of {', '.join(sorted(_SELECTOR_OPERATORS))}")
        values = expr.get("values") or []
        if expr["operator"] in ("In", "NotIn") and not values:
            raise SpecError(f"{path}.values", f"operator {expr['operator']} needs values")
    return selector


def _has_credentials(url: str) -> bool:
    """A user-info part ("user:pw@host") or a `password=` query parameter (any case)."""
    if "@" in url.partition("://")[2].partition("/")[0]:
        return True
    keys = (urllib.parse.unquote_plus(key).strip().lower() for key in _query_keys(url))
    return any(key in _CREDENTIAL_QUERY_KEYS for key in keys)


def _query_keys(url: str) -> list[str]:
    query = url.partition("?")[2].partition("#")[0]
    return [part.partition("=")[0] for part in query.split("&")]


def _check_leader_label(label: str, selector: Mapping[str, Any]) -> None:
    """The label the operator writes must not be one the selector reads: it would overwrite the pods'
    own label ("app: worker" -> "true"), and their ReplicaSet would lose them and make new ones."""
    keys = set(selector.get("matchLabels") or {}) | {
        expr.get("key") for expr in selector.get("matchExpressions") or []
    }
    if label in keys:
        raise SpecError(
            "leaderLabel",
            f"{label!r} is a key of the selector: the operator would overwrite the pods' own label "
            "with \"true\"/\"false\"; choose another leaderLabel (default elector.io/leader)",
        )


def parse_spec(spec: Mapping[str, Any]) -> LeaderElectionSpec:
    """Validate a LeaderElection's spec (the CRD's schema checks the shape; this the meaning)."""
    lock = _str(spec, "lock", "lock")
    if lock is None or not _LOCK_NAME.fullmatch(lock):
        raise SpecError("lock", f"{lock!r} is not a lock name: 1-200 of letters, digits and . _ : / @ -")
    redis = spec.get("redis")
    if not isinstance(redis, Mapping):
        raise SpecError("redis", "is required: url or urlSecretRef")
    url = _str(redis, "url", "redis.url")
    url_secret = _secret_ref(redis.get("urlSecretRef"), "redis.urlSecretRef")
    if (url is None) == (url_secret is None):
        raise SpecError("redis", "needs exactly one of url and urlSecretRef")
    if url is not None and _has_credentials(url):
        # A password in a plain spec field is readable by everyone who may read the resource.
        raise SpecError("redis.url", "must not hold credentials: use passwordSecretRef or urlSecretRef")
    if url is not None and any("%" in key for key in _query_keys(url)):
        # The CRD's rule cannot unescape them: "p%61ssword" would pass it. No Redis option needs one.
        raise SpecError("redis.url", "query parameter names must not be percent-encoded")
    leader_label = _str(spec, "leaderLabel", "leaderLabel", default=DEFAULT_LEADER_LABEL)
    assert leader_label is not None
    if not is_label_key(leader_label):
        raise SpecError("leaderLabel", f"{leader_label!r} is not a valid label name")
    selector = _check_selector(spec.get("selector"))
    _check_leader_label(leader_label, selector)
    return LeaderElectionSpec(
        lock=lock,
        redis_url=url,
        url_secret=url_secret,
        password_secret=_secret_ref(redis.get("passwordSecretRef"), "redis.passwordSecretRef"),
        key_prefix=_str(redis, "keyPrefix", "redis.keyPrefix", default="elector") or "elector",
        selector=selector,
        leader_label=leader_label,
        handoff_window_s=_seconds(spec, "handoffWindowSeconds", default=10.0, maximum=_MAX_WINDOW_S),
        handoff_timeout_s=_seconds(spec, "handoffTimeoutSeconds", default=30.0, maximum=_MAX_WINDOW_S),
        **_lease_mirror(spec.get("kubernetesLease")),
    )


def _lease_mirror(value: Any) -> dict[str, Any]:
    """spec.kubernetesLease: on by default, named after the LeaderElection unless `name` is given."""
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        raise SpecError("kubernetesLease", "must be an object with enabled and name")
    enabled = value.get("enabled", True)
    if not isinstance(enabled, bool):
        raise SpecError("kubernetesLease.enabled", f"must be true or false, got {enabled!r}")
    name = _str(value, "name", "kubernetesLease.name")
    if name is not None and (len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name)):
        raise SpecError("kubernetesLease.name", f"{name!r} is not a valid object name (a DNS subdomain)")
    return {"kubernetes_lease": enabled, "kubernetes_lease_name": name}


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether a LabelSelector matches a pod's labels (as the API server would)."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, operator, values = expr["key"], expr["operator"], set(expr.get("values") or [])
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


def now_rfc3339() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(
    kind: str, *, ok: bool, reason: str, message: str, previous: Sequence[Mapping[str, Any]] = ()
) -> dict[str, Any]:
    """A status condition; lastTransitionTime changes only when the status does."""
    status = "True" if ok else "False"
    since = now_rfc3339()
    for old in previous:
        if old.get("type") == kind and old.get("status") == status and old.get("lastTransitionTime"):
            since = str(old["lastTransitionTime"])
    return {"type": kind, "status": status, "reason": reason, "message": message, "lastTransitionTime": since}
