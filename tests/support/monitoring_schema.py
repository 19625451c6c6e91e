"""The schema check for the Prometheus operator's objects the chart renders (ServiceMonitor, PodMonitor,
PrometheusRule): one check for the chart tests (tests/helm/test_chart.py) and the kustomize manifests
rendered from the chart (tests/helm/test_kustomize.py)."""

from __future__ import annotations

from typing import Any

import jsonschema

# kubernetes-validate only knows built-in kinds. The Prometheus operator's kinds are checked against this
# small schema instead: the envelope plus the spec fields this chart uses, no unknown fields allowed.
_MONITOR_ENDPOINT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["port"],
    "properties": {
        "port": {"type": "string"},
        "path": {"type": "string"},
        "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
        "scrapeTimeout": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
    },
}
_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "required": ["matchLabels"],
    "properties": {
        "matchLabels": {"type": "object", "minProperties": 1, "additionalProperties": {"type": "string"}}
    },
}
_NAMESPACE_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"matchNames": {"type": "array", "items": {"type": "string"}}},
}
_RULE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["alert", "expr"],
    "properties": {
        "alert": {"type": "string"},
        "expr": {"type": "string"},
        "for": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}
MONITORING_SPECS: dict[str, dict[str, Any]] = {
    "ServiceMonitor": {
        "type": "object",
        "additionalProperties": False,
        "required": ["selector", "endpoints"],
        "properties": {
            "selector": _SELECTOR,
            "namespaceSelector": _NAMESPACE_SELECTOR,
            "endpoints": {"type": "array", "minItems": 1, "items": _MONITOR_ENDPOINT},
        },
    },
    "PodMonitor": {
        "type": "object",
        "additionalProperties": False,
        "required": ["selector", "podMetricsEndpoints"],
        "properties": {
            "selector": _SELECTOR,
            "namespaceSelector": _NAMESPACE_SELECTOR,
            "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": _MONITOR_ENDPOINT},
        },
    },
    "PrometheusRule": {
        "type": "object",
        "additionalProperties": False,
        "required": ["groups"],
        "properties": {
            "groups": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["name", "rules"],
                    "properties": {
                        "name": {"type": "string"},
                        "interval": {"type": "string"},
                        "rules": {"type": "array", "minItems": 1, "items": _RULE},
                    },
                },
            }
        },
    },
}


def validate_monitoring(doc: dict[str, Any], *, namespaced: bool = True) -> None:
    """Raise jsonschema.ValidationError unless `doc` is a ServiceMonitor, PodMonitor or PrometheusRule
    made only of the fields above. `namespaced=False` for a kustomize base, whose overlay sets the
    namespace (scripts/render_kustomize.py removes it)."""
    required_metadata = ["name", "namespace", "labels"] if namespaced else ["name", "labels"]
    schema = {
        "type": "object",
        "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"enum": sorted(MONITORING_SPECS)},
            "metadata": {
                "type": "object",
                "required": required_metadata,
                "properties": {"name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"}},
            },
            # An unknown kind fails on "kind" above; its spec is then not looked at.
            "spec": MONITORING_SPECS.get(str(doc.get("kind")), {}),
        },
    }
    jsonschema.validate(doc, schema)
