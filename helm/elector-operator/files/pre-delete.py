"""Pre-delete hook of the elector-operator chart: stop the operator, let go of every LeaderElection it served
(its finalizer), and delete only the LeaderElections of this release.

Without it, `helm uninstall` deletes the operator and leaves kopf's finalizer on every LeaderElection it
served: deleting one later hangs (and so does its namespace). Deleting them all instead, as this hook once
did, deleted other releases' LeaderElections (the elector chart's, another team's). So:

  1. the operator's Deployment is scaled to 0 and its pods are waited for, so that no replica puts the
     finalizer back;
  2. the finalizer is removed from every LeaderElection of the watched namespaces (they stay, unserved;
     another operator that serves them puts its own back);
  3. the LeaderElections of this release are deleted (Helm's release annotations name it), and those
     matching LABEL_SELECTOR when one is set; the hook waits until they are gone.

Standard library only: it runs in elector's image (or any Python 3 image) with the Job's service account
token. Settings, from the environment:

  NAMESPACES          space-separated namespaces, or "*" for every namespace
  RELEASE, RELEASE_NAMESPACE   the Helm release (its objects carry meta.helm.sh/release-name/-namespace)
  OPERATOR_DEPLOYMENT the operator's Deployment, in RELEASE_NAMESPACE
  OPERATOR_SELECTOR   the label selector of the operator's pods
  FINALIZER           the operator's finalizer (kopf's)
  LABEL_SELECTOR      also delete the LeaderElections matching it (empty: only the release's own)
  TIMEOUT_SECONDS     how long to wait for each step (default 120)
  POLL_SECONDS        time between two looks (default 2)
  KUBE_API_URL        the API server (default https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)
  SERVICE_ACCOUNT_DIR where token and ca.crt are (default the pod's service account mount)

Exit status 0 when done, 1 when a step timed out or the API refused.
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

API = "/apis/elector.io/v1alpha1"
PLURAL = "leaderelections"
RELEASE_NAME_ANNOTATION = "meta.helm.sh/release-name"
RELEASE_NAMESPACE_ANNOTATION = "meta.helm.sh/release-namespace"


class ApiError(Exception):
    def __init__(self, message: str, *, code: int = 0) -> None:
        super().__init__(message)
        self.code = code


class Client:
    def __init__(self) -> None:
        host = os.environ.get("KUBERNETES_SERVICE_HOST", "kubernetes.default.svc")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if ":" in host:  # an IPv6 address
            host = f"[{host}]"
        self.base = os.environ.get("KUBE_API_URL") or f"https://{host}:{port}"
        self.account = os.environ.get("SERVICE_ACCOUNT_DIR", "/var/run/secrets/kubernetes.io/serviceaccount")
        self.context: ssl.SSLContext | None = None
        if self.base.startswith("https:"):
            ca = os.path.join(self.account, "ca.crt")
            self.context = ssl.create_default_context(cafile=ca if os.path.exists(ca) else None)

    def request(self, method: str, path: str, body: dict | None = None) -> dict | None:
        """The JSON reply, or None for a 404."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/merge-patch+json"
        token_file = os.path.join(self.account, "token")
        if os.path.exists(token_file):  # read at each request: projected tokens are rotated
            with open(token_file, encoding="utf-8") as handle:
                headers["Authorization"] = "Bearer " + handle.read().strip()
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30, context=self.context) as response:
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            detail = exc.read()[:300].decode(errors="replace")
            raise ApiError(f"{method} {path}: HTTP {exc.code} {detail}", code=exc.code) from None
        except (urllib.error.URLError, OSError) as exc:
            raise ApiError(f"{method} {path}: {exc}") from None

    def list(self, path: str, selector: str = "") -> list[dict] | None:
        """Every item of a collection (pages of 500); None when the resource does not exist."""
        items: list[dict] = []
        token = ""
        while True:
            query = {"limit": "500"}
            if selector:
                query["labelSelector"] = selector
            if token:
                query["continue"] = token
            reply = self.request("GET", path + "?" + urllib.parse.urlencode(query))
            if reply is None:
                return None
            items.extend(reply.get("items") or [])
            token = (reply.get("metadata") or {}).get("continue") or ""
            if not token:
                return items


def collection(namespace: str) -> str:
    if namespace == "*":
        return f"{API}/{PLURAL}"
    return f"{API}/namespaces/{urllib.parse.quote(namespace)}/{PLURAL}"


def object_path(item: dict) -> str:
    meta = item.get("metadata") or {}
    return f"{collection(meta['namespace'])}/{urllib.parse.quote(meta['name'])}"


def name_of(item: dict) -> str:
    meta = item.get("metadata") or {}
    return f"{meta.get('namespace', '?')}/{meta.get('name', '?')}"


def say(text: str) -> None:
    print(f"pre-delete: {text}", flush=True)


class Hook:
    def __init__(self, client: Client, environ: dict[str, str]) -> None:
        self.client = client
        self.namespaces = environ.get("NAMESPACES", "").split()
        self.release = environ.get("RELEASE", "")
        self.release_namespace = environ.get("RELEASE_NAMESPACE", "")
        self.deployment = environ.get("OPERATOR_DEPLOYMENT", "")
        self.operator_selector = environ.get("OPERATOR_SELECTOR", "")
        self.finalizer = environ.get("FINALIZER", "kopf.zalando.org/KopfFinalizerMarker")
        self.selector = environ.get("LABEL_SELECTOR", "").strip()
        self.timeout = float(environ.get("TIMEOUT_SECONDS") or 120)
        self.poll = float(environ.get("POLL_SECONDS") or 2)

    def run(self) -> int:
        if self.deployment and not self.stop_operator():
            return 1
        if not self.namespaces:
            say("NAMESPACES is empty: no LeaderElection to let go of")
            return 0
        doomed = self.release_elections()
        return 0 if self.wait_gone(doomed) else 1

    # -- 1. no operator replica left to put the finalizer back --------------------------------------

    def stop_operator(self) -> bool:
        namespace = urllib.parse.quote(self.release_namespace)
        deployment = urllib.parse.quote(self.deployment)
        scale = f"/apis/apps/v1/namespaces/{namespace}/deployments/{deployment}/scale"
        if self.client.request("PATCH", scale, {"spec": {"replicas": 0}}) is not None:
            say(f"scaled Deployment {self.deployment} to 0")
        pods = f"/api/v1/namespaces/{namespace}/pods"
        deadline = time.monotonic() + self.timeout
        while True:
            left = self.client.list(pods, self.operator_selector) or []
            if not left:
                say("no operator pod left")
                return True
            if time.monotonic() >= deadline:
                names = " ".join(sorted(name_of(pod) for pod in left))
                message = f"operator pods still there after {self.timeout:g}s: {names}"
                print(f"pre-delete: {message}", file=sys.stderr, flush=True)
                return False
            time.sleep(self.poll)

    # -- 2. and 3. let go of every LeaderElection, delete the release's own ---------------------------

    def owned(self, item: dict) -> bool:
        annotations = (item.get("metadata") or {}).get("annotations") or {}
        return (
            bool(self.release)
            and annotations.get(RELEASE_NAME_ANNOTATION) == self.release
            and annotations.get(RELEASE_NAMESPACE_ANNOTATION) == self.release_namespace
        )

    def elections(self, selector: str = "") -> list[dict]:
        found: list[dict] = []
        for namespace in self.namespaces:
            found.extend(self.client.list(collection(namespace), selector) or [])  # None: no CRD
        return found

    def release_elections(self) -> set[str]:
        """Remove the finalizer from every LeaderElection, delete this release's (and LABEL_SELECTOR's);
        the paths of those deleted."""
        chosen = {object_path(item) for item in self.elections(self.selector)} if self.selector else set()
        doomed: set[str] = set()
        for item in self.elections():
            path = object_path(item)
            self.let_go(item)
            if self.owned(item) or path in chosen:
                if not (item.get("metadata") or {}).get("deletionTimestamp"):
                    say(f"deleting LeaderElection {name_of(item)}")
                    self.client.request("DELETE", path)
                doomed.add(path)
        kept = "" if not doomed else f"; deleted {len(doomed)} of this release"
        say(f"no operator holds a LeaderElection of {' '.join(self.namespaces)} any more{kept}")
        return doomed

    def let_go(self, item: dict) -> None:
        """Remove the operator's finalizer (with the resourceVersion read: a conflict reads it again)."""
        path = object_path(item)
        for _ in range(5):
            meta = item.get("metadata") or {}
            finalizers = meta.get("finalizers") or []
            if self.finalizer not in finalizers:
                return
            rest = [f for f in finalizers if f != self.finalizer]
            patch = {"metadata": {"finalizers": rest, "resourceVersion": meta.get("resourceVersion")}}
            try:
                self.client.request("PATCH", path, patch)
                return
            except ApiError as exc:
                if exc.code != 409:
                    raise
            fresh = self.client.request("GET", path)
            if fresh is None:
                return  # gone meanwhile
            item = fresh
        raise ApiError(f"PATCH {path}: conflicts kept coming")

    def wait_gone(self, doomed: set[str]) -> bool:
        deadline = time.monotonic() + self.timeout
        while doomed:
            doomed = {path for path in doomed if self.client.request("GET", path) is not None}
            if not doomed:
                break
            if time.monotonic() >= deadline:
                parts = (path.split("/") for path in doomed)  # .../namespaces/NS/leaderelections/NAME
                names = " ".join(sorted(f"{p[-3]}/{p[-1]}" for p in parts))
                print(
                    f"pre-delete: still there after {self.timeout:g}s: {names}. Another finalizer holds "
                    "them (kubectl get leaderelection -o yaml); to give up on one: "
                    "kubectl -n NAMESPACE patch leaderelection NAME --type merge "
                    '-p \'{"metadata":{"finalizers":[]}}\'',
                    file=sys.stderr,
                    flush=True,
                )
                return False
            time.sleep(min(self.poll, max(deadline - time.monotonic(), 0.0)))
        say("done")
        return True


def main() -> int:
    try:
        return Hook(Client(), dict(os.environ)).run()
    except ApiError as exc:
        print(f"pre-delete: {exc}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
