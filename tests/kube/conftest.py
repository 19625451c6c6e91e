"""Fixtures for kopf against the kmock Kubernetes API emulator, shared by every test under tests/kube.

- `kmock`: kmock's own live emulator (on 127.0.0.1, a free port), with the bundled built-in
  resources (pods, configmaps, events, ...) loaded; `declare_resource()` adds custom ones.
- `kopf_registry`: a fresh `kopf.OperatorRegistry` whose login handler points at `kmock`.
- `kopf_settings`: `kopf_test_settings()` (scanning off, no k8s events for handler logs).

The helpers to build and create objects are in tests/kube/kmock_support.py.

Teardown: stop every kopf that talks to `kmock` (thread or child process) before the `kmock`
fixture ends, and let the loop run once (`await asyncio.sleep(0.1)`): kmock's aiohttp server
waits up to 60 s for watch streams that are still open at its shutdown. A fixture that depends
on `kmock` is torn down before it (see `children` in test_singleton.py).
"""

from __future__ import annotations

import kmock as kmock_lib
import kopf
import pytest

from tests.kube.kmock_support import kopf_test_settings, login_to


@pytest.fixture
def kmock(kmock: kmock_lib.KubernetesEmulator) -> kmock_lib.KubernetesEmulator:
    """kmock's emulator with the bundled built-in resources loaded (kopf discovers them)."""
    kmock.resources.load_bundled()
    return kmock


@pytest.fixture
def kopf_registry(kmock: kmock_lib.KubernetesEmulator) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    login_to(kmock, registry=registry)
    return registry


@pytest.fixture
def kopf_settings() -> kopf.OperatorSettings:
    return kopf_test_settings()
