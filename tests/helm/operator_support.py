"""The elector-operator chart (helm/elector-operator) for the chart tests: where it is, rendering it with the
real Helm engine (helm-python-sdk), picking documents, validating them against the Kubernetes schemas."""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Any

import celpy
import kubernetes_validate
import yaml
from helm_python import _native
from helm_python.chart import Chart

OPERATOR_CHART_DIR = Path(__file__).resolve().parents[2] / "helm" / "elector-operator"
CRD_PATH = OPERATOR_CHART_DIR / "files" / "leaderelection-crd.yaml"
RELEASE = "demo"
NAMESPACE = "apps"
KUBE_LATEST = kubernetes_validate.utils.latest_version()
#: The chart's kubeVersion floor, and the newest schemas kubernetes-validate has.
KUBE_VERSIONS = ["1.27.0", KUBE_LATEST]
#: Kinds that exist only from a Kubernetes version on (the chart renders them only there).
SINCE = {"ValidatingAdmissionPolicy": (1, 30), "ValidatingAdmissionPolicyBinding": (1, 30)}

Doc = dict[str, Any]


@functools.cache
def operator_chart() -> Chart:
    return Chart.load(OPERATOR_CHART_DIR)


def render_manifests(
    values: dict[str, Any],
    *,
    name: str = RELEASE,
    kube_version: str | None = None,
    api_versions: list[str] | None = None,
) -> dict[str, str]:
    """The rendered files, NOTES.txt included, of a release `name` in namespace "apps". kube_version and
    api_versions set the engine's Capabilities, which Chart.render does not expose but its native call
    takes as render options (default: the engine's own Kubernetes version, built-in APIs only)."""
    if kube_version is None and api_versions is None:
        return operator_chart().render(values, name=name, namespace=NAMESPACE)
    options: dict[str, Any] = {"name": name, "namespace": NAMESPACE}
    if kube_version is not None:
        options["kube_version"] = kube_version if kube_version.startswith("v") else f"v{kube_version}"
    if api_versions is not None:
        options["api_versions"] = api_versions
    chart = operator_chart()
    rendered = _native.call_string("helm_render", chart._raw(), json.dumps(values), json.dumps(options))
    manifests: dict[str, str] = json.loads(rendered)
    return manifests


def render_operator(values: dict[str, Any], *, name: str = RELEASE, **capabilities: Any) -> list[Doc]:
    """The parsed documents (NOTES.txt excluded), hooks included."""
    docs: list[Doc] = []
    for path, text in sorted(render_manifests(values, name=name, **capabilities).items()):
        if not path.endswith("NOTES.txt"):
            docs.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return docs


def notes(values: dict[str, Any], **capabilities: Any) -> str:
    return render_manifests(values, **capabilities)["elector-operator/templates/NOTES.txt"]


def is_hook(doc: Doc) -> bool:
    return "helm.sh/hook" in (doc["metadata"].get("annotations") or {})


def of_kind(docs: list[Doc], kind: str) -> list[Doc]:
    return [doc for doc in docs if doc["kind"] == kind]


def one(docs: list[Doc], kind: str, name: str | None = None) -> Doc:
    matches = [doc for doc in of_kind(docs, kind) if name is None or doc["metadata"]["name"] == name]
    assert len(matches) == 1, [doc["metadata"]["name"] for doc in matches]
    return matches[0]


def validate_kubernetes(doc: Doc, versions: list[str] = KUBE_VERSIONS) -> None:
    """Strict validation against every version's schemas that has the kind."""
    for version in versions:
        since = SINCE.get(doc["kind"])
        if since and tuple(int(part) for part in version.split(".")[:2]) < since:
            continue
        kubernetes_validate.validate(doc, version, strict=True)


# --- the CRD's CEL rules (x-kubernetes-validations), evaluated with cel-python ------------------------------


@dataclasses.dataclass(frozen=True)
class CelRule:
    """One x-kubernetes-validations rule of the CRD, at its place in the schema (keys from the root)."""

    path: tuple[str, ...]
    rule: str
    message: str
    program: Any

    def holds(self, value: Any) -> bool:
        result = self.program.evaluate({"self": celpy.json_to_cel(value)})
        if isinstance(result, celpy.CELEvalError):
            raise AssertionError(f"rule at {'.'.join(self.path)} failed to evaluate: {result}")
        return bool(result)


def crd_cel_rules(crd: Doc) -> list[CelRule]:
    """Every CEL rule of the served version's schema, compiled (a rule that does not compile fails here)."""
    (version,) = [v for v in crd["spec"]["versions"] if v["served"]]
    env = celpy.Environment()
    rules: list[CelRule] = []

    def walk(node: Doc, path: tuple[str, ...]) -> None:
        for entry in node.get("x-kubernetes-validations") or []:
            program = env.program(env.compile(entry["rule"]))
            rules.append(CelRule(path, entry["rule"], entry["message"], program))
        for key, child in (node.get("properties") or {}).items():
            walk(child, (*path, key))

    walk(version["schema"]["openAPIV3Schema"], ())
    return rules


def cel_violations(crd: Doc, obj: Doc) -> list[str]:
    """The messages of the rules `obj` breaks, as the API server evaluates them: each rule where its field
    is present (a rule of an absent optional field is not evaluated), on the object as given."""
    failed = []
    for rule in crd_cel_rules(crd):
        value: Any = obj
        for key in rule.path:
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            if not rule.holds(value):
                failed.append(f"{'.'.join(rule.path)}: {rule.message}")
    return failed
