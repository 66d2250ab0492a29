"""The same task graph from three entry points: the CLI, a user's dodo.py, doit's loader plugin."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_nkibuild
from helpers import softmax_manifest, softmax_project

# The entry points, not the frontends, are under test: a prebuilt-HLO project (no tracing).
EXPECTED_TASKS = {
    "extract:softmax/default",
    "compile:softmax/default/trn1",
    "compile:softmax/default/trn2",
    "bundle",
    "wheel",
}
WHEEL = "dist/softmax_kernels-0.1.0-py3-none-any.whl"

DODO = """\
from nkibuild.graph import doit_tasks

DOIT_CONFIG = {"default_tasks": ["wheel"], "dep_file": ".dodo-state.db"}


def task_nkibuild():
    yield from doit_tasks("nkibuild.yaml", toolchain="fake")
"""

PLUGIN_PYPROJECT = """\
[tool.doit]
loader = "nkibuild"

[tool.doit.plugins.loader]
nkibuild = "nkibuild.graph.loader:NkibuildLoader"
"""


def doit(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "doit", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NKIBUILD_TOOLCHAIN": "fake"},
        check=False,
    )


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return softmax_project(tmp_path / "project", softmax_manifest())


def listed(output: str) -> set[str]:
    return {line.split()[0] for line in output.splitlines() if line.strip()}


def test_cli_builds_the_wheel(project: Path) -> None:
    listing = run_nkibuild(["list", "--toolchain", "fake"], project)
    assert listed(listing.stdout) >= EXPECTED_TASKS
    result = run_nkibuild(["build", "--toolchain", "fake"], project)
    assert result.returncode == 0, result.stderr
    assert (project / WHEEL).is_file()


def test_users_dodo_file_runs_the_same_tasks(project: Path) -> None:
    (project / "dodo.py").write_text(DODO)
    listing = doit(["list", "--all"], project)
    assert listing.returncode == 0, listing.stderr
    assert listed(listing.stdout) >= EXPECTED_TASKS
    result = doit([], project)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (project / WHEEL).is_file()
    again = doit([], project)
    assert again.returncode == 0
    assert all(line.startswith("--") for line in again.stdout.splitlines()), again.stdout


def test_doit_loader_plugin_from_pyproject(project: Path) -> None:
    (project / "pyproject.toml").write_text(PLUGIN_PYPROJECT)
    listing = doit(["list", "--all"], project)
    assert listing.returncode == 0, listing.stderr
    assert listed(listing.stdout) >= EXPECTED_TASKS
    result = doit(["wheel"], project)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (project / WHEEL).is_file()
    # nkibuild and the plugin share one state: the CLI finds everything up to date.
    cli = run_nkibuild(["build", "--toolchain", "fake"], project)
    assert cli.returncode == 0, cli.stderr
    assert "0 ran" in cli.stdout


def test_plugin_reports_manifest_errors_without_traceback(project: Path) -> None:
    (project / "pyproject.toml").write_text(PLUGIN_PYPROJECT)
    manifest = project / "nkibuild.yaml"
    manifest.write_text(manifest.read_text().replace("targets: [trn1, trn2]", "targets: [trn9]"))
    result = doit(["list"], project)
    assert result.returncode != 0
    assert "nkibuild.yaml:" in result.stderr + result.stdout
    assert "Traceback" not in result.stderr
