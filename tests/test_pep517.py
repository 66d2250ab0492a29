"""nkibuild as a PEP 517 backend: `pip wheel .` builds the same bundle as `nkibuild build`."""

from __future__ import annotations

import ast
import hashlib
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from conftest import run_nkibuild
from helpers import softmax_manifest, softmax_project, venv_with_this_environment

from nkibuild import build as backend
from nkibuild.toolchain_double.hlo_writer import build_hlo_module

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
# tarfile's extraction filters arrived in 3.10.12 / 3.11.4; 3.14 makes "data" the default.
SAFE_EXTRACT = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}


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
    assert backend.get_requires_for_build_sdist() == []
    settings = {"toolchain": "fake", "jobs": "2", "cache-read-only": "false"}
    name = backend.build_wheel(str(tmp_path / "wheels"), settings)
    assert name == WHEEL and (tmp_path / "wheels" / WHEEL).is_file()
    assert (root / "build" / "compile" / "softmax" / "default" / "trn2" / "model.neff").is_file()
    assert (root / "dist" / WHEEL).read_bytes() == (tmp_path / "wheels" / WHEEL).read_bytes()


@pytest.mark.parametrize(
    ("settings", "pyproject_name", "expected"),
    [
        ({"toolchian": "fake"}, "pep-kernels", "unknown config setting(s) 'toolchian'"),
        ({"jobs": "many"}, "pep-kernels", "config setting jobs='many' is not a number"),
        ({"cache-read-only": "maybe"}, "pep-kernels", "expected true or false"),
        ({"manifest": "missing.yaml"}, "pep-kernels", "missing.yaml"),
        ({}, "Other_Name", "names the project 'Other_Name' but"),
    ],
)
def test_hook_errors_carry_nkibuilds_message(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    settings: dict[str, str],
    pyproject_name: str,
    expected: str,
) -> None:
    monkeypatch.chdir(kernel_project(tmp_path / "p", name=pyproject_name))
    for hook in (backend.build_wheel, backend.build_sdist):
        with pytest.raises(backend.BackendError) as raised:
            hook(str(tmp_path / "out"), {"toolchain": "fake", **settings})
        assert expected in str(raised.value)
    assert not (tmp_path / "out").exists()


BUILD_SYSTEM = PYPROJECT.partition("[project]")[0]


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        ('project = "pep-kernels"', "[project] is a str, not a table"),
        ('[[project]]\nname = "pep-kernels"', "[project] is a list, not a table"),
        ("[project]", "name must be a valid distribution name (a string), not None"),
        ('[project]\nversion = "0.3.0"', "not None"),
        ('[project]\nname = 5\nversion = "0.3.0"', "not 5"),
        ('[project]\nname = "pep kernels!"\nversion = "0.3.0"', "not 'pep kernels!'"),
        ('[project]\nname = ["pep-kernels"]\nversion = "0.3.0"', "not ['pep-kernels']"),
        (
            '[project]\nname = "pep-kernels"\nversion = 0.3',
            "version must be a PEP 440 version (a string), not 0.3",
        ),
        ('[project]\nname = "pep-kernels"', "give a version or list it in dynamic"),
        (
            '[project]\nname = "pep-kernels"\nversion = "0.3.0"\ndynamic = ["version"]',
            "give a version or list it in dynamic, one of the two",
        ),
        ('[project]\nname = "pep-kernels"\ndynamic = ["name", "version"]', "name cannot be"),
        ('[project]\nname = "pep-kernels"\ndynamic = "version"', "dynamic must be a list"),
        ('[project]\nname = "pep-kernels"\ndynamic = [1]', "dynamic must be a list"),
        ('[project]\nname = "pep-kernels"\nversion = "three"', "not 'three'"),
    ],
)
def test_a_malformed_project_table_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, table: str, expected: str
) -> None:
    root = softmax_project(
        tmp_path / "p", MANIFEST, {"pyproject.toml": f"{table}\n\n{BUILD_SYSTEM}"}
    )
    monkeypatch.chdir(root)
    for hook in (backend.build_sdist, backend.build_wheel, backend.build_editable):
        with pytest.raises(backend.BackendError) as raised:
            hook(str(tmp_path / "out"), {"toolchain": "fake"})
        assert "pyproject.toml: [project]" in str(raised.value) and expected in str(raised.value)
    assert not (tmp_path / "out").exists() and not (root / "build" / "compile").exists()


@pytest.mark.parametrize("table", ["", '[project]\nname = "PEP_kernels"\ndynamic = ["version"]'])
def test_a_project_table_may_be_absent_or_leave_the_version_to_the_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, table: str
) -> None:
    root = softmax_project(
        tmp_path / "p", MANIFEST, {"pyproject.toml": f"{table}\n\n{BUILD_SYSTEM}"}
    )
    monkeypatch.chdir(root)
    assert backend.build_sdist(str(tmp_path / "out")) == "pep_kernels-0.3.0.tar.gz"


def test_pep_503_equal_names_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(kernel_project(tmp_path / "p", name="PEP.Kernels"))
    assert backend.build_sdist(str(tmp_path / "out")) == "pep_kernels-0.3.0.tar.gz"


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


def test_sdist_carries_deps_but_no_outputs_or_bytecode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest = MANIFEST + "    deps: ['kernels/**', 'build/**', 'dist/*']\n"
    root = softmax_project(
        tmp_path / "p",
        manifest,
        {
            "pyproject.toml": PYPROJECT.format(name="pep-kernels"),
            "kernels/helpers/tiles.py": "TILE = 128\n",
            "kernels/__pycache__/reference.cpython-311.pyc": b"\0",
            "build/stale.py": "",
            "dist/old.whl": b"",
            "notes.txt": "not referred to\n",
        },
    )
    with tarfile.open(sdist(root, tmp_path / "out", monkeypatch)) as archive:
        names = archive.getnames()
    assert [name.partition("/")[2] for name in names] == [
        "PKG-INFO",
        "kernels/helpers/tiles.py",
        "kernels/reference.py",
        "kernels/softmax.hlo.pb",
        "nkibuild.yaml",
        "pyproject.toml",
    ]


def test_a_manifest_below_the_project_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Paths are relative to pyproject.toml's directory; the sdist keeps the layout."""
    root = tmp_path / "p"
    softmax_project(root / "neuron", MANIFEST)
    (root / "pyproject.toml").write_text(PYPROJECT.format(name="pep-kernels"))
    settings = {"manifest": "neuron/nkibuild.yaml", "toolchain": "fake"}
    monkeypatch.chdir(root)
    archive = tmp_path / "sdist" / backend.build_sdist(str(tmp_path / "sdist"), settings)
    with tarfile.open(archive) as opened:
        assert "pep_kernels-0.3.0/neuron/kernels/softmax.hlo.pb" in opened.getnames()
        opened.extractall(tmp_path / "unpacked", **SAFE_EXTRACT)
    unpacked = tmp_path / "unpacked" / "pep_kernels-0.3.0"
    monkeypatch.chdir(unpacked)
    assert backend.build_wheel(str(tmp_path / "wheels"), settings) == WHEEL
    assert (unpacked / "dist" / WHEEL).is_file() and not (unpacked / "neuron" / "dist").exists()


def test_an_sdist_cannot_carry_files_outside_the_project(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    softmax_project(tmp_path / "elsewhere", MANIFEST)
    monkeypatch.chdir(kernel_project(tmp_path / "p"))
    with pytest.raises(backend.BackendError, match="is outside the project"):
        backend.build_sdist(str(tmp_path / "out"), {"manifest": "../elsewhere/nkibuild.yaml"})


def test_docs_list_exactly_the_config_settings_the_backend_accepts() -> None:
    import re

    from nkibuild.build import PROJECT_SETTINGS
    from nkibuild.settings import config_settings

    doc = (Path(__file__).resolve().parents[1] / "docs" / "pep517.md").read_text()
    table = doc.split("## Config settings", 1)[1].split("\n\n", 2)[1]
    listed = re.findall(r"^\| `([a-z-]+)` \|", table, re.M)
    assert sorted(listed) == sorted(PROJECT_SETTINGS + config_settings())


SHOW_INSTALLED = """\
import json
import numpy as np
import pep_kernels
info = pep_kernels.build_info()["kernels"]
shas = {}
for name, kernel in sorted(info.items()):
    shape = tuple(kernel["variants"]["default"]["inputs"][0]["shape"])
    out = getattr(pep_kernels, name)(np.zeros(shape, dtype=np.float32))
    np.testing.assert_allclose(out, np.full(shape, 1 / shape[1]), rtol=1e-6)
    shas[name] = kernel["neffs"]["trn2"]["default"]["sha256"]
print(json.dumps({"file": pep_kernels.__file__, "sha256": shas}))
"""
WIDE_KERNEL = """\
  wide_softmax:
    frontend: hlo
    source: kernels/wide.hlo.pb
    reference: kernels/reference.py:softmax
    inputs:
      logits: {shape: [64, 2048], dtype: float32}
"""


def editable_env(tmp_path: Path, project: Path) -> Path:
    """A virtualenv that sees this interpreter's packages (NumPy, nkibuild for the
    backend), with `pip install -e project`."""
    python = venv_with_this_environment(tmp_path / "venv")
    command = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps"]
    command += ["--no-build-isolation", "-C", "toolchain=fake", "-e", str(project)]
    installed = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, "CI": "true"}, timeout=300
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return python


def installed_state(python: Path, cwd: Path) -> dict:
    import json

    shown = subprocess.run(
        [str(python), "-c", SHOW_INSTALLED], capture_output=True, text=True, cwd=cwd, timeout=120
    )
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)


def compiled_sha256(project: Path, kernel: str) -> str:
    import json

    record = project / "build" / "compile" / kernel / "default" / "trn2" / "result.json"
    return json.loads(record.read_text())["sha256"]


def hlo_module(name: str, shape: tuple[int, int]) -> bytes:
    return build_hlo_module(name, [("logits", "float32", shape)], [("float32", shape)])


def test_an_editable_install_follows_each_build(tmp_path: Path) -> None:
    """pip install -e: the package is the bundle in the build dir, so `nkibuild build`
    after an edited kernel and an added one changes it without a reinstall."""
    root = kernel_project(tmp_path / "p")
    python = editable_env(tmp_path, root)
    bundle_dir = root / "build" / "bundle" / "pep-kernels"
    pth = sorted((tmp_path / "venv").glob("lib/python*/site-packages/__editable__.*.pth"))
    assert [p.name for p in pth] == ["__editable__.pep_kernels-0.3.0.pth"]
    finder = "import __editable___nkibuild_pep_kernels_finder\n"  # says what to run after clean
    assert pth[0].read_text() == finder  # the path is a literal in that module, not a line
    before = installed_state(python, tmp_path)
    assert before == {
        "file": str(bundle_dir / "pep_kernels" / "__init__.py"),
        "sha256": {"softmax": compiled_sha256(root, "softmax")},
    }

    (root / "kernels" / "softmax.hlo.pb").write_bytes(hlo_module("edited", (64, 1024)))
    (root / "kernels" / "wide.hlo.pb").write_bytes(hlo_module("wide", (64, 2048)))
    manifest = root / "nkibuild.yaml"
    manifest.write_text(manifest.read_text() + WIDE_KERNEL)
    rebuilt = run_nkibuild(["build", "--toolchain", "fake"], root)
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr

    after = installed_state(python, tmp_path)
    assert after["file"] == before["file"]
    assert after["sha256"] == {k: compiled_sha256(root, k) for k in ("softmax", "wide_softmax")}
    assert after["sha256"]["softmax"] != before["sha256"]["softmax"]  # the edited kernel's NEFF
    assert [p.read_text() for p in pth] == [finder]  # not reinstalled


def test_editable_hooks_in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = kernel_project(tmp_path / "p")
    monkeypatch.chdir(root)
    assert backend.get_requires_for_build_editable() == []
    settings = {"toolchain": "fake"}
    dist_info = backend.prepare_metadata_for_build_editable(str(tmp_path / "meta"), settings)
    assert dist_info == "pep_kernels-0.3.0.dist-info"
    metadata = (tmp_path / "meta" / dist_info / "METADATA").read_text()
    assert "Name: pep-kernels\nVersion: 0.3.0\n" in metadata and "Requires-Dist: numpy" in metadata
    name = backend.build_editable(str(tmp_path / "wheels"), settings, str(tmp_path / "meta"))
    assert name == WHEEL
    with zipfile.ZipFile(tmp_path / "wheels" / WHEEL) as archive:
        assert sorted(archive.namelist()) == [
            "__editable__.pep_kernels-0.3.0.pth",
            "__editable___nkibuild_pep_kernels_finder.py",
            f"{dist_info}/METADATA",
            f"{dist_info}/RECORD",
            f"{dist_info}/WHEEL",
            f"{dist_info}/entry_points.txt",
        ]
        assert archive.read(f"{dist_info}/METADATA").decode() == metadata
    wheel_meta = backend.prepare_metadata_for_build_wheel(str(tmp_path / "wheel-meta"), settings)
    assert (tmp_path / "wheel-meta" / wheel_meta / "METADATA").read_text() == metadata


def test_an_editable_split_bundle_puts_its_target_parts_on_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parts are not installed separately: the editable finder module puts their
    directories on the path, and the metadata does not require them (pip would look for
    them on an index)."""
    manifest = softmax_manifest("{name: pep-kernels, version: 0.3.0, split-targets: true}")
    root = softmax_project(
        tmp_path / "p", manifest, {"pyproject.toml": PYPROJECT.format(name="pep-kernels")}
    )
    monkeypatch.chdir(root)
    name = backend.build_editable(str(tmp_path / "wheels"), {"toolchain": "fake"})
    with zipfile.ZipFile(tmp_path / "wheels" / name) as archive:
        pth = archive.read("__editable__.pep_kernels-0.3.0.pth").decode()
        finder = archive.read("__editable___nkibuild_pep_kernels_finder.py").decode()
        metadata = archive.read("pep_kernels-0.3.0.dist-info/METADATA").decode()
    bundle_dir = root / "build" / "bundle" / "pep-kernels"
    assert pth == "import __editable___nkibuild_pep_kernels_finder\n"
    paths = ast.literal_eval(re.search(r"^DIRECTORIES = (.*)$", finder, re.MULTILINE)[1])
    assert paths == [
        str(bundle_dir),
        *(str(bundle_dir / "parts" / f"pep_kernels_{t}") for t in ("trn1", "trn2")),
    ]
    for target, part in zip(("trn1", "trn2"), paths[1:], strict=True):
        package = Path(part) / f"pep_kernels_{target}"
        assert (package / "neff" / target / "softmax" / "default.neff").is_file()
    assert "pep-kernels-trn" not in metadata and "Provides-Extra" not in metadata
    # The metadata hooks write what each wheel holds, for the editable wheel and the real one.
    settings = {"toolchain": "fake"}
    dist_info = backend.prepare_metadata_for_build_editable(str(tmp_path / "meta"), settings)
    assert (tmp_path / "meta" / dist_info / "METADATA").read_text() == metadata
    dist_info = backend.prepare_metadata_for_build_wheel(str(tmp_path / "wheel-meta"), settings)
    wheel = backend.build_wheel(str(tmp_path / "wheels"), settings)
    with zipfile.ZipFile(tmp_path / "wheels" / wheel) as archive:
        wheel_metadata = archive.read(f"{dist_info}/METADATA").decode()
    assert "Provides-Extra: trn1" in wheel_metadata
    assert (tmp_path / "wheel-meta" / dist_info / "METADATA").read_text() == wheel_metadata
    assert sorted(p.name for p in (tmp_path / "wheel-meta" / dist_info).iterdir()) == [
        "METADATA",
        "WHEEL",
        "entry_points.txt",
    ]
