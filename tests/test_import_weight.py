"""`nkibuild --help` and a no-op build stay light: no frontend (JAX, PyTorch, NKI) and no
protobuf is imported when nothing needs tracing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_nkibuild

HEAVY = ("jax", "jaxlib", "torch", "torch_xla", "nki", "nkipy", "spike", "google.protobuf")

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


def probed(args: list[str], cwd: Path) -> tuple[set[str], str]:
    """The modules `nkibuild <args>` imported, and what it printed before them."""
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
    printed, _, modules = result.stdout.rpartition("MODULES=")
    return set(json.loads(modules)), printed


def loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return [name for name in names if name in modules]


def test_help_imports_nothing_heavy(tmp_path: Path) -> None:
    modules, printed = probed(["--help"], tmp_path)
    assert "usage: nkibuild" in printed
    assert loaded(modules, (*HEAVY, "rich.live")) == []


def test_noop_build_imports_no_frontend_nor_protobuf(example_project: Path) -> None:
    pytest.importorskip("jax")
    first = run_nkibuild(["build", "--toolchain", "fake"], example_project)
    assert first.returncode == 0, first.stderr
    modules, printed = probed(["build", "--toolchain", "fake", "--json"], example_project)
    summary = json.loads(printed)
    assert summary["executed"] == [] and summary["up_to_date"]  # the probe ran a no-op build
    assert loaded(modules, HEAVY) == []
    # The plan cache answers: the manifest is neither parsed nor validated again.
    assert loaded(modules, ("yaml", "jsonschema")) == []


def test_a_noop_build_loads_neither_the_project_nor_a_stage(tmp_path: Path) -> None:
    """Its graph snapshot answers: no manifest model, plan, settings or stage is imported."""
    from helpers import softmax_manifest, softmax_project

    project = softmax_project(tmp_path / "p", softmax_manifest())
    first = run_nkibuild(["build", "--toolchain", "fake"], project)
    assert first.returncode == 0, first.stderr
    modules, printed = probed(["build", "--toolchain", "fake", "--json"], project)
    assert json.loads(printed)["executed"] == []
    project_code = (
        "nkibuild.manifest.model",
        "nkibuild.plan",
        "nkibuild.settings",
        "nkibuild.context",
        "nkibuild.graph.tasks",
        "nkibuild.frontends",
        "nkibuild.compiler",
        "nkibuild.bundle",
        "packaging",
    )
    assert loaded(modules, project_code) == ["nkibuild.context"]  # its Layout only
