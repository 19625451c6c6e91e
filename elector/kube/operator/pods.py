"""The candidate pods, from one shared watch of the pods of every watched namespace.

Each LeaderElection used to LIST its pods every few seconds: 200 of them made some 40 LISTs a second
on the API server, however quiet the cluster. Instead, kopf keeps one watch of the pods (an index:
`kopf.index`, filled before any LeaderElection's watcher starts, live afterwards), and each watcher
reads its candidates from memory. The index keeps only what the operator needs of a pod (its name,
namespace, uid, labels, resourceVersion, whether it is being deleted), so that a large namespace
costs little memory.

Label patches are not read back through the API: the watch brings the patched pod. Until it has,
`PodLabelMemo` remembers what was written, so that the same label is not patched again each cycle.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from elector.kube.operator import resource

#: The index's id: kopf passes the live index to the handlers under this keyword.
INDEX_ID = "elector_pods"

#: A pod as the index keeps it: {"metadata": {name, namespace, uid, labels, resourceVersion}} plus
#: "terminating"; the shape of a listed pod, so that reconcile's functions take either.
Pod = Mapping[str, Any]


class PodIndex(Protocol):
    """kopf's index (`kopf.Index`): namespace -> the pods of that namespace."""

    def get(self, key: str, /) -> Iterable[Pod] | None: ...


def pod_entry(body: Mapping[str, Any]) -> dict[str, Pod]:
    """The index handler's value for one pod: its namespace -> its few fields."""
    meta = body.get("metadata") or {}
    namespace = str(meta.get("namespace") or "")
    entry = {
        "metadata": {
            "name": meta.get("name"),
            "namespace": namespace,
            "uid": meta.get("uid"),
            "labels": dict(meta.get("labels") or {}),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "terminating": bool(meta.get("deletionTimestamp")),
    }
    return {namespace: entry}


def candidates(index: PodIndex, namespace: str, selector: Mapping[str, Any]) -> list[Pod]:
    """The pods of `namespace` that `selector` matches and that are not being deleted, by name."""
    pods = [
        pod
        for pod in index.get(namespace) or ()
        if not pod.get("terminating")
        and resource.selector_matches(selector, pod["metadata"].get("labels") or {})
    ]
    return sorted(pods, key=lambda pod: str(pod["metadata"].get("name")))


@dataclasses.dataclass
class PodLabelMemo:
    """Label values patched, until the watch shows the pod changed (then the index is the truth)."""

    #: (pod name, label) -> (value written, the pod's resourceVersion when it was written)
    _written: dict[tuple[str, str], tuple[str | None, Any]] = dataclasses.field(default_factory=dict)

    def pending(self, pod: Pod, label: str, value: str | None) -> bool:
        """Whether `value` was written to `pod` and the watch has not brought the pod back since."""
        meta = pod["metadata"]
        seen = self._written.get((str(meta.get("name")), label))
        return seen is not None and seen == (value, meta.get("resourceVersion"))

    def wrote(self, pod: Pod, label: str, value: str | None) -> None:
        meta = pod["metadata"]
        self._written[(str(meta.get("name")), label)] = (value, meta.get("resourceVersion"))

    def forget_gone(self, present: Iterable[str]) -> None:
        """Drop what is remembered of pods no longer there (the memo stays as small as the pods)."""
        names = set(present)
        for key in [key for key in self._written if key[0] not in names]:
            del self._written[key]
