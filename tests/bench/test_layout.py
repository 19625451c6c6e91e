"""The bench's layout as the docs name it: every section of docs/benchmarks.md says which module measured
it, and every bench module or file the docs, the Makefile and the bench itself name exists (a module
moved without its references fails here, not in a half-hour `make bench`)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from bench.__main__ import BENCHMARKS, source_of
from bench.harness.common import REPO, BenchResult
from bench.harness.report import RunInfo, render_section

DOCS = REPO / "docs" / "benchmarks.md"
SECTION = re.compile(r"<!-- bench:(\w+):begin -->\n.*?<!-- bench:\1:end -->\n", re.DOTALL)
#: Where bench modules and files are named: the docs, the README, the Makefile, the bench and its tests.
NAMING_FILES = sorted(
    [
        *REPO.glob("docs/*.md"),
        REPO / "README.md",
        REPO / "Makefile",
        *REPO.glob("bench/**/*.py"),
        *REPO.glob("tests/bench/**/*.py"),
    ]
)


def test_each_benchmark_lives_in_the_subpackage_of_what_it_measures() -> None:
    sources = {module.NAME: source_of(module) for module in BENCHMARKS}
    assert sources == {
        "takeover": "bench/lease/takeover.py",
        "handoff": "bench/lease/handoff.py",
        "handoff_trace": "bench/execmode/handoff_trace.py",
        "idle_requests": "bench/lease/idle_requests.py",
        "idle_resources": "bench/lease/idle_resources.py",
        "startup": "bench/lease/startup.py",
        "many_locks": "bench/many_locks/benchmark.py",
        "peers": "bench/peers/benchmark.py",
        "library_peers": "bench/library_peers/benchmark.py",
        "overrun_kill": "bench/overrun/kill_cost.py",
        "operator_api_calls": "bench/kube_operator/api_calls.py",
    }


def test_a_section_names_the_module_that_measured_it(tmp_path: Path) -> None:
    result = BenchResult("takeover", "Crash takeover", "method", source="bench/lease/takeover.py")
    run = RunInfo("python -m bench --quick", "today", "quick", 1.0, {}, [])
    section = render_section(result, run, docs_dir=tmp_path)
    assert "(`python -m bench --quick`), 0 s; measured by `bench/lease/takeover.py`._" in section


def test_the_page_names_each_sections_module() -> None:
    sources = {module.NAME: source_of(module) for module in BENCHMARKS}
    sections = {m.group(1): m.group(0) for m in SECTION.finditer(DOCS.read_text())}
    assert sections
    for name, text in sections.items():
        assert f"; measured by `{sources[name]}`._" in text, name


@pytest.mark.parametrize("path", NAMING_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_bench_module_and_file_named_exists(path: Path) -> None:
    text = path.read_text()
    for module in re.findall(r"(?<![\w./])bench(?:\.[a-z_]+)+", text):
        assert importlib.util.find_spec(module) is not None, f"{path.name} names {module}"
    for file in re.findall(r"(?<![\w/])bench/[\w/]+\.py", text):
        assert (REPO / file).is_file(), f"{path.name} names {file}"
