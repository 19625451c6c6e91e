"""The sidecar's values of issue 43, rendered by the real Helm engine (helm/elector, conftest's
`render`): `appHealth` (off by default, one value to point it at the app's probe path) and the
leader-elector listener's `api` and `identityFromHostname` switch."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
from helm_python.errors import HelmError

from tests.helm.test_chart_conventions import NEWEST_KUBE, Render, sidecar_of
from tests.helm.test_parent_chart import env_of


def deployment(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == "Deployment")


def test_app_health_is_off_and_the_identity_is_the_pods_name_by_default(render: Render) -> None:
    env = env_of(sidecar_of(render({})))
    assert not [name for name in env if name.startswith("ELECTOR_APP_HEALTH")]
    assert "ELECTOR_COMPAT_API" not in env
    assert (
        env["POD_NAME"] == {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}
        or "POD_NAME" in env
    )


def test_one_value_points_the_sidecar_at_the_apps_probe(render: Render) -> None:
    docs = render({"elector": {"appHealth": {"url": "http://127.0.0.1:8080/healthz"}}})
    env = env_of(sidecar_of(docs))
    assert env["ELECTOR_APP_HEALTH_URL"] == "http://127.0.0.1:8080/healthz"
    assert not [
        name for name in env if name.startswith("ELECTOR_APP_HEALTH_") and name != "ELECTOR_APP_HEALTH_URL"
    ]
    kubernetes_validate.validate(deployment(docs), NEWEST_KUBE, strict=True)


def test_the_app_health_timing_is_passed_when_given(render: Render) -> None:
    app = {
        "url": "https://app:8443/ready",
        "interval": "2s",
        "failures": 5,
        "timeout": "500ms",
        "minTerm": "1m",
    }
    env = env_of(sidecar_of(render({"elector": {"appHealth": app}})))
    assert {name: value for name, value in env.items() if name.startswith("ELECTOR_APP_HEALTH")} == {
        "ELECTOR_APP_HEALTH_URL": "https://app:8443/ready",
        "ELECTOR_APP_HEALTH_INTERVAL": "2s",
        "ELECTOR_APP_HEALTH_FAILURES": "5",
        "ELECTOR_APP_HEALTH_TIMEOUT": "500ms",
        "ELECTOR_APP_HEALTH_MIN_TERM": "1m",
    }


def test_the_hostname_switch_leaves_pod_name_unset_so_the_identity_is_the_host_name(render: Render) -> None:
    compat = {"enabled": True, "identityFromHostname": True, "api": "nais"}
    docs = render({"elector": {"leaderElectorCompat": compat}})
    env = env_of(sidecar_of(docs))
    assert "POD_NAME" not in env and "ELECTOR_IDENTITY" not in env
    assert env["ELECTOR_COMPAT_API"] == "nais"
    kubernetes_validate.validate(deployment(docs), NEWEST_KUBE, strict=True)


@pytest.mark.parametrize(
    ("elector", "fragment"),
    [
        ({"appHealth": {"url": "tcp://app:80"}}, r"appHealth\.url must be an http:// or https:// URL"),
        (
            {"appHealth": {"url": "http://app/", "interval": "1"}},
            r"appHealth\.interval must be empty or a duration",
        ),
        ({"appHealth": {"url": "http://app/", "failures": 101}}, r"appHealth/failures"),
        ({"leaderElectorCompat": {"enabled": True, "api": "consul"}}, r"leaderElectorCompat/api"),
        (
            {"leaderElectorCompat": {"identityFromHostname": True}},
            r"identityFromHostname needs leaderElectorCompat\.enabled",
        ),
    ],
)
def test_bad_values_fail_the_render_naming_the_value(
    render: Render, elector: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(HelmError, match=fragment):
        render({"elector": elector})
