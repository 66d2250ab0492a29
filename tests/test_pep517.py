"""nkibuild as a PEP 517 backend: `pip wheel .` builds the same bundle as `nkibuild build`."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import run_nkibuild
from helpers import softmax_manifest, softmax_project

from nkibuild import build as backend

MANIFEST = softmax_manifest("{name: pep-kernels, version: 0.3.0}", reference=True)
PYPROJECT = """\
[build-system]
requires = ["nkibuild"]
build-backend = "nkibuild.build"

[project]
name = "{name}"
version = "0.3.0"
"""
WHEEL = "pep_kernels-0.3.0-py3-none-any.whl"


def kernel_project(root: Path, name: str = "pep-kernels") -> Path:
    return softmax_project(root, MANIFEST, {"pyproject.toml": PYPROJECT.format(name=name)})


def pip_wheel(target: Path | str, out: Path, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "pip", "wheel", str(target), "--no-build-isolation"]
    command += ["--no-deps", "-w", str(out), "-C", "toolchain=fake"]
    return subprocess.run(
        command,
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "CI": "true", **env},
        timeout=300,
        check=False,
    )


def test_pip_wheel_builds_the_same_wheel_as_the_cli(tmp_path: Path) -> None:
    root = kernel_project(tmp_path / "a")
    result = pip_wheel(".", tmp_path / "out", root)
    assert result.returncode == 0, result.stdout + result.stderr
    other = kernel_project(tmp_path / "b")
    assert run_nkibuild(["build", "--toolchain", "fake"], other).returncode == 0
    assert (tmp_path / "out" / WHEEL).read_bytes() == (other / "dist" / WHEEL).read_bytes()


def test_hooks_in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = kernel_project(tmp_path / "p")
    monkeypatch.chdir(root)
    assert backend.get_requires_for_build_wheel() == []
    name = backend.build_wheel(str(tmp_path / "wheels"), {"toolchain": "fake"})
    assert name == WHEEL and (tmp_path / "wheels" / WHEEL).is_file()
    assert (root / "build" / "compile" / "softmax" / "default" / "trn2" / "model.neff").is_file()


def sdist(root: Path, out: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(root)
    return out / backend.build_sdist(str(out))


def test_sdist_is_complete_reproducible_and_builds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = sdist(kernel_project(tmp_path / "a"), tmp_path / "sdist-a", monkeypatch)
    assert first.name == "pep_kernels-0.3.0.tar.gz"
    with tarfile.open(first) as archive:
        names = archive.getnames()
        info = archive.extractfile("pep_kernels-0.3.0/PKG-INFO").read().decode()
    assert names == sorted(
        f"pep_kernels-0.3.0/{path}"
        for path in (
            "PKG-INFO",
            "kernels/reference.py",
            "kernels/softmax.hlo.pb",
            "nkibuild.yaml",
            "pyproject.toml",
        )
    )
    assert "Name: pep-kernels\nVersion: 0.3.0\n" in info
    elsewhere = kernel_project(tmp_path / "elsewhere" / "b")
    for path in elsewhere.rglob("*"):
        os.utime(path, (1_700_000_000, 1_700_000_000))
    second = sdist(elsewhere, tmp_path / "sdist-b", monkeypatch)
    digests = {hashlib.sha256(p.read_bytes()).hexdigest() for p in (first, second)}
    assert len(digests) == 1
    result = pip_wheel(first, tmp_path / "from-sdist", tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "from-sdist" / WHEEL).is_file()


def test_a_project_table_that_disagrees_with_the_manifest_is_refused(tmp_path: Path) -> None:
    root = kernel_project(tmp_path / "p", name="other-name")
    result = pip_wheel(".", tmp_path / "out", root)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "names the project 'other-name' but" in output and "builds 'pep-kernels'" in output
    assert "Traceback" not in output


def test_a_failing_compile_fails_pip_with_the_compilers_message(tmp_path: Path) -> None:
    root = kernel_project(tmp_path / "p")
    result = pip_wheel(".", tmp_path / "out", root, NKIBUILD_FAKE_CC_FAULT="exit70")
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "the bundle could not be built" in output
    assert "neuronx-cc failed" in output and "exit status: 70" in output
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())
