"""The operator's RBAC is exactly what its code calls, both ways (issue 23, least privilege).

The verbs are derived from the source of elector/kube/operator, not written down a second time:

- every `<api>.request("METHOD", <path>)` call site: the path (an f-string, or `lease_path(...)` /
  `_election_path(...)` with an optional "/status") gives the API group, the resource and whether it names
  one object; GET of a collection is `list`, of an object `get`, POST `create`, PUT `update`, PATCH `patch`;
- every `kopf.daemon(GROUP, VERSION, PLURAL)` / `kopf.on.*` handler: kopf lists and watches its resource
  and patches it (its finalizer); a `kopf.index(...)` only lists and watches (no finalizer, no progress);
- `kopf.event(...)`: kopf creates a core v1 Event.

Each (group, resource, verb) the code calls must be granted by the rendered Roles, and each rule the chart
renders must be called by the code.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from elector.kube.operator import lease_mirror, resource
from tests.helm.operator_support import is_hook, of_kind, render_operator

OPERATOR_SOURCE = Path(__file__).resolve().parents[2] / "elector" / "kube" / "operator"
VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
#: Values of the names the paths are built from.
NAMES: dict[str, str] = {
    "resource.API_VERSION": resource.API_VERSION,
    "resource.PLURAL": resource.PLURAL,
    "resource.GROUP": resource.GROUP,
    "resource.VERSION": resource.VERSION,
    "LEASE_API_VERSION": lease_mirror.LEASE_API_VERSION,
}
#: The path helpers: their path with "{}" for each argument (the name is the last one).
HELPERS = {
    "lease_path": f"/apis/{lease_mirror.LEASE_API_VERSION}/namespaces/{{}}/leases",
    "_election_path": f"/apis/{resource.API_VERSION}/namespaces/{{}}/{resource.PLURAL}/{{}}",
}

Permission = tuple[str, str, str]  # (API group, resource, verb)


def _text(node: ast.expr) -> str:
    """A path expression as text, "{}" for every part only known at run time."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            else:
                assert isinstance(value, ast.FormattedValue)
                parts.append(NAMES.get(ast.unparse(value.value), "{}"))
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _text(node.left) + _text(node.right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in HELPERS:
        base = HELPERS[node.func.id]
        if node.func.id == "lease_path" and len(node.args) > 1:
            base += "/{}"
        return base
    if isinstance(node, ast.Name):
        return "{path}"  # a variable: resolved from its assignment by the caller
    raise AssertionError(f"cannot read the path {ast.unparse(node)!r}: teach this test")


def _permission(method: str, path: str) -> Permission:
    parts = path.strip("/").split("/")
    if parts[0] == "api":  # /api/v1/namespaces/{}/<resource>[/{}[/sub]]
        group, rest = "", parts[2:]
    else:  # /apis/<group>/<version>/namespaces/{}/<resource>[/{}[/sub]]
        group, rest = parts[1], parts[3:]
    assert rest[0] == "namespaces", f"{path}: the operator only makes namespaced requests"
    rest = rest[2:]
    name = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    names_one = len(rest) > 1
    verb = ("get" if names_one else "list") if method == "GET" else VERBS[method]
    return group, name, verb


#: What kopf does to the resource of a daemon or a kopf.on.* handler: watch it, keep its finalizer.
VERBS_OF_HANDLER = ("list", "watch", "patch")


def _name_value(node: ast.expr) -> str:
    """A handler's group or plural: a string, or one of NAMES."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return NAMES[ast.unparse(node)]


def calls_in_code() -> set[Permission]:
    permissions: set[Permission] = set()
    for source in sorted(OPERATOR_SOURCE.glob("*.py")):
        tree = ast.parse(source.read_text(), filename=str(source))
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            assigned = {
                target.id: node.value
                for node in ast.walk(function)
                if isinstance(node, ast.Assign)
                for target in node.targets
                if isinstance(target, ast.Name)
            }
            for node in ast.walk(function):
                if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                    continue
                owner = ast.unparse(node.func.value)
                if node.func.attr == "request" and node.args and isinstance(node.args[0], ast.Constant):
                    if function.name == "request":
                        continue  # the client's own plumbing
                    path_node = node.args[1]
                    if isinstance(path_node, ast.Name):
                        path_node = assigned[path_node.id]
                    permissions.add(_permission(str(node.args[0].value), _text(path_node)))
                elif owner == "kopf" and node.func.attr == "event":
                    permissions.add(("", "events", "create"))
            for decorator in function.decorator_list:
                call = decorator if isinstance(decorator, ast.Call) else None
                if call is None or not ast.unparse(call.func).startswith("kopf."):
                    continue
                if len(call.args) == 3:  # kopf.daemon / kopf.on.* / kopf.index(group, version, plural)
                    group, plural = (_name_value(call.args[i]) for i in (0, 2))
                    verbs = ("list", "watch") if ast.unparse(call.func) == "kopf.index" else VERBS_OF_HANDLER
                    permissions |= {(group, plural, verb) for verb in verbs}
    return permissions


def granted(docs: list[dict[str, Any]]) -> set[Permission]:
    roles = [d for d in docs if d["kind"] in ("Role", "ClusterRole") and not is_hook(d)]
    return {
        (group, name, verb)
        for role in roles
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for name in rule["resources"]
        for verb in rule["verbs"]
    }


def test_the_derivation_finds_the_operators_calls() -> None:
    """A guard on the parser: the calls known to exist are found (else an empty set would pass)."""
    calls = calls_in_code()
    assert {
        ("elector.io", "leaderelections", "watch"),
        ("elector.io", "leaderelections/status", "patch"),
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("", "pods", "patch"),
        ("", "secrets", "get"),
        ("", "events", "create"),
        ("coordination.k8s.io", "leases", "update"),
    } <= calls


@pytest.mark.parametrize(
    "values",
    [
        {"rbac": {"secretNames": ["redis-auth"]}},
        {"clusterWide": True, "rbac": {"secretNames": ["redis-auth"], "leaseNamespaces": ["apps"]}},
    ],
    ids=["namespaced", "cluster-wide"],
)
def test_the_rendered_rules_are_exactly_the_verbs_the_code_calls(values: dict[str, Any]) -> None:
    calls = calls_in_code()
    rules = granted(render_operator(values))
    assert calls - rules == set(), "the code calls what the chart does not grant"
    assert rules - calls == set(), "the chart grants what the code never calls"


def test_leases_never_reach_kube_system_unless_named() -> None:
    """clusterWide used to grant update on every Lease of the cluster: kube-system's control-plane Leases
    and kube-node-lease included."""
    cluster_role = of_kind(render_operator({"clusterWide": True}), "ClusterRole")
    assert all("leases" not in rule["resources"] for role in cluster_role for rule in role["rules"])
    roles = of_kind(
        render_operator({"clusterWide": True, "rbac": {"leaseNamespaces": ["apps", "jobs"]}}), "Role"
    )
    lease_roles = [
        r for r in roles if any("leases" in rule["resources"] for rule in r["rules"]) and not is_hook(r)
    ]
    assert sorted(r["metadata"]["namespace"] for r in lease_roles) == ["apps", "jobs"]
    for role in lease_roles:
        assert role["rules"] == [
            {
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "verbs": ["get", "create", "update"],
            }
        ]


@pytest.mark.parametrize("cluster_wide", [False, True], ids=["namespaced", "cluster-wide"])
def test_secrets_only_by_name_in_the_default_values(cluster_wide: bool) -> None:
    """A namespaced operator used to read every Secret of the namespaces it watches."""
    for role in of_kind(
        render_operator({"clusterWide": cluster_wide}), "ClusterRole" if cluster_wide else "Role"
    ):
        if not is_hook(role):
            assert all("secrets" not in rule["resources"] for rule in role["rules"])
