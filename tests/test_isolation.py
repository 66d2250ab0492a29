"""Every artifact from its own project (issue 13): projects whose kernel files and helper
modules share names never see each other's code, in a release (-j 2), in two builds
running at once in one process, and in PEP 517 hook calls made one after another."""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import run_nkibuild
from helpers import build, write_project

from nkibuild.settings import BuildOptions

pytest.importorskip("jax")

MANIFEST = """\
format-version: 1
package: {{name: {name}, version: 1.0.0}}
defaults: {{targets: [trn2]}}
kernels:
  scale:
    frontend: jax
    source: kernels/kernels.py:scale
    inputs:
      x: {{shape: [8, 16], dtype: float32}}
"""
# The same file names everywhere; `import utils` resolves next to the kernel file.
KERNELS = "from utils import factor\n\n\ndef scale(x):\n    return x * factor(){extra}\n"
UTILS = "def factor():\n    return {factor}\n"
# alpha and beta differ only in their helper module; gamma only in its kernel body.
PROJECTS = {
    "alpha": {"factor": "2.0", "extra": ""},
    "beta": {"factor": "3.0", "extra": ""},
    "gamma": {"factor": "2.0", "extra": " + 1.0"},
}


def make_project(root: Path, name: str) -> Path:
    parts = PROJECTS[name]
    return write_project(
        root,
        MANIFEST.format(name=name),
        {
            "kernels/kernels.py": KERNELS.format(extra=parts["extra"]),
            "kernels/utils.py": UTILS.format(factor=parts["factor"]),
        },
    )


def neffs(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as archive:
        return {n: archive.read(n) for n in archive.namelist() if n.endswith(".neff")}


def wheel_of(directory: Path, name: str) -> Path:
    (wheel,) = directory.glob(f"{name}-1.0.0-*.whl")
    return wheel


def alone(project: Path, cache: Path) -> dict[str, bytes]:
    """The project's NEFFs built by itself, from a clean build dir and a fresh cache."""
    shutil.rmtree(project / "build", ignore_errors=True)
    shutil.rmtree(project / "dist", ignore_errors=True)
    summary = build(project, options=BuildOptions(toolchain="fake", cache_dir=cache))
    assert summary.ok, summary.failures
    return neffs(wheel_of(project / "dist", project.name))


def test_release_builds_each_project_from_its_own_code(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    projects = [make_project(root / name, name) for name in PROJECTS]
    result = run_nkibuild(["release", ".", "--out", "out", "--toolchain", "fake", "-j", "2"], root)
    assert result.returncode == 0, result.stdout + result.stderr
    released = {p.name: neffs(wheel_of(root / "out", p.name)) for p in projects}
    for project in projects:
        assert released[project.name] == alone(project, tmp_path / f"cache-{project.name}")
    # Not vacuous: the three projects' kernels really compile to three different NEFFs.
    assert len({tuple(sorted(n.values())) for n in released.values()}) == 3


def test_two_builds_at_once_in_one_process_share_nothing(tmp_path: Path) -> None:
    projects = [make_project(tmp_path / name, name) for name in ("alpha", "beta")]
    summaries: dict[str, object] = {}

    def run(project: Path) -> None:
        options = BuildOptions(toolchain="fake", cache_dir=tmp_path / f"cache-{project.name}")
        summaries[project.name] = build(project, jobs=2, options=options)

    threads = [threading.Thread(target=run, args=(p,)) for p in projects]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert all(s.ok for s in summaries.values()), summaries  # type: ignore[attr-defined]
    together = {p.name: wheel_of(p / "dist", p.name).read_bytes() for p in projects}
    for project in projects:
        alone(project, tmp_path / f"fresh-{project.name}")
        assert wheel_of(project / "dist", project.name).read_bytes() == together[project.name]
    assert together["alpha"] != together["beta"]


@contextlib.contextmanager
def working_directory(path: Path) -> Iterator[None]:
    before = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def test_pep517_hooks_in_one_process_build_each_project_from_its_own_code(
    tmp_path: Path,
) -> None:
    from nkibuild import build as backend

    projects = [make_project(tmp_path / name, name) for name in ("alpha", "beta", "gamma")]
    out = tmp_path / "wheels"
    out.mkdir()
    hooked = {}
    for project in projects:
        with working_directory(project):
            name = backend.build_wheel(str(out), {"toolchain": "fake"})
        hooked[project.name] = neffs(out / name)
    for project in projects:
        assert hooked[project.name] == alone(project, tmp_path / f"cache-{project.name}")
    assert len({tuple(sorted(n.values())) for n in hooked.values()}) == 3


TWO_FOLDERS = """\
format-version: 1
package: {name: folders, version: 1.0.0}
defaults: {targets: [trn2]}
kernels:
"""


def kernel_entry(name: str, source: str) -> str:
    return (
        f"  {name}:\n    frontend: jax\n    source: {source}\n"
        "    inputs:\n      x: {shape: [8, 16], dtype: float32}\n"
    )


def test_kernel_folders_of_one_project_each_import_their_own_helpers(tmp_path: Path) -> None:
    # a/utils.py and b/utils.py: each kernel must get its neighbour; and two files whose
    # paths flatten to the same name (a_b/c.py, a/b_c.py) must stay two modules.
    body = "from utils import factor\n\n\ndef scale(x):\n    return x * factor()\n"
    files = {
        "a/k.py": body,
        "a/utils.py": UTILS.format(factor="2.0"),
        "b/k.py": body,
        "b/utils.py": UTILS.format(factor="3.0"),
        "a_b/c.py": "def f(x):\n    return x + 1.0\n",
        "a/b_c.py": "def f(x):\n    return x - 1.0\n",
    }
    sources = {"ka": "a/k.py:scale", "kb": "b/k.py:scale", "kc": "a_b/c.py:f", "kd": "a/b_c.py:f"}
    manifest = TWO_FOLDERS + "".join(kernel_entry(n, s) for n, s in sources.items())
    project = write_project(tmp_path / "p", manifest, files)
    assert build(project, options=BuildOptions(toolchain="fake")).ok
    hlo = {
        name: (project / "build/extract" / name / "default/model.hlo_module.pb").read_bytes()
        for name in sources
    }
    assert hlo["ka"] != hlo["kb"] and hlo["kc"] != hlo["kd"]
    # Each matches its kernel traced alone, in a project of its own.
    for name, source in sources.items():
        folder = source.split("/")[0]
        alone_files = {k: v for k, v in files.items() if k.startswith(f"{folder}/")}
        other = write_project(
            tmp_path / f"alone-{name}", TWO_FOLDERS + kernel_entry(name, source), alone_files
        )
        assert build(other, options=BuildOptions(toolchain="fake")).ok
        extracted = other / "build/extract" / name / "default/model.hlo_module.pb"
        assert extracted.read_bytes() == hlo[name], name
