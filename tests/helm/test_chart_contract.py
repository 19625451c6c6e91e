"""Contract between the chart and the daemon: what the chart passes exists in `elector run --help`, and a
real daemon configured only from the rendered container's env answers the probes the chart declares."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from helm_python.chart import Chart
from helm_python.errors import HelmValuesError
from support.seed import seed_used_lock

from elector.backend.lua.lease import LockKeys
from elector.daemon.http import HttpSettings
from elector.testing.redis_server import RedisServerProcess, free_tcp_port

Render = Callable[[dict[str, Any]], list[dict[str, Any]]]

OPTIONAL = {"elector": {"renewInterval": "1s", "renewDeadline": "2s", "requestTimeout": "200ms", "ttl": "3s"}}
#: Every value that becomes an ELECTOR_* variable of the sidecar, set.
EVERY_SETTING = {
    "elector": {
        **OPTIONAL["elector"],
        "redis": {
            "url": "rediss+sentinel://s1:26379,s2:26379/mymaster/0",
            "existingSecret": "redis-auth",
            "tls": {"existingSecret": "redis-tls"},
        },
        "priority": 5,
        "leaderFile": "/var/run/elector/leader.json",
        "minReplicasAck": 1,
        "replicasAckTimeout": "100ms",
        "leaderElectorCompat": {"enabled": True},
    }
}


@pytest.fixture(scope="module")
def run_help() -> str:
    result = subprocess.run(
        [sys.executable, "-m", "elector", "run", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return result.stdout


def sidecar(docs: list[dict[str, Any]]) -> dict[str, Any]:
    pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    return next(c for c in pod["containers"] if c["name"] == "elector")


def help_env_vars(help_text: str) -> set[str]:
    flat = " ".join(help_text.split())
    return set(re.findall(r"env var: (ELECTOR_[A-Z_]+)", flat))


def test_every_env_var_exists_in_run_help(render: Render, run_help: str) -> None:
    env_names = {e["name"] for e in sidecar(render(EVERY_SETTING))["env"]}
    known = help_env_vars(run_help)
    assert "ELECTOR_LOCK" in known  # the parser works
    elector_vars = {n for n in env_names if n.startswith("ELECTOR_")}
    assert elector_vars == {
        "ELECTOR_REDIS_URL",
        "ELECTOR_LOCK",
        "ELECTOR_TTL",
        "ELECTOR_HTTP_ADDRESS",
        "ELECTOR_LOG_FORMAT",
        "ELECTOR_LOG_LEVEL",
        "ELECTOR_RENEW_INTERVAL",
        "ELECTOR_RENEW_DEADLINE",
        "ELECTOR_REQUEST_TIMEOUT",
        "ELECTOR_REDIS_PASSWORD_FILE",
        "ELECTOR_REDIS_TLS_CA",
        "ELECTOR_REDIS_TLS_CERT",
        "ELECTOR_REDIS_TLS_KEY",
        "ELECTOR_PRIORITY",
        "ELECTOR_LEADER_FILE",
        "ELECTOR_MIN_REPLICAS_ACK",
        "ELECTOR_REPLICAS_ACK_TIMEOUT",
        "ELECTOR_COMPAT_HTTP_ADDRESS",
        "ELECTOR_PREDECESSOR_LOCK",
    }
    assert elector_vars <= known, elector_vars - known
    # the only other variable is the identity, which the daemon reads from $POD_NAME
    assert env_names - elector_vars == {"POD_NAME"}
    assert "$POD_NAME" in run_help


def test_args_are_a_real_subcommand(render: Render) -> None:
    from elector.cli.main import cli

    assert sidecar(render({}))["args"][0] in cli.commands


def test_port_is_passed_explicitly_and_is_not_8080(render: Render, run_help: str) -> None:
    """The sidecar's port is not the daemon's own default (8080, the most common application port: two
    containers of a pod cannot both bind it), so the chart must pass it in ELECTOR_HTTP_ADDRESS."""
    container = sidecar(render({}))
    env = {e["name"]: e.get("value") for e in container["env"]}
    port = container["ports"][0]["containerPort"]
    assert env["ELECTOR_HTTP_ADDRESS"] == f"0.0.0.0:{port}"
    assert port != 8080 and HttpSettings().port == 8080
    assert "default: 0.0.0.0:8080" in " ".join(run_help.split())


def test_log_settings_are_accepted_choices(render: Render, run_help: str) -> None:
    flat = " ".join(run_help.split())
    env = {e["name"]: e.get("value") for e in sidecar(render({}))["env"]}
    assert env["ELECTOR_LOG_FORMAT"] in re.search(r"--log-format \[([a-z|]+)\]", flat).group(1).split("|")  # type: ignore[union-attr]
    assert env["ELECTOR_LOG_LEVEL"] in re.search(r"--log-level \[([a-z|]+)\]", flat).group(1).split("|")  # type: ignore[union-attr]


class Sidecar:
    """A real `python -m elector run` started with the rendered container's args and env only."""

    def __init__(
        self,
        container: dict[str, Any],
        *,
        redis_url: str,
        pod_name: str,
        log_dir: Path,
        overrides: dict[str, str] | None = None,
    ) -> None:
        self.port = free_tcp_port()
        env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        assert container["env"][0] == {
            "name": "POD_NAME",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
        }
        env["POD_NAME"] = pod_name  # what the downward API provides
        env["ELECTOR_REDIS_URL"] = redis_url  # the test's own redis-server
        env["ELECTOR_HTTP_ADDRESS"] = f"127.0.0.1:{self.port}"  # a free port instead of the pod's
        env |= overrides or {}  # paths of volumes the kubelet would mount
        self.log = (log_dir / f"{pod_name}.log").open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "elector", *container["args"]],
            env={k: v for k, v in os.environ.items() if not k.startswith("ELECTOR_")} | env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def get(self, path: str, *, timeout_s: float = 1.0) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=timeout_s) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return 0

    def wait_for(self, path: str, status: int, timeout_s: float = 30.0) -> None:
        # A bound on a hang, not a latency: 10 s ran out at load 11 (`make test-loaded`).
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.get(path) == status:
                return
            assert self.process.poll() is None, f"sidecar exited {self.process.returncode}"
            time.sleep(0.02)
        raise AssertionError(f"{path} did not answer {status} within {timeout_s}s")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
        self.log.close()


@pytest.fixture
def start_sidecar(redis_url: str, tmp_path: Path) -> Iterator[Any]:
    started: list[Sidecar] = []

    def _start(container: dict[str, Any], pod_name: str, overrides: dict[str, str] | None = None) -> Sidecar:
        started.append(
            Sidecar(container, redis_url=redis_url, pod_name=pod_name, log_dir=tmp_path, overrides=overrides)
        )
        return started[-1]

    yield _start
    for process in started:
        process.stop()


def test_rendered_sidecar_answers_its_probes(render: Render, redis_url: str, start_sidecar: Any) -> None:
    container = sidecar(render(OPTIONAL))
    lock = {e["name"]: e.get("value") for e in container["env"]}["ELECTOR_LOCK"]
    client = redis.Redis.from_url(redis_url)
    seed_used_lock(client, lock)
    leader = start_sidecar(container, "demo-elector-0")
    leader.wait_for("/leader", 200)
    follower = start_sidecar(container, "demo-elector-1")
    for probe in (container["livenessProbe"], container["readinessProbe"]):
        path = probe["httpGet"]["path"]
        assert probe["httpGet"]["port"] == "elector-http" == container["ports"][0]["name"]
        leader.wait_for(path, 200)
        follower.wait_for(path, 200)  # /healthz: followers are ready too (rollout-safe)
    follower.wait_for("/leader", 503)
    # the identity is $POD_NAME: the lock holds the leader's pod name
    assert b"demo-elector-0" in (client.get(LockKeys(lock).lease) or b"")


def test_gated_readiness_makes_only_the_leader_ready(
    render: Render, redis_url: str, start_sidecar: Any
) -> None:
    gated = {
        "elector": {**OPTIONAL["elector"], "gateOnLeadership": True},
        "podDisruptionBudget": {"enabled": False},
    }
    container = sidecar(render(gated))
    path = container["readinessProbe"]["httpGet"]["path"]
    lock = {e["name"]: e.get("value") for e in container["env"]}["ELECTOR_LOCK"]
    seed_used_lock(redis.Redis.from_url(redis_url), lock)
    leader = start_sidecar(container, "demo-elector-0")
    leader.wait_for(path, 200)
    follower = start_sidecar(container, "demo-elector-1")
    follower.wait_for("/readyz", 200)
    assert follower.get(path) == 503  # the trade-off documented in values.yaml and NOTES.txt


def kubelet_ready(sidecar: Sidecar, probe: dict[str, Any]) -> bool:
    """One readiness probe as the kubelet runs it: HTTP GET of the probe's path, success is 200-399 within
    timeoutSeconds (a refused connection or a timeout is a failure)."""
    assert probe["httpGet"]["port"] == "elector-http"
    status = sidecar.get(probe["httpGet"]["path"], timeout_s=float(probe.get("timeoutSeconds", 1)))
    return 200 <= status < 400


@pytest.mark.parametrize("outage", ["stopped", "killed"])
def test_default_readiness_survives_a_redis_outage_of_three_ttls(
    render: Render, redis_server: RedisServerProcess, start_sidecar: Any, outage: str
) -> None:
    """The pod of the default values stays ready through a Redis outage of 3 ttl: its readiness probe
    is the one rendered from the defaults (only the ttl differs, to keep the test short; the probe's
    path and port do not depend on it), probed the way the kubelet does all along. /readyz, the old
    default, turns 503 in the same outage: the outage was real."""
    assert sidecar(render({}))["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "elector-http"}
    container = sidecar(render({"elector": {"ttl": "2s"}}))
    probe = container["readinessProbe"]
    assert probe["httpGet"] == sidecar(render({}))["readinessProbe"]["httpGet"]
    ttl_s = 2.0
    lock = {e["name"]: e.get("value") for e in container["env"]}["ELECTOR_LOCK"]
    seed_used_lock(redis.Redis.from_url(redis_server.url), lock)
    pods = [start_sidecar(container, f"demo-elector-{index}") for index in range(2)]
    for pod in pods:
        pod.wait_for("/readyz", 200, timeout_s=30)
    assert all(kubelet_ready(pod, probe) for pod in pods)

    if outage == "stopped":
        redis_server.pause()  # connections stay open and silent: every request times out
    else:
        redis_server.kill()  # connections refused
    unready_seen = False
    outage_ends = time.monotonic() + 3 * ttl_s
    try:
        while time.monotonic() < outage_ends:
            for pod in pods:
                assert pod.process.poll() is None, f"the sidecar exited {pod.process.returncode}"
                assert kubelet_ready(pod, probe), f"{probe['httpGet']['path']} failed during the Redis outage"
            unready_seen = unready_seen or all(pod.get("/readyz") == 503 for pod in pods)
            time.sleep(0.1)
    finally:
        if outage == "stopped":
            redis_server.resume()
        else:
            redis_server.start()
    assert unready_seen, "/readyz never failed: the outage did not reach the daemons"
    assert all(kubelet_ready(pod, probe) for pod in pods)
    if outage == "killed":  # an empty Redis: the lock is gone, the daemons contend again
        seed_used_lock(redis.Redis.from_url(redis_server.url), lock)
    deadline = time.monotonic() + 10 * ttl_s
    while sum(pod.get("/leader") == 200 for pod in pods) != 1:
        assert time.monotonic() < deadline, "no single leader after Redis came back"
        time.sleep(0.05)


def test_the_leader_service_follows_the_leader_on_a_real_pair(
    render: Render, redis_url: str, start_sidecar: Any
) -> None:
    """The leader Service selects the label elector.io/leader=true, which the operator sets on the pod
    whose name is the lock's holder (the rendered LeaderElection names the sidecars' own lock and
    selects their pods). On a real pair: the holder in Redis is always the pod whose /leader answers 200,
    and when that pod stops, the holder becomes the other pod, which the operator relabels."""
    docs = render({"elector": {**OPTIONAL["elector"]}, "leaderElection": {"enabled": True}})
    container = sidecar(docs)
    env = {e["name"]: e.get("value") for e in container["env"]}
    (election,) = [d for d in docs if d["kind"] == "LeaderElection"]
    (service,) = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"].endswith("-leader")]
    pod_labels = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert election["spec"]["lock"] == env["ELECTOR_LOCK"]
    assert election["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    leader_label = election["spec"].get("leaderLabel", "elector.io/leader")
    wanted = {**election["spec"]["selector"]["matchLabels"], leader_label: "true"}
    assert service["spec"]["selector"] == wanted
    client = redis.Redis.from_url(redis_url)
    seed_used_lock(client, env["ELECTOR_LOCK"])
    pods = {"demo-elector-a": start_sidecar(container, "demo-elector-a")}
    pods["demo-elector-a"].wait_for("/leader", 200)
    pods["demo-elector-b"] = start_sidecar(container, "demo-elector-b")
    pods["demo-elector-b"].wait_for("/readyz", 200)
    assert pods["demo-elector-b"].get("/leader") == 503

    def holder() -> str:
        value = client.get(LockKeys(env["ELECTOR_LOCK"]).lease) or b""
        return next((name for name in pods if name.encode() in value), "")

    assert holder() == "demo-elector-a"
    # the follower is ready too: the Service, not readiness, picks the leader
    assert all(kubelet_ready(pod, container["readinessProbe"]) for pod in pods.values())
    pods["demo-elector-a"].stop()
    pods["demo-elector-b"].wait_for("/leader", 200, timeout_s=30)
    assert holder() == "demo-elector-b"


def test_the_helm_test_hook_passes_on_a_healthy_pair_and_fails_without_a_leader(
    render: Render, redis_server: RedisServerProcess, start_sidecar: Any
) -> None:
    """`helm test`'s Pod runs its rendered script against two real sidecars (their addresses instead of
    the metrics Service's DNS): ok with one leader and one follower; a failure naming the problem when
    Redis is gone (no replica leads)."""
    docs = render({"elector": {"ttl": "2s"}, "workload": {"replicaCount": 2}})
    (pod,) = [d for d in docs if d["kind"] == "Pod"]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    (check,) = pod["spec"]["containers"]
    assert check["command"] == ["python3", "-c"]
    env = {e["name"]: e["value"] for e in check["env"]}
    assert env["SERVICE"] == "demo-elector-metrics.apps.svc" and env["REPLICAS"] == "2"
    container = sidecar(docs)
    lock = {e["name"]: e.get("value") for e in container["env"]}["ELECTOR_LOCK"]
    seed_used_lock(redis.Redis.from_url(redis_server.url), lock)
    pods = [start_sidecar(container, f"demo-elector-{index}") for index in range(2)]
    for member in pods:
        member.wait_for("/readyz", 200, timeout_s=30)

    def run_check(deadline_s: int) -> subprocess.CompletedProcess[str]:
        addresses = ",".join(f"127.0.0.1:{member.port}" for member in pods)
        given = {"ADDRESSES": addresses, "DEADLINE_SECONDS": str(deadline_s)}
        return subprocess.run(
            [sys.executable, "-c", check["args"][0]],
            env={"PATH": os.environ["PATH"]} | env | given,
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )

    passed = run_check(30)
    assert passed.returncode == 0, passed.stderr
    assert "exactly one leads" in passed.stdout
    redis_server.kill()
    for member in pods:
        member.wait_for("/leader", 503, timeout_s=30)
    failed = run_check(2)
    assert failed.returncode == 1
    assert "0 replicas report leading, expected exactly 1" in failed.stderr


def test_rendered_leader_file_and_priority_reach_the_daemon(
    render: Render, redis_url: str, start_sidecar: Any, tmp_path: Path
) -> None:
    values = {
        "elector": {
            **OPTIONAL["elector"],
            "priority": 3,
            "leaderFile": "/var/run/elector/leader.json",
        }
    }
    container = sidecar(render(values))
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["ELECTOR_PRIORITY"] == "3"
    seed_used_lock(redis.Redis.from_url(redis_url), env["ELECTOR_LOCK"])
    # the emptyDir the chart mounts at dirname(leaderFile): a directory of the test's own here
    leader_file = tmp_path / "elector" / Path(env["ELECTOR_LEADER_FILE"]).name
    leader_file.parent.mkdir()
    leader = start_sidecar(container, "demo-elector-0", {"ELECTOR_LEADER_FILE": str(leader_file)})
    leader.wait_for("/leader", 200)
    deadline = time.monotonic() + 10
    while not leader_file.exists() or not json.loads(leader_file.read_text() or "{}").get("is_leader"):
        assert time.monotonic() < deadline, "the leader file never said is_leader"
        time.sleep(0.05)
    content = json.loads(leader_file.read_text())
    assert content["identity"] == "demo-elector-0" and content["fencing_token"] > 0
    # the priority the chart passed is the one the candidate registered with
    candidates = redis.Redis.from_url(redis_url).hgetall(LockKeys(env["ELECTOR_LOCK"]).candidates)
    assert json.loads(candidates[b"demo-elector-0"])["priority"] == 3


VALID = [
    {},
    {"elector": {"ttl": "1m30s", "renewInterval": "", "requestTimeout": "250ms"}},
    {"podDisruptionBudget": {"minAvailable": "50%", "maxUnavailable": ""}},
    {"leaderService": {"targetPort": 9000}},
    {"workload": {"podAnnotations": {"a": "b"}, "affinity": {"podAntiAffinity": {}}}},
    {"global": {"imageRegistry": "x", "other-chart-key": True}},
    {"elector": {"redis": {"url": "redis+sentinel://s1:26379,s2:26379/mymaster/0"}}},
    {"elector": {"priority": -5, "leaderFile": "/run/elector/{lock}.json", "minReplicasAck": 2}},
    {"elector": {"replicasAckTimeout": "250ms", "redis": {"tls": {"existingSecret": "t", "caKey": ""}}}},
    {"leaderElection": {"enabled": True, "handoffWindowSeconds": 2.5}},
    {"leaderElection": {"enabled": "auto"}},
    {"elector": {"redis": {"url": "redis://billing@redis.data:6379/0", "existingSecret": "redis-auth"}}},
    {"elector": {"port": 9090, "bindAddress": "::", "envFrom": [{"configMapRef": {"name": "x"}}]}},
    {"elector": {"readinessProbe": {"periodSeconds": 0, "failureThreshold": 0}}},
    {"workload": {"extraVolumes": [{"name": "tmp", "emptyDir": {}}], "initContainers": [{"name": "init"}]}},
    {"networkPolicy": {"egress": {"sentinelMasterPorts": [6379, 6380]}}},
    {"podDisruptionBudget": {"unhealthyPodEvictionPolicy": "IfHealthyBudget"}},
]
INVALID = [
    ({"replicaCount": 3}, "additional properties 'replicaCount'"),
    ({"workload": {"replicaCount": "3"}}, "/workload/replicaCount"),
    ({"workload": {"replicas": 3}}, "additional properties 'replicas'"),
    ({"elector": {"ttl": 10}}, "/elector/ttl"),
    ({"elector": {"ttl": "ten seconds"}}, "/elector/ttl"),
    ({"elector": {"logLevel": "verbose"}}, "/elector/logLevel"),
    ({"elector": {"logFormat": "text"}}, "/elector/logFormat"),
    ({"elector": {"redis": {"url": "localhost:6379"}}}, "/elector/redis/url"),
    ({"elector": {"redis": {"password": "hunter2"}}}, "additional properties 'password'"),
    ({"elector": {"gateOnLeadership": "yes"}}, "/elector/gateOnLeadership"),
    ({"elector": {"port": 70000}}, "/elector/port"),
    ({"elector": {"livenessProbe": {"periodSeconds": 0}}}, "/elector/livenessProbe/periodSeconds"),
    ({"elector": {"readinessProbe": {"failureThreshold": -1}}}, "/elector/readinessProbe/failureThreshold"),
    ({"elector": {"image": {"pullPolicy": "Sometimes"}}}, "/elector/image/pullPolicy"),
    ({"elector": {"image": {"digest": "latest"}}}, "/elector/image/digest"),
    # the sidecar's values moved under `elector:` (the library chart's values)
    ({"sidecar": {"port": 9090}}, "additional properties 'sidecar'"),
    ({"readiness": {"gateOnLeadership": True}}, "additional properties 'readiness'"),
    ({"image": {"tag": "1.0"}}, "additional properties 'image'"),
    ({"workload": {"env": []}}, "additional properties 'env'"),  # workload.extraEnv now
    ({"elector": {"bindAddress": "10.0.0.1"}}, "/elector/bindAddress"),
    ({"global": {"imagePullSecrets": [{"secret": "x"}]}}, "/global/imagePullSecrets/0"),
    (
        {"podDisruptionBudget": {"unhealthyPodEvictionPolicy": "Never"}},
        "/podDisruptionBudget/unhealthyPodEvictionPolicy",
    ),
    (
        {"networkPolicy": {"egress": {"sentinelMasterPorts": [0]}}},
        "/networkPolicy/egress/sentinelMasterPorts/0",
    ),
    ({"serviceMonitor": {"enabled": "true"}}, "/serviceMonitor/enabled"),
    ({"dashboard": {"labels": {"grafana_dashboard": 1}}}, "/dashboard/labels/grafana_dashboard"),
    ({"operator": {"enabled": True}}, "additional properties 'operator'"),  # helm/elector-operator now
    ({"elector": {"priority": "high"}}, "/elector/priority"),
    ({"elector": {"priority": 2000000}}, "/elector/priority"),
    ({"elector": {"leaderFile": "leader.json"}}, "/elector/leaderFile"),
    ({"elector": {"leaderFile": "/leader.json"}}, "/elector/leaderFile"),
    ({"elector": {"leaderFile": "/var/run/elector/"}}, "/elector/leaderFile"),
    ({"elector": {"minReplicasAck": -1}}, "/elector/minReplicasAck"),
    ({"elector": {"minReplicasAck": 101}}, "/elector/minReplicasAck"),
    ({"elector": {"replicasAckTimeout": "100"}}, "/elector/replicasAckTimeout"),
    ({"elector": {"redis": {"tls": {"ca": "x"}}}}, "additional properties 'ca'"),
    ({"elector": {"redis": {"tls": {"existingSecret": "Bad_Name"}}}}, "/elector/redis/tls/existingSecret"),
    ({"elector": {"exec": ["sh"]}}, "additional properties 'exec'"),
    ({"leaderElection": {"enabled": "yes"}}, "/leaderElection/enabled"),
    ({"leaderElection": {"handoffWindowSeconds": 0}}, "/leaderElection/handoffWindowSeconds"),
    ({"leaderElection": {"leaderLabel": "x"}}, "additional properties 'leaderLabel'"),
]


@pytest.mark.parametrize("values", VALID, ids=lambda v: str(v)[:60])
def test_schema_accepts(chart: Chart, values: dict[str, Any]) -> None:
    chart.validate_schema(values)


@pytest.mark.parametrize(("values", "message"), INVALID, ids=[m for _, m in INVALID])
def test_schema_rejects(chart: Chart, values: dict[str, Any], message: str) -> None:
    with pytest.raises(HelmValuesError, match=re.escape(message)):
        chart.validate_schema(values)


PASSWORD_URLS = [
    "redis://:hunter2@redis.data:6379/0",
    "redis://billing:hunter2@redis.data:6379/0",
    "rediss://billing:hunter2@[fd00::1]:6380",
    "redis+sentinel://:hunter2@s1:26379,s2:26379/mymaster/0",
    "rediss+sentinel://billing:hunter2@s1:26379,s2:26379/mymaster",
]


@pytest.mark.parametrize("url", PASSWORD_URLS)
def test_schema_refuses_a_password_in_the_url(chart: Chart, url: str) -> None:
    """A password in ELECTOR_REDIS_URL sits in a plain env var of the pod spec: the schema refuses it and
    points to the Secret value, which mounts it as a file (ELECTOR_REDIS_PASSWORD_FILE)."""
    with pytest.raises(HelmValuesError) as error:
        chart.validate_schema({"elector": {"redis": {"url": url}}})
    message = str(error.value)
    assert "/elector/redis/url" in message and "elector.redis.existingSecret" in message
    assert "hunter2" not in message  # the refusal does not print the password either
    assert "existingSecret" in chart.values["elector"]["redis"]  # the option it points to exists
    # a user name alone (an ACL user whose password comes from the Secret) is fine
    chart.validate_schema({"elector": {"redis": {"url": url.replace(":hunter2@", "@").replace("//@", "//")}}})


def test_every_value_is_in_the_schema_and_commented(chart_dir: Path, chart: Chart) -> None:
    schema = json.loads((chart_dir / "values.schema.json").read_text())
    chart.validate_schema({})  # the defaults pass
    documented: set[str] = set()  # dotted paths of the chart's own keys (not inside free-form objects)

    def walk(values: dict[str, Any], node: dict[str, Any], path: str) -> None:
        for key, value in values.items():
            assert key in node.get("properties", {}), f"{path}{key} is not in values.schema.json"
            documented.add(f"{path}{key}")
            child = node["properties"][key]
            if isinstance(value, dict) and child.get("properties"):
                walk(value, child, f"{path}{key}.")

    dependencies = {d["name"] for d in chart.dependencies}  # their keys are Helm's, not values.yaml's
    walk({k: v for k, v in chart.values.items() if k not in dependencies}, schema, "")
    lines = (chart_dir / "values.yaml").read_text().splitlines()
    stack: list[tuple[int, str]] = []
    seen = set()
    for index, line in enumerate(lines):
        match = re.match(r"^( *)([A-Za-z_]+):", line)
        if not match:
            continue
        indent = len(match.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match.group(2)))
        path = ".".join(key for _, key in stack)
        if path in documented:
            seen.add(path)
            if path.count(".") >= 2:  # keys of a small block (probe timings) share their parent's comment
                continue
            assert lines[index - 1].strip().startswith("#"), f"values.yaml: {path} has no comment above it"
    assert seen == documented
