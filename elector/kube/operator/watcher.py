"""One LeaderElection's watch: the lock in Redis -> pod labels, Events, status, metrics, handoffs.

Runs as a kopf daemon body. Each cycle looks at the lock (`observe`) and its candidates; an
announcement on the lock's channel starts the next cycle at once, otherwise it comes after
`poll_s`. The candidate pods come from the operator's one shared watch of pods (pods.py), not
from a request of this watcher: every cycle compares their labels with the lock and patches only
what differs (pods that appear later get their label at the next cycle). Nothing here raises out
of the loop: Redis and API failures become a status condition, a log line and a metric, and the
loop goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

import redis.asyncio

from elector.backend import (
    InvalidRedisSettingsError,
    RedisLeaseBackend,
    RedisSettings,
    make_client,
    redact_url,
)
from elector.kube.operator import handoff_annotation as handoff
from elector.kube.operator import pods, reconcile, resource
from elector.kube.operator.kubeapi import KubeApi, KubeApiError
from elector.kube.operator.lease_mirror import LeaseMirror
from elector.kube.operator.metrics import OperatorMetrics
from elector.lease import Candidate, Holder, LeaseBackendError, LeaseEventSubscription


@dataclasses.dataclass(frozen=True, slots=True)
class WatchSettings:
    #: Time between looks at the lock (and at the candidates' labels) when no announcement comes.
    poll_s: float = 1.0
    #: Timeout of each Redis request.
    redis_timeout_s: float = 1.0
    #: Longest pause after a failure (Redis, the API, a bad spec).
    max_backoff_s: float = 5.0
    #: Least time between two refreshes of a mirrored Lease (transitions are written at once).
    lease_min_write_interval_s: float = 1.0

    def __post_init__(self) -> None:
        names = ("poll_s", "redis_timeout_s", "max_backoff_s", "lease_min_write_interval_s")
        for name in names:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


class _SetupError(Exception):
    """Cannot connect as the spec says; `reason` is a metric reason."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class ElectionWatcher:
    """Keeps one LeaderElection in line with its lock. `body` is kopf's live view of the object."""

    def __init__(
        self,
        *,
        body: Mapping[str, Any],
        api: KubeApi,
        pod_index: pods.PodIndex,
        metrics: OperatorMetrics,
        post_event: reconcile.EventPoster,
        logger: logging.Logger | logging.LoggerAdapter[logging.Logger],
        settings: WatchSettings,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._body = body
        meta = body.get("metadata") or {}
        self._namespace: str = meta["namespace"]
        self._name: str = meta["name"]
        self._api = api
        self._pod_index = pod_index
        self._label_memo = pods.PodLabelMemo()
        self._metrics = metrics
        self._post = post_event
        self._log = logger
        self._settings = settings
        self._clock = clock
        self._wall_clock = wall_clock
        #: The Lease mirroring the lock, for the spec being watched (None: the spec turned it off).
        self._mirror: LeaseMirror | None = None
        status = dict(body.get("status") or {})
        self._status: dict[str, Any] = status
        self._holder = reconcile.holder_from_status(status)
        self._transitions = int(status.get("transitions") or 0)
        self._last_transition_time: str | None = status.get("lastTransitionTime")
        self._written: dict[str, Any] | None = None
        #: The spec problem last reported (an Event each time it changes, not every retry).
        self._invalid_reported: str | None = None
        #: The Lease clash last reported (an Event each time it changes).
        self._clash_reported: str | None = None
        #: (selector, label) of the pods whose leader label this watcher put; older ones, whose
        #: labels must go after a spec change, are in `_stale_labels`.
        self._label_scope: tuple[Mapping[str, Any], str] | None = None
        self._stale_labels: list[tuple[Mapping[str, Any], str]] = []
        self._metric_lock: str | None = None
        self._handoffs = handoff.HandoffRunner(
            body=body, api=api, metrics=metrics, post_event=post_event, logger=logger
        )

    # -- the loop ------------------------------------------------------------------------------

    async def run(self) -> None:
        """Until cancelled (kopf cancels daemons when the object goes or the operator stops)."""
        try:
            while True:
                spec = await self._valid_spec()
                try:
                    client, backend = await self._connect(spec)
                except _SetupError as exc:
                    if exc.reason == "invalid_spec":
                        await self._report_invalid(str(exc))
                    else:
                        await self._fail(exc.reason, str(exc))
                    await asyncio.sleep(self._settings.max_backoff_s)
                    continue
                self._invalid_reported = None
                try:
                    await self._watch(spec, backend)
                finally:
                    await self._handoffs.cancel()
                    await client.aclose()
        finally:
            if self._metric_lock is not None:
                self._metrics.forget(namespace=self._namespace, lock=self._metric_lock)

    def _parse(self) -> resource.LeaderElectionSpec:
        return resource.parse_spec(self._body.get("spec") or {})

    async def _valid_spec(self) -> resource.LeaderElectionSpec:
        while True:
            try:
                return self._parse()
            except resource.SpecError as exc:
                await self._report_invalid(str(exc))
            await asyncio.sleep(self._settings.poll_s)

    async def _report_invalid(self, message: str) -> None:
        """SpecValid False, an Event and a metric: once per distinct problem, not every retry."""
        if message == self._invalid_reported:
            return
        self._invalid_reported = message
        self._metrics.error("invalid_spec")
        self._log.error("invalid LeaderElection: %s", message)
        self._post(self._body, type="Warning", reason="InvalidSpec", message=message)
        await self._write_status(reconcile.invalid_spec_status(self._status, message))

    async def _connect(
        self, spec: resource.LeaderElectionSpec
    ) -> tuple[redis.asyncio.Redis, RedisLeaseBackend]:
        try:
            url = spec.redis_url or await self._api.read_secret_key(self._namespace, spec.url_secret)  # type: ignore[arg-type]
            if spec.password_secret is not None:
                password = await self._api.read_secret_key(self._namespace, spec.password_secret)
                url = _with_password(url, password)
        except KubeApiError as exc:
            raise _SetupError(str(exc), reason="secret") from None
        except ValueError as exc:  # urlsplit: e.g. "redis://[::1" from a Secret
            # The URL may have come from a Secret: say where from, never the value.
            source = "spec.redis.url" if spec.url_secret is None else f"Secret {spec.url_secret.name}"
            raise _SetupError(
                f"spec.redis: the Redis URL ({source}) cannot take the password: {exc}", reason="invalid_spec"
            ) from None
        settings = RedisSettings(
            url=url, request_timeout_s=self._settings.redis_timeout_s, key_prefix=spec.key_prefix
        )
        try:
            client = make_client(settings, client_name=f"elector:{spec.lock}:operator")
        except InvalidRedisSettingsError as exc:
            # The URL may have come from a Secret: say which setting, never the value.
            raise _SetupError(
                f"invalid Redis URL ({redact_url(url)}): {exc}", reason="invalid_spec"
            ) from None
        return client, RedisLeaseBackend(client, lock=spec.lock, key_prefix=spec.key_prefix)

    async def _watch(self, spec: resource.LeaderElectionSpec, backend: RedisLeaseBackend) -> None:
        subscription: LeaseEventSubscription | None = None
        backoff_s = self._settings.poll_s
        self._mirror = self._make_mirror(spec)
        try:
            while True:
                try:
                    current = self._parse()
                except resource.SpecError:
                    current = None
                if current != spec:
                    self._log.info("LeaderElection spec changed; reconnecting")
                    return
                if subscription is None:
                    with contextlib.suppress(LeaseBackendError):  # announcements only speed things up
                        subscription = await backend.subscribe(keepalive_s=30.0)
                ok = await self._cycle(spec, backend)
                backoff_s = self._settings.poll_s if ok else min(self._settings.max_backoff_s, backoff_s * 2)
                self._handoffs.check(
                    spec, backend, annotations=(self._body.get("metadata") or {}).get("annotations")
                )
                subscription = await self._wait(subscription, backoff_s)
        finally:
            if subscription is not None:
                with contextlib.suppress(Exception):
                    await subscription.close()

    async def _wait(
        self, subscription: LeaseEventSubscription | None, timeout_s: float
    ) -> LeaseEventSubscription | None:
        if subscription is None:
            await asyncio.sleep(timeout_s)
            return None
        try:
            await subscription.next_event(timeout_s)  # any announcement: look now
        except LeaseBackendError:
            with contextlib.suppress(Exception):
                await subscription.close()
            await asyncio.sleep(timeout_s)
            return None
        return subscription

    # -- one cycle -----------------------------------------------------------------------------

    async def _cycle(self, spec: resource.LeaderElectionSpec, backend: RedisLeaseBackend) -> bool:
        try:
            observation = await backend.observe()
            candidates: list[Candidate] | None = await backend.candidates()
        except LeaseBackendError as exc:
            await self._fail("redis", f"lock {spec.lock}: {exc}", spec=spec)
            return False
        holder = observation.holder
        transition = reconcile.detect_transition(self._holder, holder)
        pods_by_name, labelled = await self._relabel(spec, holder)
        if transition is not None:
            self._transitions += 1
            self._last_transition_time = resource.now_rfc3339()
            self._holder = holder
            self._log.info(
                "lock %s: %s -> %s",
                spec.lock,
                transition.previous.identity if transition.previous else "(free)",
                f"{holder.identity} (fencing token {holder.fencing_token})" if holder else "(free)",
            )
            reconcile.post_transition_events(
                self._post, election=self._body, lock=spec.lock, transition=transition, pods=pods_by_name
            )
        self._export_holder(spec.lock, holder)
        holder_pod = holder.identity if holder is not None and holder.identity in pods_by_name else None
        if self._mirror is not None:
            await self._mirror.observe(holder, remaining_ms=observation.remaining_ms)
            self._report_lease_clash()
        status = reconcile.build_status(
            previous=self._status,
            lock=spec.lock,
            holder=holder,
            holder_pod=holder_pod,
            transitions=self._transitions,
            last_transition_time=self._last_transition_time,
            candidates=candidates,
            redis_error=None,
            **self._lease_condition(),
        )
        await self._write_status(status)
        return labelled

    def _lease_condition(self) -> dict[str, Any]:
        """build_status's view of the Lease mirror: none, ours, or someone else's Lease."""
        if self._mirror is None:
            return {}
        return {"lease_mirror": True, "lease_clash": self._mirror.clash}

    def _report_lease_clash(self) -> None:
        """A Warning Event when the mirror finds another's Lease: once per distinct clash."""
        clash = self._mirror.clash if self._mirror is not None else None
        if clash is not None and clash != self._clash_reported:
            self._log.warning("%s", clash)
            self._post(self._body, type="Warning", reason="LeaseNotOwned", message=clash)
        self._clash_reported = clash

    def _make_mirror(self, spec: resource.LeaderElectionSpec) -> LeaseMirror | None:
        if not spec.kubernetes_lease:
            return None
        return LeaseMirror(
            api=self._api,
            election=self._body,
            lease_name=spec.kubernetes_lease_name or self._name,
            logger=self._log,
            on_error=lambda: self._metrics.error("kubernetes"),
            min_write_interval_s=self._settings.lease_min_write_interval_s,
            wall_clock=self._wall_clock,
            clock=self._clock,
        )

    async def _relabel(
        self, spec: resource.LeaderElectionSpec, holder: Holder | None
    ) -> tuple[dict[str, pods.Pod], bool]:
        """Put the leader label right on every candidate pod (as the shared pod watch shows them);
        the candidates by name, and whether every patch went through (else: retried with back-off)."""
        scope = (spec.selector, spec.leader_label)
        if self._label_scope is not None and self._label_scope != scope:
            self._stale_labels.append(self._label_scope)
        self._label_scope = scope
        candidates = pods.candidates(self._pod_index, self._namespace, spec.selector)
        by_name = {str(pod["metadata"]["name"]): pod for pod in candidates}
        self._label_memo.forget_gone(
            str(pod["metadata"]["name"]) for pod in self._pod_index.get(self._namespace) or ()
        )
        try:
            changes = reconcile.label_changes(candidates, holder=holder, label=spec.leader_label)
            # The old holder first: for a moment no pod is "true" rather than two.
            for name, value in sorted(changes.items(), key=lambda item: item[1] == "true"):
                await self._patch_label(by_name[name], spec.leader_label, value)
            await self._remove_stale_labels(spec)
        except KubeApiError as exc:
            self._metrics.error("kubernetes")
            self._log.warning("cannot label the candidate pods: %s", exc)
            return by_name, False
        return by_name, True

    async def _patch_label(self, pod: pods.Pod, label: str, value: str | None) -> None:
        """Patch one label, unless this very value was written and the watch has not shown the pod
        since (the index lags a patch by a watch event: no second patch meanwhile)."""
        if self._label_memo.pending(pod, label, value):
            return
        await self._api.patch_pod_labels(self._namespace, str(pod["metadata"]["name"]), {label: value})
        self._label_memo.wrote(pod, label, value)

    async def _remove_stale_labels(self, spec: resource.LeaderElectionSpec) -> None:
        """After a change of selector or leaderLabel: take the old label off the pods the old
        selector chose (but not where the new spec owns that very label), so that no pod keeps
        an old "true". Done after the new labels are on; a failure is retried next cycle."""
        while self._stale_labels:
            selector, label = self._stale_labels[0]
            for pod in pods.candidates(self._pod_index, self._namespace, selector):
                labels = pod["metadata"].get("labels") or {}
                owned = label == spec.leader_label and resource.selector_matches(spec.selector, labels)
                if label in labels and not owned:
                    await self._patch_label(pod, label, None)
            self._stale_labels.pop(0)
            self._log.info("removed the old label %s from the pods of the old selector", label)

    def _export_holder(self, lock: str, holder: Holder | None) -> None:
        if self._metric_lock is not None and self._metric_lock != lock:
            self._metrics.forget(namespace=self._namespace, lock=self._metric_lock)
        self._metric_lock = lock
        self._metrics.set_holder(
            namespace=self._namespace, lock=lock, holder=holder.identity if holder else None
        )

    async def _fail(
        self,
        reason: str,
        message: str,
        *,
        spec: resource.LeaderElectionSpec | None = None,
    ) -> None:
        self._metrics.error(reason)
        self._invalid_reported = None  # the status below says SpecValid True: report anew
        previous: Mapping[str, Any] = next(
            (c for c in self._status.get("conditions") or [] if c.get("type") == reconcile.REDIS_REACHABLE),
            {},
        )
        if previous.get("status") != "False" or previous.get("message") != message:
            self._log.warning("LeaderElection %s: %s", self._name, message)
        status = reconcile.build_status(
            previous=self._status,
            lock=spec.lock if spec is not None else str(self._status.get("lock") or ""),
            holder=self._holder,
            holder_pod=self._status.get("holderPod"),
            transitions=self._transitions,
            last_transition_time=self._last_transition_time,
            candidates=None,
            redis_error=message,
            **self._lease_condition(),
        )
        await self._write_status(status)

    async def _write_status(self, status: Mapping[str, Any]) -> None:
        merged = {**self._status, **status}
        if self._written is not None and reconcile.without_times(merged) == reconcile.without_times(
            self._written
        ):
            return
        try:
            await self._api.patch_status(self._namespace, self._name, status)
        except KubeApiError as exc:
            self._metrics.error("kubernetes")
            self._log.warning("cannot update the LeaderElection's status: %s", exc)
            return
        self._status = merged
        self._written = merged


def _with_password(url: str, password: str) -> str:
    """`url` with `password` in its user-info (percent-encoded); make_client passes it on."""
    parsed = urllib.parse.urlsplit(url)
    host = parsed.netloc.rpartition("@")[2]
    user = parsed.username or ""
    secret = urllib.parse.quote(password, safe="")
    return urllib.parse.urlunsplit(parsed._replace(netloc=f"{user}:{secret}@{host}"))
