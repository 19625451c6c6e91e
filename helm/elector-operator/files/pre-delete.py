"""Pre-delete hook of the elector-operator chart: delete the LeaderElections this operator serves and wait
until they are gone, while the operator still runs and removes kopf's finalizer from each.

Without it, `helm uninstall` deletes the operator first and every LeaderElection stays Terminating (and
so does its namespace). Standard library only: it runs in elector's image (or any Python 3 image) with
the Job's service account token. Settings, from the environment:

  NAMESPACES        space-separated namespaces, or "*" for every namespace
  LABEL_SELECTOR    only the LeaderElections matching it (empty: all)
  TIMEOUT_SECONDS   how long to wait until they are gone (default 120)
  POLL_SECONDS      time between two looks (default 2)
  KUBE_API_URL      the API server (default https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)
  SERVICE_ACCOUNT_DIR  where token and ca.crt are (default the pod's service account mount)

Exit status 0 when none is left, 1 when some are still there at the timeout or the API refuses.
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


class ApiError(Exception):
    pass


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

    def request(self, method: str, path: str) -> dict | None:
        """The JSON reply, or None for a 404."""
        headers = {"Accept": "application/json"}
        token_file = os.path.join(self.account, "token")
        if os.path.exists(token_file):  # read at each request: projected tokens are rotated
            with open(token_file, encoding="utf-8") as handle:
                headers["Authorization"] = "Bearer " + handle.read().strip()
        request = urllib.request.Request(self.base + path, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30, context=self.context) as response:
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            detail = exc.read()[:300].decode(errors="replace")
            raise ApiError(f"{method} {path}: HTTP {exc.code} {detail}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise ApiError(f"{method} {path}: {exc}") from None


def collection(namespace: str) -> str:
    if namespace == "*":
        return f"{API}/{PLURAL}"
    return f"{API}/namespaces/{urllib.parse.quote(namespace)}/{PLURAL}"


def list_elections(client: Client, namespace: str, selector: str) -> list[dict]:
    """Every LeaderElection in the namespace ("*": all) matching the selector; none without the CRD."""
    items: list[dict] = []
    token = ""
    while True:
        query = {"limit": "500"}
        if selector:
            query["labelSelector"] = selector
        if token:
            query["continue"] = token
        reply = client.request("GET", collection(namespace) + "?" + urllib.parse.urlencode(query))
        if reply is None:  # no such resource: the CRD is gone, so is every LeaderElection
            return items
        items.extend(reply.get("items") or [])
        token = (reply.get("metadata") or {}).get("continue") or ""
        if not token:
            return items


def name_of(item: dict) -> str:
    meta = item.get("metadata") or {}
    return f"{meta.get('namespace', '?')}/{meta.get('name', '?')}"


def main() -> int:
    namespaces = os.environ.get("NAMESPACES", "").split()
    selector = os.environ.get("LABEL_SELECTOR", "").strip()
    timeout = float(os.environ.get("TIMEOUT_SECONDS") or 120)
    poll = float(os.environ.get("POLL_SECONDS") or 2)
    if not namespaces:
        print("pre-delete: NAMESPACES is empty: nothing to do", flush=True)
        return 0
    client = Client()
    deadline = time.monotonic() + timeout
    last_report = 0.0
    try:
        while True:
            left = [item for ns in namespaces for item in list_elections(client, ns, selector)]
            if not left:
                print("pre-delete: no LeaderElection left", flush=True)
                return 0
            for item in left:
                meta = item.get("metadata") or {}
                if meta.get("deletionTimestamp"):
                    continue  # already being deleted: the operator removes its finalizer
                print(f"pre-delete: deleting LeaderElection {name_of(item)}", flush=True)
                path = f"{collection(meta['namespace'])}/{urllib.parse.quote(meta['name'])}"
                client.request("DELETE", path)
            now = time.monotonic()
            if now >= deadline:
                names = " ".join(sorted(name_of(item) for item in left))
                print(
                    f"pre-delete: still there after {timeout:g}s: {names}. Is the operator running? "
                    "`kubectl get pods -l app.kubernetes.io/component=operator`; to give up on one: "
                    "kubectl -n NAMESPACE patch leaderelection NAME --type merge "
                    '-p \'{"metadata":{"finalizers":[]}}\'',
                    file=sys.stderr,
                    flush=True,
                )
                return 1
            if now - last_report >= 10:
                print(f"pre-delete: waiting for {len(left)} LeaderElection(s) to go", flush=True)
                last_report = now
            time.sleep(min(poll, max(deadline - now, 0.0)))
    except ApiError as exc:
        print(f"pre-delete: {exc}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
