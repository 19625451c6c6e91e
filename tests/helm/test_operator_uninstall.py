"""`helm uninstall` of the elector-operator chart. A pre-delete hook stops the operator, removes its
finalizer from every LeaderElection it served (so that none hangs when deleted later), and deletes only the
LeaderElections of its own release: other releases' (the elector chart's, another team's) stay.

The hook's objects and their order are checked as rendered by the real Helm engine; the hook's script (the
ConfigMap the Job runs) is run against a small fake API server that behaves like one with finalizers: a
deleted LeaderElection first gets a deletionTimestamp, and disappears once its last finalizer is gone."""

from __future__ import annotations

import copy
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

import kopf
import pytest

from elector.kube.operator.handlers import configure_settings
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
        assert doc["metadata"]["name"] in (HOOK, f"{HOOK}-stop")
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
    # one per watched namespace (or one cluster-wide), and one to stop the operator in the release's
    assert order.count(binding) == (1 if cluster_wide else 3)
    assert order.count("RoleBinding") == (1 if cluster_wide else 3)
    for doc in docs:
        validate_kubernetes(doc)


def test_the_hook_job_deletes_only_leader_elections_of_the_watched_namespaces() -> None:
    docs = render_operator({"namespaces": ["apps", "jobs"], "preDeleteHook": {"labelSelector": "team=a"}})
    roles = [d for d in hooks(docs) if d["kind"] == "Role" and d["metadata"]["name"] == HOOK]
    assert {r["metadata"]["namespace"] for r in roles} == {"apps", "jobs"}
    for role in roles:
        assert role["rules"] == [
            {
                "apiGroups": ["elector.io"],
                "resources": ["leaderelections"],
                "verbs": ["get", "list", "patch", "delete"],
            }
        ]
    # to stop the operator: its own Deployment's scale only, and a look at its pods (release namespace)
    stop = one([d for d in hooks(docs) if d["kind"] == "Role"], "Role", f"{HOOK}-stop")
    assert stop["metadata"]["namespace"] == NAMESPACE
    assert stop["rules"] == [
        {
            "apiGroups": ["apps"],
            "resources": ["deployments/scale"],
            "verbs": ["patch"],
            "resourceNames": ["demo-elector-operator"],
        },
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
    ]
    for binding in [d for d in hooks(docs) if d["kind"] == "RoleBinding"]:
        assert binding["roleRef"]["name"] in (HOOK, f"{HOOK}-stop")
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": HOOK, "namespace": NAMESPACE}]
    job = one(docs, "Job")
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == HOOK and pod["restartPolicy"] == "Never"
    (container,) = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["NAMESPACES"] == "apps jobs" and env["LABEL_SELECTOR"] == "team=a"
    assert (env["RELEASE"], env["RELEASE_NAMESPACE"]) == ("demo", NAMESPACE)
    assert env["OPERATOR_DEPLOYMENT"] == one(docs, "Deployment")["metadata"]["name"]
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert dict(term.split("=") for term in env["OPERATOR_SELECTOR"].split(",")).items() <= pod_labels.items()
    # the finalizer the operator's kopf puts on each LeaderElection
    settings = kopf.OperatorSettings()
    configure_settings(settings)
    assert env["FINALIZER"] == settings.persistence.finalizer
    assert env["TIMEOUT_SECONDS"] == "120"
    assert job["spec"]["activeDeadlineSeconds"] > 120
    # the operator's image has Python 3: the script is the chart's file, mounted from the hook's ConfigMap
    assert container["image"] == one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"]
    assert container["command"] == ["python3", "/etc/elector/hook/pre-delete.py"]
    config_map = one(docs, "ConfigMap")
    assert config_map["data"]["pre-delete.py"] == (OPERATOR_CHART_DIR / "files" / "pre-delete.py").read_text()
    cluster_wide = render_operator({"clusterWide": True})
    (cluster_role,) = [d for d in hooks(cluster_wide) if d["kind"] == "ClusterRole"]
    assert cluster_role["rules"][0]["verbs"] == ["get", "list", "patch", "delete"]
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

FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"
SCALE = "/apis/apps/v1/namespaces/apps/deployments/demo-elector-operator/scale"


@dataclass
class FakeApi:
    """LeaderElections behind finalizers (a DELETE sets deletionTimestamp; the object goes with its last
    finalizer), merge patches checked against resourceVersion (409), and the operator's pods, which go
    `pods_linger` looks after the Deployment was scaled to 0 (never, with None)."""

    objects: dict[tuple[str, str], Doc] = field(default_factory=dict)
    requests: list[tuple[str, str, dict[str, list[str]], str]] = field(default_factory=list)
    missing_resource: bool = False
    scaled: bool = False
    pods_linger: int | None = 2
    #: resourceVersions bumped behind the hook's back once (a concurrent writer): one 409 each
    conflict_once: set[str] = field(default_factory=set)
    _versions: Any = field(default_factory=lambda: iter(range(100, 10_000)))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(
        self,
        namespace: str,
        name: str,
        *,
        release: tuple[str, str] | None = None,
        finalizers: tuple[str, ...] = (FINALIZER,),
        **labels: str,
    ) -> None:
        annotations = {}
        if release is not None:
            annotations = {
                "meta.helm.sh/release-name": release[0],
                "meta.helm.sh/release-namespace": release[1],
            }
        self.objects[namespace, name] = {
            "metadata": {
                "namespace": namespace,
                "name": name,
                "labels": labels,
                "annotations": annotations,
                "finalizers": list(finalizers),
                "resourceVersion": str(next(self._versions)),
            }
        }

    def handle(self, method: str, raw_path: str, authorization: str, body: Doc | None) -> tuple[int, Doc]:
        url = urlsplit(raw_path)
        query = parse_qs(url.query)
        parts = url.path.strip("/").split("/")
        with self._lock:
            self.requests.append((method, url.path, query, authorization))
            if url.path == SCALE and method == "PATCH":
                assert body == {"spec": {"replicas": 0}}, body
                self.scaled = True
                return 200, {"kind": "Scale", "spec": {"replicas": 0}}
            if url.path == "/api/v1/namespaces/apps/pods" and method == "GET":
                assert query["labelSelector"][0].startswith("app.kubernetes.io/"), query
                if self.scaled and self.pods_linger is not None:
                    self.pods_linger -= 1
                    if self.pods_linger < 0:
                        return 200, {"items": []}
                return 200, {
                    "items": [{"metadata": {"namespace": "apps", "name": "demo-elector-operator-0"}}]
                }
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
            if len(rest) == 4 and rest[0] == "namespaces" and rest[2] == "leaderelections":
                return self._one(method, (rest[1], rest[3]), body)
            return 405, {"kind": "Status", "code": 405}

    def _one(self, method: str, key: tuple[str, str], body: Doc | None) -> tuple[int, Doc]:
        obj = self.objects.get(key)
        if obj is None:
            return 404, {"kind": "Status", "code": 404}
        meta = obj["metadata"]
        if method == "GET":
            return 200, obj
        if method == "DELETE":
            if meta["finalizers"]:
                meta["deletionTimestamp"] = "2030-01-01T00:00:00Z"
                meta["resourceVersion"] = str(next(self._versions))
            else:
                del self.objects[key]
            return 200, obj
        if method == "PATCH":
            assert not (FINALIZER in meta["finalizers"] and not self.scaled), (
                "finalizer removed while running"
            )
            sent = (body or {}).get("metadata") or {}
            if meta["resourceVersion"] in self.conflict_once:
                self.conflict_once.discard(meta["resourceVersion"])
                meta["resourceVersion"] = str(next(self._versions))
            if sent.get("resourceVersion") != meta["resourceVersion"]:
                return 409, {"kind": "Status", "code": 409, "reason": "Conflict"}
            meta["finalizers"] = list(sent["finalizers"])
            meta["resourceVersion"] = str(next(self._versions))
            if meta.get("deletionTimestamp") and not meta["finalizers"]:
                del self.objects[key]
            return 200, obj
        return 405, {"kind": "Status", "code": 405}

    def _list(self, namespace: str | None, selector: str) -> list[Doc]:
        wanted = dict(term.split("=", 1) for term in selector.split(",") if term)
        return [
            copy.deepcopy(obj)
            for (ns, _), obj in sorted(self.objects.items())
            if namespace in (None, ns) and wanted.items() <= obj["metadata"]["labels"].items()
        ]

    def deleted(self) -> list[str]:
        return [path.rsplit("/", 1)[1] for method, path, _, _ in self.requests if method == "DELETE"]

    def finalizers(self, namespace: str, name: str) -> list[str]:
        return list(self.objects[namespace, name]["metadata"]["finalizers"])

    def first(self, method: str, path_part: str) -> int:
        return next(i for i, (m, path, _, _) in enumerate(self.requests) if m == method and path_part in path)


@pytest.fixture
def api() -> Iterator[tuple[FakeApi, str]]:
    fake = FakeApi()

    class Handler(BaseHTTPRequestHandler):
        def _reply(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            status, answer = fake.handle(self.command, self.path, self.headers.get("Authorization", ""), body)
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_DELETE = do_PATCH = _reply

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


def test_the_hook_deletes_only_its_release_s_leader_elections_and_lets_go_of_the_rest(
    api: tuple[FakeApi, str], tmp_path: Path
) -> None:
    """It deleted every LeaderElection of the watched namespaces: the elector chart's, another team's."""
    fake, url = api
    fake.add("apps", "ours", release=("demo", "apps"))
    fake.add("apps", "jobs-elector", release=("jobs", "apps"))  # the elector chart's release "jobs"
    fake.add("apps", "same-name-elsewhere", release=("demo", "team-b"))  # release "demo" of team-b
    fake.add("jobs", "nightly")  # kubectl apply
    fake.add("other", "not-watched")
    result = run_hook(tmp_path, url, {"namespaces": ["apps", "jobs"]})
    assert result.returncode == 0, result.stderr
    assert fake.deleted() == ["ours"]
    assert sorted(fake.objects) == [
        ("apps", "jobs-elector"),
        ("apps", "same-name-elsewhere"),
        ("jobs", "nightly"),
        ("other", "not-watched"),
    ]
    # the others stay, without the operator's finalizer: deleting one later does not hang
    for key in [("apps", "jobs-elector"), ("apps", "same-name-elsewhere"), ("jobs", "nightly")]:
        assert fake.finalizers(*key) == []
    assert fake.finalizers("other", "not-watched") == [FINALIZER]  # not this operator's
    # the operator was stopped, and its pods gone, before any finalizer was touched
    assert fake.first("PATCH", "/scale") < fake.first("PATCH", "/leaderelections/")
    assert fake.scaled and fake.pods_linger is not None and fake.pods_linger < 0
    assert {auth for *_, auth in fake.requests} == {"Bearer hook-token"}
    assert "deleting LeaderElection apps/ours" in result.stdout


def test_the_hook_keeps_other_finalizers_and_retries_a_conflict(
    api: tuple[FakeApi, str], tmp_path: Path
) -> None:
    fake, url = api
    fake.add("apps", "shared", finalizers=("example.com/audit", FINALIZER))
    fake.conflict_once.add(fake.objects["apps", "shared"]["metadata"]["resourceVersion"])
    result = run_hook(tmp_path, url)
    assert result.returncode == 0, result.stderr
    assert fake.finalizers("apps", "shared") == ["example.com/audit"]
    assert [m for m, path, *_ in fake.requests if path.endswith("/shared")].count("PATCH") == 2


def test_a_label_selector_also_deletes_what_it_names(api: tuple[FakeApi, str], tmp_path: Path) -> None:
    fake, url = api
    fake.add("apps", "ours", team="a")
    fake.add("apps", "theirs", team="b")
    result = run_hook(tmp_path, url, {"preDeleteHook": {"labelSelector": "team=a"}})
    assert result.returncode == 0, result.stderr
    assert fake.deleted() == ["ours"] and list(fake.objects) == [("apps", "theirs")]
    assert fake.finalizers("apps", "theirs") == []


def test_the_cluster_wide_hook_lists_every_namespace(api: tuple[FakeApi, str], tmp_path: Path) -> None:
    fake, url = api
    fake.add("apps", "a", release=("demo", "apps"))
    fake.add("far", "b")
    result = run_hook(tmp_path, url, {"clusterWide": True})
    assert result.returncode == 0, result.stderr
    assert list(fake.objects) == [("far", "b")] and fake.finalizers("far", "b") == []
    lists = {path for method, path, q, _ in fake.requests if method == "GET" and "limit" in q}
    assert "/apis/elector.io/v1alpha1/leaderelections" in lists
    assert not [p for p in lists if p.startswith("/apis/elector.io/v1alpha1/namespaces/")]


def test_the_hook_fails_and_says_why_when_the_operator_does_not_stop(
    api: tuple[FakeApi, str], tmp_path: Path
) -> None:
    fake, url = api
    fake.pods_linger = None  # the pods never go
    fake.add("apps", "ours", release=("demo", "apps"))
    result = run_hook(tmp_path, url, TIMEOUT_SECONDS="0.5")
    assert result.returncode == 1
    assert "operator pods still there after 0.5s: apps/demo-elector-operator-0" in result.stderr
    assert fake.finalizers("apps", "ours") == [FINALIZER] and not fake.deleted()  # nothing touched


def test_the_hook_fails_and_says_why_when_another_finalizer_holds_its_own(
    api: tuple[FakeApi, str], tmp_path: Path
) -> None:
    fake, url = api
    fake.add("apps", "stuck", release=("demo", "apps"), finalizers=("example.com/keep",))
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
    assert result.returncode == 1 and "pre-delete: PATCH" in result.stderr
