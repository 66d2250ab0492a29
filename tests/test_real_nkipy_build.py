"""Builds whose nkipy kernels are traced by the REAL nkipy (installed by .ci/run from
../shared/thirdparty): the toolchain double stands in for nkipy only where it is absent.
Every test skips, saying why, when the real nkipy is not installed."""

from __future__ import annotations

import json
import shutil
from importlib import metadata
from pathlib import Path

import pytest
from conftest import EXAMPLES, run_nkibuild
from helpers import write_project


@pytest.fixture(scope="module")
def real_nkipy() -> str:
    """The installed nkipy's version; skip unless the real tracer is installed."""
    try:
        version = metadata.version("nkipy")
        files = metadata.files("nkipy") or []
    except metadata.PackageNotFoundError:
        pytest.skip("the real nkipy is not installed (.ci/run installs it from ../shared)")
    if not any(str(f).endswith("core/trace.py") for f in files):
        pytest.skip(f"the installed nkipy {version} has no tracer (PyPI's placeholder?)")
    return version


def nki_nkipy_example(destination: Path) -> Path:
    ignored = shutil.ignore_patterns("build", "dist", "__pycache__")
    shutil.copytree(EXAMPLES / "nki-nkipy", destination, ignore=ignored)
    return destination


def artifact(project: Path, name: str) -> dict:
    return json.loads((project / "build" / "extract" / name / "artifact.json").read_text())


def test_the_examples_nkipy_kernel_is_traced_by_the_real_nkipy(
    real_nkipy: str, tmp_path: Path
) -> None:
    project = nki_nkipy_example(tmp_path / "example")
    result = run_nkibuild(["build", "--toolchain", "fake", "-j", "2", "compile:rmsnorm*"], project)
    assert result.returncode == 0, result.stdout + result.stderr
    traced = artifact(project, "rmsnorm/tokens_128")
    assert traced["toolchain"] == {"nkipy": real_nkipy}  # not "...+nkibuild.fake"
    assert [t["name"] for t in traced["inputs"]] == ["x", "weight"]


def test_the_same_nkipy_kernel_in_two_checkouts_has_one_hlo_and_cache_key(
    real_nkipy: str, tmp_path: Path
) -> None:
    checkouts = [nki_nkipy_example(tmp_path / name / "example") for name in ("a", "bb")]
    for project in checkouts:
        result = run_nkibuild(["build", "--toolchain", "fake", "compile:rmsnorm*"], project)
        assert result.returncode == 0, result.stdout + result.stderr
    hlo = [
        (p / "build" / "extract" / "rmsnorm" / "tokens_128" / "model.hlo_module.pb").read_bytes()
        for p in checkouts
    ]
    assert hlo[0] == hlo[1]
    assert str(tmp_path).encode() not in hlo[0]  # no absolute path of either checkout
    keys = [
        json.loads((p / "build/compile/rmsnorm/tokens_128/trn2/result.json").read_text())
        for p in checkouts
    ]
    assert keys[0]["cache_key"] == keys[1]["cache_key"]


def test_a_release_containing_the_nkipy_example_uses_the_real_tracer(
    real_nkipy: str, tmp_path: Path
) -> None:
    root = tmp_path / "repo"
    project = nki_nkipy_example(root / "nki-nkipy")
    result = run_nkibuild(
        ["release", ".", "--out", "out", "--toolchain", "fake", "-j", "2"], root, timeout=600
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert list((root / "out").glob("acme_nki_kernels-0.1.0-*.whl"))
    assert artifact(project, "rmsnorm/tokens_512")["toolchain"] == {"nkipy": real_nkipy}


IN_PLACE = """\
format-version: 1
package: {name: in-place, version: 1.0.0}
defaults: {targets: [trn2]}
kernels:
  accumulate:
    frontend: nkipy
    source: k.py:accumulate
    inputs:
      acc: {shape: [4, 8], dtype: float32}
      x: {shape: [4, 8], dtype: float32}
"""


def test_a_kernel_that_writes_into_an_input_is_refused_with_what_to_write(
    real_nkipy: str, tmp_path: Path
) -> None:
    # The real tracer turns `acc[...] += x` into an extra output aliased to `acc`.
    kernel = "def accumulate(acc, x):\n    acc[...] += x\n    return acc * 2.0\n"
    project = write_project(tmp_path / "p", IN_PLACE, {"k.py": kernel})
    result = run_nkibuild(["build", "--toolchain", "fake"], project)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "k.py:accumulate writes into its input(s) acc" in result.stderr
    assert "return new arrays instead" in result.stderr
    fixed = "def accumulate(acc, x):\n    return (acc + x) * 2.0\n"
    (project / "k.py").write_text(fixed)
    assert run_nkibuild(["build", "--toolchain", "fake"], project).returncode == 0
