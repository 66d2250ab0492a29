"""Which toolchain a project uses when no flag says (issue 31, item 4): the manifest's
`compiler: toolchain:`, and for the commands that read a build's state (explain, list,
verify) the toolchain the build directory's last build used. On a host without
neuronx-cc, anything that falls back to `auto` stops with exit 2."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import run_nkibuild
from helpers import failed, ok, softmax_manifest, softmax_project

from nkibuild.graph.run import LAST_RUN_FILE, recorded_options

NOT_FOUND = "neuronx-cc was not found"


@pytest.fixture(scope="module")
def no_compiler(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Environment additions under which `auto` finds no neuronx-cc."""
    if (Path(sys.executable).parent / "neuronx-cc").exists():
        pytest.skip("neuronx-cc is installed next to this Python interpreter")
    return {"PATH": str(tmp_path_factory.mktemp("empty-bin")), "VIRTUAL_ENV": ""}


@pytest.fixture(scope="module")
def built_fake(tmp_path_factory: pytest.TempPathFactory, no_compiler: dict[str, str]) -> Path:
    """A one-kernel project built once with `--toolchain fake`; the tests only read it
    (verify rewrites its baseline and last-run record with the same toolchain)."""
    project = softmax_project(
        tmp_path_factory.mktemp("built") / "p", softmax_manifest(reference=True)
    )
    # Module scope runs outside the autouse `isolated_cache`: a cache of its own.
    env = {**no_compiler, "NKIBUILD_CACHE_DIR": str(tmp_path_factory.mktemp("cache"))}
    failed(run_nkibuild(["list"], project, env=env), 2)  # nothing recorded yet: auto
    ok(run_nkibuild(["build", "--toolchain", "fake"], project, env=env))
    return project


@pytest.mark.parametrize("command", [["explain"], ["list"], ["verify", "--mode", "reference"]])
def test_state_readers_use_the_last_builds_toolchain(
    built_fake: Path, no_compiler: dict[str, str], command: list[str]
) -> None:
    result = ok(run_nkibuild(command, built_fake, env=no_compiler))
    assert NOT_FOUND not in result.stderr
    assert "softmax" in result.stdout


@pytest.mark.parametrize(
    ("given", "env"),
    [(["--toolchain", "auto"], {}), ([], {"NKIBUILD_TOOLCHAIN": "auto"})],
    ids=["flag", "environment"],
)
def test_flag_and_environment_win_over_the_last_build(
    built_fake: Path, no_compiler: dict[str, str], given: list[str], env: dict[str, str]
) -> None:
    result = failed(run_nkibuild(["explain", *given], built_fake, env={**no_compiler, **env}), 2)
    assert NOT_FOUND in result.stderr


def test_a_build_does_not_reuse_the_last_builds_toolchain(
    built_fake: Path, no_compiler: dict[str, str]
) -> None:
    # Only commands that read state default to it: a bare build means auto, as documented.
    assert NOT_FOUND in failed(run_nkibuild(["build"], built_fake, env=no_compiler), 2).stderr


def test_the_manifest_sets_the_toolchain_below_flag_and_environment(
    tmp_path: Path, no_compiler: dict[str, str]
) -> None:
    project = softmax_project(tmp_path / "p", softmax_manifest(top="compiler: {toolchain: fake}"))
    ok(run_nkibuild(["build", "compile"], project, env=no_compiler))  # wins over nothing
    assert (project / "build/compile/softmax/default/trn2/model.neff").is_file()
    for given, env in ((["--toolchain", "auto"], {}), ([], {"NKIBUILD_TOOLCHAIN": "auto"})):
        result = run_nkibuild(["list", *given], project, env={**no_compiler, **env})
        assert NOT_FOUND in failed(result, 2).stderr


def test_a_bad_manifest_toolchain_is_reported_at_its_position(tmp_path: Path) -> None:
    manifest = softmax_manifest(top="compiler:\n  toolchain: fakes")
    project = softmax_project(tmp_path / "p", manifest)
    line = manifest.splitlines().index("  toolchain: fakes") + 1
    result = failed(run_nkibuild(["validate"], project), 2)
    assert f"nkibuild.yaml:{line}:{len('  toolchain: ') + 1}" in result.stderr
    assert "$.compiler.toolchain" in result.stderr


@pytest.mark.parametrize(
    "record", ['{"toolchain": "fakes"}', '["fake"]', "{", '{"ok": true}'], ids=repr
)
def test_an_unusable_record_is_no_record(tmp_path: Path, record: str) -> None:
    (tmp_path / LAST_RUN_FILE).write_text(record)
    assert recorded_options(tmp_path) == {}
    (tmp_path / LAST_RUN_FILE).write_text('{"toolchain": "fake"}')
    assert recorded_options(tmp_path) == {"toolchain": "fake"}


def test_the_build_records_its_toolchain(built_fake: Path) -> None:
    record = json.loads((built_fake / "build" / "state" / LAST_RUN_FILE).read_text())
    assert (record["ok"], record["toolchain"]) == (True, "fake")


DODO = """\
from nkibuild.graph import doit_tasks


def task_nkibuild():
    yield from doit_tasks("nkibuild.yaml")
"""
PLUGIN_PYPROJECT = """\
[tool.doit]
loader = "nkibuild"

[tool.doit.plugins.loader]
nkibuild = "nkibuild.graph.loader:NkibuildLoader"
"""


@pytest.mark.parametrize("entry", ["dodo.py", "pyproject.toml"])
def test_doit_entry_points_take_the_manifests_toolchain(
    tmp_path: Path, no_compiler: dict[str, str], entry: str
) -> None:
    """A user's dodo.py and doit's loader plugin resolve the toolchain as the CLI does:
    with no flag and no NKIBUILD_TOOLCHAIN, the manifest's setting decides."""
    import os
    import subprocess

    project = softmax_project(tmp_path / "p", softmax_manifest(top="compiler: {toolchain: fake}"))
    (project / entry).write_text(DODO if entry == "dodo.py" else PLUGIN_PYPROJECT)
    env = {k: v for k, v in os.environ.items() if k != "NKIBUILD_TOOLCHAIN"} | no_compiler
    result = subprocess.run(
        [sys.executable, "-m", "doit", "list", "--all"],
        cwd=project, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "compile:softmax/default/trn2" in result.stdout
