"""Problem 3: `helm uninstall` of the elector-operator chart. A pre-delete hook deletes the LeaderElections
the operator serves and waits until they are gone, while the operator still runs and removes kopf's finalizer.

The hook's objects and their order are checked as rendered by the real Helm engine; the hook's script (the
ConfigMap the Job runs) is run against a small fake API server that behaves like one with kopf's finalizer:
a deleted LeaderElection first gets a deletionTimestamp, and disappears only once "the operator" let it go."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.helm.operator_support import (
    NAMESPACE,
    OPERATOR_CHART_DIR,
    Doc,
    is_hook,
    notes,
    of_kind,
    one,
    render_operator,
    validate_kubernetes,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "kubernetes.md"
HOOK = "demo-elector-operator-pre-delete"


def hooks(docs: list[Doc]) -> list[Doc]:
    return [doc for doc in docs if is_hook(doc)]


def annotations(doc: Doc) -> dict[str, str]:
    return dict(doc["metadata"].get("annotations") or {})


def helm_hook_order(docs: list[Doc]) -> list[tuple[str, str]]:
    """The order Helm runs the pre-delete hooks in: by helm.sh/hook-weight (an integer in a string), then by
    name (Helm's hookByWeight; it sorts by kind only before that, and a stable sort keeps no kind order
    between equal weights and different names)."""
    pre_delete = [d for d in hooks(docs) if "pre-delete" in annotations(d)["helm.sh/hook"].split(",")]
    ordered = sorted(
        pre_delete, key=lambda d: (int(annotations(d).get("helm.sh/hook-weight", "0")), d["metadata"]["name"])
    )
    return [(d["kind"], d["metadata"].get("namespace", "")) for d in ordered]


# --- what Helm gets ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("cluster_wide", [False, True], ids=["namespaced", "cluster-wide"])
def test_the_hook_runs_before_anything_is_deleted_and_its_rbac_before_its_job(cluster_wide: bool) -> None:
    docs = render_operator({"clusterWide": cluster_wide, "namespaces": ["apps", "jobs"]})
    hook_docs = hooks(docs)
    assert hook_docs, "no pre-delete hook"
    for doc in hook_docs:
        meta = annotations(doc)
        # pre-delete hooks run before Helm deletes any of the release's resources ...
        assert meta["helm.sh/hook"] == "pre-delete"
        # ... are replaced on the next try, removed once every hook succeeded (a failed Job stays for logs)
        assert meta["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
        assert doc["metadata"]["name"] == HOOK
    # the operator itself and its RBAC are ordinary release resources: Helm deletes them after the hooks ran
    release = [d for d in docs if not is_hook(d)]
    assert {"Deployment", "ServiceAccount"} <= {d["kind"] for d in release}
    order = [kind for kind, _ in helm_hook_order(docs)]
    assert order[-1] == "Job"
    binding = "ClusterRoleBinding" if cluster_wide else "RoleBinding"
    role = "ClusterRole" if cluster_wide else "Role"
    for kind in ("ServiceAccount", "ConfigMap", role):
        assert max(i for i, k in enumerate(order) if k == kind) < min(
            i for i, k in enumerate(order) if k == binding
        ), order
    assert order.count(binding) == (1 if cluster_wide else 2)
    for doc in docs:
        validate_kubernetes(doc)


def test_the_hook_job_deletes_only_leader_elections_of_the_watched_namespaces() -> None:
    docs = render_operator({"namespaces": ["apps", "jobs"], "preDeleteHook": {"labelSelector": "team=a"}})
    roles = [d for d in hooks(docs) if d["kind"] == "Role"]
    assert {r["metadata"]["namespace"] for r in roles} == {"apps", "jobs"}
    for role in roles:
        assert role["rules"] == [
            {"apiGroups": ["elector.io"], "resources": ["leaderelections"], "verbs": ["list", "delete"]}
        ]
    for binding in [d for d in hooks(docs) if d["kind"] == "RoleBinding"]:
        assert binding["roleRef"]["name"] == HOOK
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": HOOK, "namespace": NAMESPACE}]
    job = one(docs, "Job")
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == HOOK and pod["restartPolicy"] == "Never"
    (container,) = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["NAMESPACES"] == "apps jobs" and env["LABEL_SELECTOR"] == "team=a"
    assert env["TIMEOUT_SECONDS"] == "120"
    assert job["spec"]["activeDeadlineSeconds"] > 120
    # the operator's image has Python 3: the script is the chart's file, mounted from the hook's ConfigMap
    assert container["image"] == one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"]
    assert container["command"] == ["python3", "/etc/elector/hook/pre-delete.py"]
    config_map = one(docs, "ConfigMap")
    assert config_map["data"]["pre-delete.py"] == (OPERATOR_CHART_DIR / "files" / "pre-delete.py").read_text()
    cluster_wide = render_operator({"clusterWide": True})
    (cluster_role,) = [d for d in hooks(cluster_wide) if d["kind"] == "ClusterRole"]
    assert cluster_role["rules"][0]["verbs"] == ["list", "delete"]
    assert {
        e["name"]: e["value"]
        for e in one(cluster_wide, "Job")["spec"]["template"]["spec"]["containers"][0]["env"]
    }["NAMESPACES"] == "*"


def test_the_operator_image_runs_the_hook() -> None:
    """The hook's default image is the operator's: elector's image, built FROM an official Python image
    (python3 on PATH; no kubectl, hence a standard-library script)."""
    dockerfile = (DOCS.parents[1] / "Dockerfile").read_text()
    assert "ARG PYTHON_IMAGE=python:3." in dockerfile and "FROM ${PYTHON_IMAGE} AS runtime" in dockerfile
    script = (OPERATOR_CHART_DIR / "files" / "pre-delete.py").read_text()
    imports = {line.split()[1].split(".")[0] for line in script.splitlines() if line.startswith("import ")}
    assert imports <= set(sys.stdlib_module_names), imports - set(sys.stdlib_module_names)


def test_the_hook_can_be_switched_off() -> None:
    docs = render_operator({"preDeleteHook": {"enabled": False}})
    assert not hooks(docs) and not of_kind(docs, "Job")
    assert "delete the LeaderElections BEFORE uninstalling" in notes({"preDeleteHook": {"enabled": False}})


def test_the_docs_say_uninstall_works_instead_of_may_hang() -> None:
    text = DOCS.read_text()
    assert "pre-delete" in text and "preDeleteHook" in text
    assert "may stop the operator before the LeaderElection is gone" not in text


# --- what the Job does: the script against a fake API server ---------------------------------------------


@dataclass
class FakeApi:
    """LeaderElections behind kopf's finalizer: a DELETE sets deletionTimestamp; the object goes after
    `release_after` more lists (the operator removing its finalizer), never when it is None."""

    objects: dict[tuple[str, str], Doc] = field(default_factory=dict)
    release_after: int | None = 2
    missing_resource: bool = False
    requests: list[tuple[str, str, dict[str, list[str]], str]] = field(default_factory=list)
    _countdown: dict[tuple[str, str], int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, namespace: str, name: str, **labels: str) -> None:
        self.objects[namespace, name] = {"metadata": {"namespace": namespace, "name": name, "labels": labels}}

    def handle(self, method: str, raw_path: str, authorization: str) -> tuple[int, Doc]:
        url = urlsplit(raw_path)
        query = parse_qs(url.query)
        parts = url.path.strip("/").split("/")
        with self._lock:
            self.requests.append((method, url.path, query, authorization))
            if parts[:3] != ["apis", "elector.io", "v1alpha1"] or self.missing_resource:
                return 404, {"kind": "Status", "code": 404}
            rest = parts[3:]
            selector = query.get("labelSelector", [""])[0]
            if method == "GET" and rest == ["leaderelections"]:
                return 200, {"items": self._list(None, selector)}
            if (
                method == "GET"
                and len(rest) == 3
                and rest[0] == "namespaces"
                and rest[2] == "leaderelections"
            ):
                return 200, {"items": self._list(rest[1], selector)}
            if method == "DELETE" and len(rest) == 4 and rest[0] == "namespaces":
                key = (rest[1], rest[3])
                if key not in self.objects:
                    return 404, {"kind": "Status", "code": 404}
                self.objects[key]["metadata"]["deletionTimestamp"] = "2030-01-01T00:00:00Z"
                if self.release_after is not None:
                    self._countdown.setdefault(key, self.release_after)
                return 200, self.objects[key]
            return 405, {"kind": "Status", "code": 405}

    def _list(self, namespace: str | None, selector: str) -> list[Doc]:
        for key in list(self._countdown):
            self._countdown[key] -= 1
            if self._countdown[key] < 0:
                del self._countdown[key]
                del self.objects[key]
        wanted = dict(term.split("=", 1) for term in selector.split(",") if term)
        return [
            obj
            for (ns, _), obj in sorted(self.objects.items())
            if namespace in (None, ns) and wanted.items() <= obj["metadata"]["labels"].items()
        ]

    def deleted(self) -> list[str]:
        return [path.rsplit("/", 1)[1] for method, path, _, _ in self.requests if method == "DELETE"]


@pytest.fixture
def api() -> Iterator[tuple[FakeApi, str]]:
    fake = FakeApi()

    class Handler(BaseHTTPRequestHandler):
        def _reply(self) -> None:
            status, body = fake.handle(self.command, self.path, self.headers.get("Authorization", ""))
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_DELETE = _reply

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def run_hook(
    tmp_path: Path, url: str, values: dict[str, Any] | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """The rendered Job's container: its script from the ConfigMap, its environment, the pod's token."""
    docs = render_operator(values or {})
    script = tmp_path / "pre-delete.py"
    script.write_text(one(docs, "ConfigMap")["data"]["pre-delete.py"])
    account = tmp_path / "serviceaccount"
    account.mkdir(exist_ok=True)
    (account / "token").write_text("hook-token\n")
    container = one(docs, "Job")["spec"]["template"]["spec"]["containers"][0]
    job_env = {e["name"]: e["value"] for e in container["env"]}
    return subprocess.run(
        [sys.executable, str(script)],
        check=False,
        env={
            "PATH": os.environ["PATH"],
            **job_env,
            "KUBE_API_URL": url,
            "SERVICE_ACCOUNT_DIR": str(account),
            "POLL_SECONDS": "0.05",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_hook_deletes_and_waits_until_the_operator_let_them_go(
    api: tuple[FakeApi, str], tmp_path: Path
) -> None:
    fake, url = api
    fake.add("apps", "billing")
    fake.add("apps", "reports")
    fake.add("jobs", "nightly")
    fake.add("other", "not-watched")
    result = run_hook(tmp_path, url, {"namespaces": ["apps", "jobs"]})
    assert result.returncode == 0, result.stderr
    assert sorted(fake.deleted()) == ["billing", "nightly", "reports"]
    assert list(fake.objects) == [("other", "not-watched")]
    assert "no LeaderElection left" in result.stdout
    # it waited: it listed again after the deletes until the finalizers were gone
    methods = [method for method, *_ in fake.requests]
    assert methods[methods.index("DELETE") :].count("GET") >= 4
    assert {auth for *_, auth in fake.requests} == {"Bearer hook-token"}


def test_the_hook_deletes_only_what_the_selector_names(api: tuple[FakeApi, str], tmp_path: Path) -> None:
    fake, url = api
    fake.add("apps", "ours", team="a")
    fake.add("apps", "theirs", team="b")
    result = run_hook(tmp_path, url, {"preDeleteHook": {"labelSelector": "team=a"}})
    assert result.returncode == 0, result.stderr
    assert fake.deleted() == ["ours"] and list(fake.objects) == [("apps", "theirs")]
    assert {q["labelSelector"][0] for method, _, q, _ in fake.requests if method == "GET"} == {"team=a"}


def test_the_cluster_wide_hook_lists_every_namespace(api: tuple[FakeApi, str], tmp_path: Path) -> None:
    fake, url = api
    fake.add("apps", "a")
    fake.add("far", "b")
    result = run_hook(tmp_path, url, {"clusterWide": True})
    assert result.returncode == 0, result.stderr
    assert not fake.objects
    assert {path for method, path, _, _ in fake.requests if method == "GET"} == {
        "/apis/elector.io/v1alpha1/leaderelections"
    }


def test_the_hook_fails_and_says_why_when_the_operator_does_not_let_go(
    api: tuple[FakeApi, str], tmp_path: Path
) -> None:
    fake, url = api
    fake.release_after = None  # no operator: the finalizer stays
    fake.add("apps", "stuck")
    result = run_hook(tmp_path, url, TIMEOUT_SECONDS="0.5")
    assert result.returncode == 1
    assert "still there after 0.5s: apps/stuck" in result.stderr
    assert '"finalizers":[]' in result.stderr  # the way out, named
    assert fake.deleted() == ["stuck"]  # deleted once, not again while it is terminating


def test_the_hook_passes_without_the_crd(api: tuple[FakeApi, str], tmp_path: Path) -> None:
    fake, url = api
    fake.missing_resource = True
    result = run_hook(tmp_path, url)
    assert result.returncode == 0, result.stderr
    assert not fake.deleted()


def test_the_hook_fails_on_an_unreachable_api(tmp_path: Path) -> None:
    result = run_hook(tmp_path, "http://127.0.0.1:9")
    assert result.returncode == 1 and "pre-delete: GET" in result.stderr
