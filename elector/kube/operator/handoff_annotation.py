"""The `elector.io/handoff-to` annotation: run elector's handoff, then clear the annotation.

The watcher calls `check` every cycle with the object's current annotations (kopf's live view).
The handoff itself is `elector.control.handoff.hand_over`, the same protocol as `elector handoff`; it
runs as a task beside the watch, so labels and status follow the lock while it is under way.
When it ends, the annotation is removed and an Event records the outcome. A value seen once is
not run again until the annotation has gone (a failed removal is retried, not the handoff).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from elector.backend import HandoffRefusedError, RedisLeaseBackend
from elector.control.handoff import HandoffResult, hand_over
from elector.daemon.settings import SettingsError, validate_identity
from elector.kube.operator import reconcile, resource
from elector.kube.operator.kubeapi import KubeApi, KubeApiError
from elector.kube.operator.metrics import OperatorMetrics
from elector.lease import LeaseBackendError


class HandoffRunner:
    def __init__(
        self,
        *,
        body: Mapping[str, Any],
        api: KubeApi,
        metrics: OperatorMetrics,
        post_event: reconcile.EventPoster,
        logger: logging.Logger | logging.LoggerAdapter[logging.Logger],
    ) -> None:
        meta = body.get("metadata") or {}
        namespace, name = str(meta["namespace"]), str(meta["name"])
        #: Events go on this object (kopf's live view: its uid makes them show in `kubectl describe`).
        self._body = body
        self._metrics = metrics
        self._namespace = namespace
        self._name = name
        self._api = api
        self._post = post_event
        self._log = logger
        self._task: asyncio.Task[None] | None = None
        #: The annotation value whose handoff ran (or runs); cleared when the annotation is gone.
        self._handled: str | None = None
        self._cleared = True

    def check(
        self,
        spec: resource.LeaderElectionSpec,
        backend: RedisLeaseBackend,
        *,
        annotations: Mapping[str, str] | None,
    ) -> None:
        value = (annotations or {}).get(resource.HANDOFF_ANNOTATION)
        if value is None:
            self._handled, self._cleared = None, True
            return
        if self._task is not None and not self._task.done():
            return
        if value == self._handled:
            if not self._cleared:  # the handoff ran; only the removal failed
                self._task = asyncio.create_task(self._clear())
            return
        self._handled, self._cleared = value, False
        self._task = asyncio.create_task(self._run(spec, backend, value))

    async def cancel(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        # A handoff cut short by a reconnect may run again under the new connection.
        if not self._cleared:
            self._handled = None

    async def _run(self, spec: resource.LeaderElectionSpec, backend: RedisLeaseBackend, value: str) -> None:
        target = None if value.strip().lower() == resource.HANDOFF_ANY else value
        try:
            if target is not None:
                validate_identity(target)
            self._log.info("handoff of lock %s to %s requested by annotation", spec.lock, value)
            result = await hand_over(
                backend,
                to=target,
                timeout_s=spec.handoff_timeout_s,
                window_s=min(spec.handoff_window_s, spec.handoff_timeout_s),
                progress=lambda line: self._log.info("%s", line),
            )
        except SettingsError as exc:
            result = HandoffResult(done=False, message=f"invalid {resource.HANDOFF_ANNOTATION}: {exc}")
        except HandoffRefusedError as exc:
            result = HandoffResult(done=False, message=f"lock {spec.lock}: {exc}")
        except LeaseBackendError as exc:
            result = HandoffResult(
                done=False, message=f"lock {spec.lock}: Redis failed during the handoff: {exc}"
            )
        except Exception as exc:
            # Anything else (a bug, an unexpected reply): still a failed handoff with an Event,
            # never a task that dies unseen while the annotation is cleared without a word.
            self._log.exception("handoff of lock %s failed unexpectedly", spec.lock)
            result = HandoffResult(
                done=False,
                message=f"lock {spec.lock}: the handoff failed unexpectedly ({type(exc).__name__}); "
                "see the operator's log",
            )
        if result.done:
            self._log.info("%s", result.message)
            self._post(self._body, type="Normal", reason="HandoffSucceeded", message=result.message)
        else:
            self._metrics.error("handoff")
            self._log.warning("handoff failed: %s", result.message)
            self._post(self._body, type="Warning", reason="HandoffFailed", message=result.message)
        await self._clear()

    async def _clear(self) -> None:
        try:
            await self._api.patch_annotations(
                self._namespace, self._name, {resource.HANDOFF_ANNOTATION: None}
            )
        except KubeApiError as exc:
            self._log.warning("cannot remove the %s annotation: %s", resource.HANDOFF_ANNOTATION, exc)
            return
        self._cleared = True
