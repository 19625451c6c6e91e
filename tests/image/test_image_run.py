"""The image built from the project's Dockerfile and run the way the Helm chart runs it.

Built with Debian's podman (no Docker engine) on a debootstrap stand-in for the slim Python base
(tests/image/podman_support.py says why each piece is there). Then run `--read-only`, with all
capabilities dropped, `no-new-privileges` and uid 10001, against a redis-server on the host
(`--network host`). What the processes are is read from the host's /proc, not from the daemon's
view of itself. On a machine that cannot run containers the tests fail with the install command.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
import redis

from elector._version import __version__
from elector.backend.lua.lease import LockKeys
from elector.testing.redis_server import RedisServerProcess, free_tcp_port
from tests.image import podman_support as ps
from tests.support.tiers import PODMAN, needs

#: A cold first test also makes the base (debootstrap, ~70 s measured) and builds (~25 s): a
#: loaded CI box may take several times that, and a hang is still caught.
pytestmark = pytest.mark.timeout(900)

UID = GID = 10001
#: Generous: a container start on a loaded 2-core box measured ~1-2 s; the bound only catches hangs.
START_TIMEOUT_S = 60.0
#: The flags the chart's securityContext amounts to: readOnlyRootFilesystem (and no tmpfs podman
#: would add on its own), capabilities drop ALL, allowPrivilegeEscalation false, runAsUser/Group.
CHART_FLAGS = (
    "--read-only",
    "--read-only-tmpfs=false",
    "--cap-drop", "ALL",
    "--security-opt", "no-new-privileges",
    "--user", f"{UID}:{GID}",
)  # fmt: skip


@pytest.fixture(scope="module")
@needs(PODMAN)
def podman(tmp_path_factory: pytest.TempPathFactory) -> ps.Podman:
    try:
        ps.check_tools()
    except ps.ContainerToolsMissing as exc:
        pytest.fail(f"this machine cannot build or run the image: {exc}", pytrace=False)
    return ps.Podman(ps.containers_conf(tmp_path_factory.mktemp("podman")))


@pytest.fixture(scope="module")
def image(podman: ps.Podman, request: pytest.FixtureRequest) -> ps.BuiltImage:
    base_tag, base_s = ps.ensure_base_image(podman)
    built = ps.build_image(podman, base_tag=base_tag, base_s=base_s)
    # The figures belong in CI's output, not in a captured buffer nobody sees on success.
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():
            for line in _report(built):
                reporter.write_line(line)
    return built


def _report(built: ps.BuiltImage) -> list[str]:
    mb = 1024 * 1024
    base = "cached" if built.base_s == 0 else f"made in {built.base_s:.0f} s"
    lines = [
        "",
        f"image {built.tag}: {built.size_bytes / mb:.1f} MiB; base {built.base_tag} ({base}); "
        f"build {built.build_s:.1f} s",
        "layers the Dockerfile adds to the base:",
    ]
    for layer in built.added_layers:
        what = layer.created_by.split("/bin/sh -c ", 1)[-1].replace("#(nop) ", "")
        lines.append(f"  {layer.size_bytes / mb:8.2f} MiB  {' '.join(what.split())[:110]}")
    added = sum(layer.size_bytes for layer in built.added_layers)
    lines.append(f"  {added / mb:8.2f} MiB  in all")
    return lines


@pytest.fixture
def containers(podman: ps.Podman) -> Iterator[list[str]]:
    """Names of containers a test started; removed afterwards whatever happened."""
    names: list[str] = []
    yield names
    for name in names:
        podman.run("rm", "--force", "--time", "0", name, check=False)


def _start(
    podman: ps.Podman, image: ps.BuiltImage, containers: list[str], name: str, *args: str
) -> tuple[str, int]:
    """Start a detached container (chart flags, host network): (its name, its HTTP port)."""
    port = free_tcp_port()
    full = f"elector-image-test-{name}-{os.getpid()}"
    containers.append(full)
    podman.run(
        "run", "--detach", "--name", full, "--network", "host", *CHART_FLAGS,
        image.tag, "run", "--http-address", f"127.0.0.1:{port}", "--log-format", "json", *args,
    )  # fmt: skip
    return full, port


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _wait_for_leader(podman: ps.Podman, name: str, port: int) -> dict[str, object]:
    deadline = time.monotonic() + START_TIMEOUT_S
    last: object = None
    while time.monotonic() < deadline:
        try:
            status, body = _get(port, "/leader")
        except OSError as exc:  # not listening yet
            last = exc
        else:
            last = (status, body)
            if status == 200:
                answer = json.loads(body)
                assert isinstance(answer, dict)
                return answer
        time.sleep(0.2)
    logs = podman.run("logs", name, check=False)
    pytest.fail(f"/leader never answered 200 within {START_TIMEOUT_S} s: {last}\n{logs.stdout}{logs.stderr}")


def _container_pid(podman: ps.Podman, name: str) -> int:
    return int(podman.run("inspect", "--format", "{{.State.Pid}}", name).stdout.strip())


def _wait_exit(podman: ps.Podman, name: str) -> int:
    return int(podman.run("wait", name, timeout_s=START_TIMEOUT_S).stdout.strip())


def _descendant(pid1: int, argv: list[str]) -> int:
    """The host PID of the first process under `pid1` whose command line starts with `argv`."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        for pid in ps.process_tree(pid1)[1:]:
            cmdline = ps.proc_cmdline(pid)
            # argv[0] may be a full path (/usr/local/bin/python) or the bare name (sleep).
            if cmdline and cmdline[0].rsplit("/", 1)[-1] == argv[0] and cmdline[1 : len(argv)] == argv[1:]:
                return pid
        time.sleep(0.2)
    pytest.fail(f"no process {argv} under PID {pid1}: {[ps.proc_cmdline(p) for p in ps.process_tree(pid1)]}")


def test_image_builds_adds_small_layers_and_bakes_in_nothing_of_the_host(
    podman: ps.Podman, image: ps.BuiltImage
) -> None:
    # Only the runtime stage's three RUN steps write files: tini, the installed wheels, the user.
    # The wheels come in through a bind mount, so no layer holds them.
    writing = [layer for layer in image.added_layers if layer.size_bytes > 0]
    assert len(writing) == 3, _report(image)
    assert "apt-get install" in writing[0].created_by and "tini" in writing[0].created_by
    assert "pip install --no-index" in writing[1].created_by
    assert "useradd" in writing[2].created_by
    no_wheels = podman.run("run", "--rm", "--entrypoint", "/bin/sh", image.tag, "-c", "test ! -e /wheels")
    assert no_wheels.returncode == 0
    # The host's CA bundle (with the CA that re-signs this host's TLS) was mounted for the build
    # only: the image keeps its own Debian bundle.
    bundle = podman.run(
        "run", "--rm", "--entrypoint", "/bin/cat", image.tag, str(ps.HOST_CA_BUNDLE), check=False
    )  # fmt: skip
    assert bundle.stdout != ps.HOST_CA_BUNDLE.read_text(), "the host's CA bundle ended up in the image"


def test_elector_version_runs_in_the_locked_down_container(podman: ps.Podman, image: ps.BuiltImage) -> None:
    version = __version__
    result = podman.run("run", "--rm", "--network", "none", *CHART_FLAGS, image.tag, "--version")
    assert version in result.stdout, result.stdout + result.stderr


def test_daemon_leads_serves_probes_and_releases_on_stop(
    podman: ps.Podman, image: ps.BuiltImage, containers: list[str], redis_server: RedisServerProcess
) -> None:
    lock = "image-test"
    name, port = _start(
        podman, image, containers, "daemon",
        "--redis-url", redis_server.url, "--lock", lock, "--identity", "image-pod",
    )  # fmt: skip
    leader = _wait_for_leader(podman, name, port)
    assert leader["is_leader"] is True and leader["identity"] == "image-pod", leader
    status, metrics = _get(port, "/metrics")
    assert status == 200
    assert f'elector_is_leader{{lock="{lock}"}} 1.0' in metrics, metrics[:2000]
    assert f'elector_leader_transitions_total{{lock="{lock}"}} 1.0' in metrics
    assert f'elector_fencing_token{{lock="{lock}"}}' in metrics
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    key = LockKeys(lock, prefix="elector").lease
    assert client.get(key) is not None, "the leader holds no lease key in Redis"

    # PID 1 of the container (seen from the host, and as PID 1 in its own PID namespace) is tini.
    pid1 = _container_pid(podman, name)
    assert ps.proc_cmdline(pid1)[0] == "/usr/bin/tini", ps.proc_cmdline(pid1)
    assert ps.proc_status(pid1)["NSpid"].split()[-1] == "1"
    # tini's one child is the daemon: `elector`'s console script, run by the image's python.
    (daemon,) = [pid for pid in ps.process_tree(pid1) if ps.proc_status(pid).get("PPid") == str(pid1)]
    assert ps.proc_cmdline(daemon)[1:3] == ["/usr/local/bin/elector", "run"], ps.proc_cmdline(daemon)
    # Every process, tini included, runs as 10001 (real, effective, saved and filesystem ids),
    # with no capabilities and no way to gain privileges.
    tree = ps.process_tree(pid1)
    assert len(tree) >= 2, tree
    for pid in tree:
        status_of = ps.proc_status(pid)
        what = f"PID {pid} {ps.proc_cmdline(pid)}"
        assert status_of["Uid"].split() == [str(UID)] * 4, f"{what}: Uid {status_of['Uid']}"
        assert status_of["Gid"].split() == [str(GID)] * 4, f"{what}: Gid {status_of['Gid']}"
        assert int(status_of["CapEff"], 16) == 0 and int(status_of["CapPrm"], 16) == 0, what
        assert status_of["NoNewPrivs"] == "1", what
    # The root filesystem is read-only for the daemon's user as for root.
    write = podman.run("exec", name, "/bin/sh", "-c", "echo x > /probe", check=False)
    assert write.returncode != 0 and "Read-only file system" in write.stderr, write

    # `podman stop` sends SIGTERM to tini, which forwards it: the leader releases and exits 0.
    podman.run("stop", "--time", str(int(START_TIMEOUT_S)), name, timeout_s=START_TIMEOUT_S + 30)
    assert _wait_exit(podman, name) == 0, podman.run("logs", name, check=False).stderr
    assert client.get(key) is None, "the lease key is still in Redis after a graceful stop"
    assert not any(ps.alive(pid) for pid in tree)


def test_exec_mode_command_dies_with_a_sigkilled_daemon(
    podman: ps.Podman, image: ps.BuiltImage, containers: list[str], redis_server: RedisServerProcess
) -> None:
    name, port = _start(
        podman, image, containers, "exec",
        "--redis-url", redis_server.url, "--lock", "image-exec", "--identity", "exec-pod",
        "--", "sleep", "3600",
    )  # fmt: skip
    _wait_for_leader(podman, name, port)
    pid1 = _container_pid(podman, name)
    command = _descendant(pid1, ["sleep", "3600"])
    # tini's only child is the daemon; the command runs under it (through exec mode's keeper).
    (daemon,) = [pid for pid in ps.process_tree(pid1) if ps.proc_status(pid).get("PPid") == str(pid1)]
    assert "elector" in " ".join(ps.proc_cmdline(daemon)), ps.proc_cmdline(daemon)
    tree = ps.process_tree(daemon)
    assert command in tree, (command, tree)

    # SIGKILL leaves the daemon no chance to stop its command: tini, PID 1, sees its only child
    # die and exits, and the kernel kills what is left of the PID namespace. (Exec mode's keeper
    # would also stop the command on its own when its pipe from the daemon closes.)
    os.kill(daemon, signal.SIGKILL)
    code = _wait_exit(podman, name)
    assert code == 128 + signal.SIGKILL, f"tini should report the daemon's SIGKILL, exited {code}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while any(ps.alive(pid) for pid in tree) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not ps.alive(command), f"the command (PID {command}) outlived the SIGKILLed daemon"
    assert not [pid for pid in tree if ps.alive(pid)], "processes of the container outlived it"
