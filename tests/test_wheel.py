"""Bundle wheels: standards-conformant, installable with pip, reproducible, and callable."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from helpers import build, venv_with_this_environment

pytest.importorskip("jax")

WHEEL = "dist/acme_kernels-0.1.0-py3-none-any.whl"

CALL_KERNELS = """\
import sys
import numpy as np
import acme_kernels
assert "spike" not in sys.modules and "acme_kernels._runtime" not in sys.modules
from acme_kernels import scaled_add, softmax
x = np.arange(128 * 512, dtype=np.float32).reshape(128, 512)
y = np.ones((128, 512), dtype=np.float32)
np.testing.assert_allclose(scaled_add(x, y), 0.5 * x + y)
np.testing.assert_allclose(scaled_add(x, y=y, mode="reference"), 0.5 * x + y)
p = softmax(np.zeros((64, 1024), dtype=np.float32))
np.testing.assert_allclose(p, np.full((64, 1024), 1 / 1024, dtype=np.float32), rtol=1e-6)
print(sorted(scaled_add.variants), scaled_add.targets)
print(acme_kernels.build_info()["placeholder"])
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    project = tmp_path_factory.mktemp("wheel") / "project"
    shutil.copytree(Path(__file__).parents[1] / "examples", project)
    summary = build(project)
    assert summary.ok, summary.to_json()
    return project / WHEEL


def test_record_lists_every_file_with_its_hash(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        record_name = next(n for n in names if n.endswith(".dist-info/RECORD"))
        rows = list(csv.reader(io.StringIO(archive.read(record_name).decode())))
        assert sorted(row[0] for row in rows) == sorted(names)
        for path, digest, size in rows:
            if path == record_name:
                assert (digest, size) == ("", "")
                continue
            data = archive.read(path)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            assert digest == f"sha256={expected.decode()}"
            assert int(size) == len(data)
        wheel_meta = archive.read("acme_kernels-0.1.0.dist-info/WHEEL").decode()
        assert "Tag: py3-none-any" in wheel_meta and "Root-Is-Purelib: true" in wheel_meta
        metadata = archive.read("acme_kernels-0.1.0.dist-info/METADATA").decode()
        assert "Name: acme-kernels" in metadata and "Version: 0.1.0" in metadata
        assert "spike" not in metadata.lower().split("requires-dist")[-1]
        # spike is the host's runtime: a bundle never ships (a copy of) it.
        assert not [n for n in names if n.split("/")[0] == "spike"]
        entry_points = archive.read("acme_kernels-0.1.0.dist-info/entry_points.txt").decode()
        assert "[nkibuild.bundles]" in entry_points
        neffs = [n for n in names if n.endswith(".neff")]
        assert "acme_kernels/neff/trn2/softmax/default.neff" in neffs and len(neffs) == 7


def test_pip_installs_the_wheel_and_kernels_run_in_reference_mode(
    wheel: Path, tmp_path: Path
) -> None:
    # This interpreter's packages provide NumPy: the bundle's only dependency.
    python = venv_with_this_environment(tmp_path / "venv")
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert install.returncode == 0, install.stderr
    env = {k: v for k, v in os.environ.items() if k not in ("NKIBUILD_MODE", "NKIBUILD_TARGET")}
    run = subprocess.run(
        [str(python), "-c", CALL_KERNELS],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["['large', 'small'] ('trn1', 'trn2')", "True"]
    # The bundle says it runs on the CPU, and why.
    assert "runs in reference mode on the CPU" in run.stderr


def test_same_inputs_give_a_byte_identical_wheel(wheel: Path, tmp_path: Path) -> None:
    other = tmp_path / "elsewhere" / "project"
    shutil.copytree(Path(__file__).parents[1] / "examples", other)
    for path in other.rglob("*"):
        os.utime(path, (1_600_000_000, 1_600_000_000))
    summary = build(other)
    assert summary.ok
    assert (other / WHEEL).read_bytes() == wheel.read_bytes()


def test_a_bundle_file_edited_after_generation_is_not_packaged(wheel: Path, tmp_path: Path) -> None:
    from nkibuild.bundle import load_bundle
    from nkibuild.bundle.wheel import build_wheel
    from nkibuild.errors import BuildError

    bundle_dir = wheel.parents[1] / "build" / "bundle" / "acme-kernels"
    copy = tmp_path / "bundle"
    shutil.copytree(bundle_dir, copy)
    neff = copy / "acme_kernels" / "neff" / "trn2" / "softmax" / "default.neff"
    data = bytearray(neff.read_bytes())
    data[-1] ^= 0xFF  # one flipped bit pattern: always a change
    neff.write_bytes(bytes(data))
    with pytest.raises(BuildError, match=r"default\.neff changed after the bundle was generated"):
        build_wheel(load_bundle(copy), tmp_path / "dist")
    assert not (tmp_path / "dist").exists() or list((tmp_path / "dist").iterdir()) == []


def test_generated_code_passes_ruff(wheel: Path) -> None:
    """The loaders are generated from validated names only; they read like written code."""
    package = wheel.parents[1] / "build" / "bundle" / "acme-kernels" / "acme_kernels"
    files = [str(package / "__init__.py"), str(package / "_kernels"), str(package / "_runtime.py")]
    settings = ["--isolated", "--no-cache", "--line-length", "100"]
    lint = [sys.executable, "-m", "ruff", "check", *settings, "--select", "E,F,W,I,UP,B"]
    formatted = [sys.executable, "-m", "ruff", "format", "--check", *settings]
    for command in (lint, formatted):
        result = subprocess.run([*command, *files], capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stdout + result.stderr
