"""One version: the package, `elector --version`, elector_build_info, the `started` log line, every
chart's version and appVersion (the image tag the charts default to), the Dockerfile's VERSION and
the docs name one release, read from one source (elector/_version.py).

Before 0.2.0 the charts were 0.2.0 while their appVersion (the default image tag) was 0.1.0: a
chart upgrade ran the previous release's image, which ignored the new variables.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import signal
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import yaml
from click.testing import CliRunner
from prometheus_client import CollectorRegistry, generate_latest

import elector
from elector._version import __version__
from elector.backend.protocol import PROTOCOL
from elector.cli.main import cli
from elector.telemetry.metrics import register_process_metrics
from elector.testing.redis_server import free_tcp_port

REPO = Path(__file__).resolve().parents[2]
CHARTS = sorted((REPO / "helm").glob("*/Chart.yaml"))
IMAGE = "ghcr.io/elector-dev/elector"


def test_the_version_has_one_source() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "elector._version.__version__"}
    assert elector.__version__ == __version__ == importlib.metadata.version("elector")
    assert re.fullmatch(r"\d+\.\d+\.\d+", __version__)


def test_every_chart_is_the_same_release() -> None:
    assert len(CHARTS) == 3, CHARTS
    for path in CHARTS:
        chart = yaml.safe_load(path.read_text())
        where = path.relative_to(REPO)
        assert chart["version"] == chart["appVersion"] == __version__, where
        images = yaml.safe_load(chart["annotations"]["artifacthub.io/images"])
        elector_images = [image["image"] for image in images if image["name"] == "elector"]
        assert elector_images == [f"{IMAGE}:{__version__}"], where
        for dependency in chart.get("dependencies", []):
            if dependency["name"].startswith("elector"):
                assert dependency["version"] == __version__, where


def test_the_dockerfile_the_docs_and_the_plain_manifests_name_the_release() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    assert re.findall(r"^ARG VERSION=(\S+)$", dockerfile, re.MULTILINE) == [__version__]
    library = (REPO / "helm" / "elector-sidecar" / "templates" / "_defaults.tpl").read_text()
    assert re.findall(r'define "elector-sidecar.appVersion" -}}\n(\S+)\n', library) == [__version__]
    for path in ("Dockerfile", "docs/image.md", "deploy/kustomize/base/deployment-elector.yaml"):
        text = (REPO / path).read_text()
        tags = set(re.findall(rf"{re.escape(IMAGE)}:([\w.\-]+)", text))
        assert tags == {__version__}, (path, tags)
        assert set(re.findall(r"VERSION=([\d.]+)", text)) <= {__version__}, path
    helm_md = (REPO / "docs" / "helm.md").read_text()
    assert f"(version {__version__}, appVersion {__version__}," in helm_md


def test_version_option() -> None:
    result = CliRunner().invoke(cli, ["--version"])
    assert result.stdout == f"elector, version {__version__}\n"


def test_build_info_names_version_python_and_protocol() -> None:
    registry = CollectorRegistry()
    register_process_metrics(registry)
    text = generate_latest(registry).decode()
    expected = (
        f'elector_build_info{{protocol="{PROTOCOL}",python="{platform.python_version()}",'
        f'version="{__version__}"}} 1.0'
    )
    assert expected in text, text


def test_a_running_daemon_logs_and_exports_its_version(tmp_path: Path) -> None:
    """The `started` line and /metrics of a real daemon (its Redis unreachable: it starts anyway)."""
    port = free_tcp_port()
    log = tmp_path / "daemon.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ELECTOR_")}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "elector", "run", "--lock", "jobs", "--redis-url", "redis://127.0.0.1:1/0",
             "--http-address", f"127.0.0.1:{port}", "--log-format", "json"],
            stdout=out, stderr=out, env=env,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60  # a hang bound: start-up takes ~1 s
        metrics = ""
        while time.monotonic() < deadline and process.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                    metrics = response.read().decode()
                break
            except OSError:
                time.sleep(0.05)
        assert f'version="{__version__}"' in metrics, log.read_text()
        # /metrics may answer before the `started` line is written: wait for it (same hang bound).
        while time.monotonic() < deadline and '"event": "started"' not in log.read_text():
            time.sleep(0.05)
        started = [line for line in log.read_text().splitlines() if '"event": "started"' in line]
        assert len(started) == 1, log.read_text()
        assert f'"version": "{__version__}"' in started[0], started[0]
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
