"""Builds whose nkipy kernels are traced by an installed REAL nkipy: the toolchain double
stands in for nkipy only where it is absent. nkipy is not installable from a package
registry; every test skips, saying why, where the real tracer is not installed."""

from __future__ import annotations

import json
import shutil
from importlib import metadata
from pathlib import Path

import pytest
from conftest import EXAMPLES, run_nkibuild


@pytest.fixture(scope="module")
def real_nkipy() -> str:
    """The installed nkipy's version; skip unless the real tracer is installed."""
    try:
        version = metadata.version("nkipy")
        files = metadata.files("nkipy") or []
    except metadata.PackageNotFoundError:
        pytest.skip("the real nkipy tracer (aws-neuron/nkipy's wheel) is not installed here")
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
