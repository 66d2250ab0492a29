"""`nkibuild --help` and a no-op build stay light: no frontend, no protobuf, no YAML parsing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_nkibuild

HEAVY = ("jax", "jaxlib", "torch", "torch_xla", "nki", "nkipy", "spike", "google.protobuf")
NOT_ON_NOOP = (*HEAVY, "yaml", "jsonschema", "rich.live", "rich.progress")

PROBE = """\
import json, sys
from nkibuild.cli.main import main
try:
    code = main(sys.argv[1:])
except SystemExit as exit:
    code = exit.code
print("MODULES=" + json.dumps(sorted(sys.modules)))
sys.exit(code)
"""


def imported_modules(args: list[str], cwd: Path) -> set[str]:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "CI": "true"},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("MODULES="))
    return set(json.loads(line.removeprefix("MODULES=")))


def built(project: Path) -> None:
    """A full build in its own process: a probe then makes the next build."""
    result = run_nkibuild(["build", "--toolchain", "fake"], project)
    assert result.returncode == 0, result.stderr


def loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return [name for name in names if name in modules]


def test_help_imports_nothing_heavy(tmp_path: Path) -> None:
    modules = imported_modules(["--help"], tmp_path)
    assert loaded(modules, (*NOT_ON_NOOP, "doit")) == []


def test_noop_build_imports_no_frontend_nor_parser(example_project: Path) -> None:
    pytest.importorskip("jax")
    built(example_project)
    modules = imported_modules(["build", "--toolchain", "fake"], example_project)
    record = json.loads((example_project / "build" / "state" / "last-run.json").read_text())
    assert record["up_to_date_decision"]["handed_to_doit"] == 0  # the probe ran a no-op build
    assert record["up_to_date"]  # and reported its tasks
    # Every task proven up to date: doit is not even imported (graph/run.py).
    assert loaded(modules, (*NOT_ON_NOOP, "doit")) == []


def test_a_build_with_a_pending_task_imports_doit(example_project: Path) -> None:
    pytest.importorskip("jax")
    built(example_project)
    wheel = next((example_project / "dist").glob("*.whl"))
    wheel.unlink()  # the wheel task's output is gone: doit must run it
    modules = imported_modules(["build", "--toolchain", "fake"], example_project)
    assert "doit" in modules
    assert wheel.exists()


def test_a_noop_build_of_prebuilt_modules_asks_no_package_metadata(tmp_path: Path) -> None:
    """The hlo frontend has no package whose version enters its tasks: importlib.metadata
    (with email.*) stays unimported when nothing runs."""
    from helpers import softmax_manifest, softmax_project

    project = softmax_project(tmp_path / "p", softmax_manifest())
    built(project)
    modules = imported_modules(["build", "--toolchain", "fake"], project)
    assert loaded(modules, ("importlib.metadata", "doit")) == []
