"""Helpers for tests that build projects in-process."""

from __future__ import annotations

import contextlib
import importlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from nkibuild.context import load_context
from nkibuild.graph.report import BuildSummary, TaskOutcome
from nkibuild.graph.run import RunOptions, run_build
from nkibuild.settings import BuildOptions


class QuietDisplay:
    def start(self, tasks: int) -> None:
        pass

    def task_started(self, name: str) -> None:
        pass

    def task_finished(self, outcome: TaskOutcome) -> None:
        pass

    def finish(self, summary: BuildSummary) -> None:
        pass


def build(
    project: Path,
    *selection: str,
    keep_going: bool = False,
    jobs: int = 1,
    options: BuildOptions | None = None,
) -> BuildSummary:
    """Build a project with the toolchain double; returns what doit reported."""
    context = load_context(
        project / "nkibuild.yaml",
        project / "build",
        project / "dist",
        options or BuildOptions(toolchain="fake"),
    )
    options = RunOptions(selection=selection, keep_going=keep_going, jobs=jobs)
    return run_build(context, options, QuietDisplay())


def write_project(root: Path, manifest: str, files: dict[str, bytes | str] | None = None) -> Path:
    """A project dir with nkibuild.yaml and the given files (text or bytes)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "nkibuild.yaml").write_text(manifest)
    for name, content in (files or {}).items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return root


def prebuilt_project(root: Path, kernels: int = 3, targets: str = "[trn1]") -> Path:
    """Prebuilt-HLO kernels k0, k1, ... of distinct shapes."""
    lines = ["format-version: 1", "package: {name: ahead, version: 1.0.0}", "kernels:"]
    files: dict[str, bytes | str] = {}
    for index in range(kernels):
        width = 8 + index
        files[f"kernels/k{index}.pb"] = module(f"k{index}", width)
        lines += [
            f"  k{index}:",
            "    frontend: hlo",
            f"    source: kernels/k{index}.pb",
            f"    inputs: {{x: {{shape: [4, {width}], dtype: float32}}}}",
            f"    targets: {targets}",
        ]
    return write_project(root, "\n".join(lines) + "\n", files)


def module(name: str, width: int) -> bytes:
    """An HLO module named `name` of x: float32[4, width] -> the same."""
    from nkibuild.toolchain_double.hlo_writer import build_hlo_module

    return build_hlo_module(name, [("x", "float32", (4, width))], [("float32", (4, width))])


EXAMPLE_KERNELS = Path(__file__).resolve().parents[1] / "examples" / "kernels"


def softmax_manifest(
    package: str = "{name: softmax-kernels, version: 0.1.0}",
    *,
    defaults: str = "{targets: [trn1, trn2]}",
    kernel: str = "",
    top: str = "",
    reference: bool = False,
) -> str:
    """A manifest of the examples' prebuilt-HLO softmax (no tracing: the fastest project)."""
    lines = [
        "format-version: 1",
        f"package: {package}",
        f"defaults: {defaults}",
        *([top.rstrip("\n")] if top else []),
        "kernels:",
        "  softmax:",
        "    frontend: hlo",
        "    source: kernels/softmax.hlo.pb",
        *(["    reference: kernels/reference.py:softmax"] if reference else []),
        "    inputs:",
        "      logits: {shape: [64, 1024], dtype: float32}",
    ]
    return "\n".join(lines) + "\n" + kernel


def softmax_project(root: Path, manifest: str, files: dict[str, bytes | str] | None = None) -> Path:
    """A project with `manifest`, the softmax HLO and its reference."""
    shipped: dict[str, bytes | str] = {
        "kernels/softmax.hlo.pb": (EXAMPLE_KERNELS / "softmax.hlo.pb").read_bytes(),
        "kernels/reference.py": (EXAMPLE_KERNELS / "reference.py").read_text(),
    }
    return write_project(root, manifest, {**shipped, **(files or {})})


def monorepo(root: Path) -> Path:
    """A git repository with two projects sharing the softmax kernel on trn1-3, plus
    places release discovery must skip (hidden, build, dist, a venv, git-ignored)."""
    import subprocess

    for name in ("alpha", "beta"):
        manifest = softmax_manifest(
            f"{{name: {name}-kernels, version: 1.0.0}}",
            defaults="{targets: [trn1, trn2, trn3]}",
            reference=True,
        )
        softmax_project(root / "kernels" / name, manifest)
    skipped = softmax_manifest("{name: skipped, version: 1.0.0}")
    for place in (".hidden", "build/x", "dist", "env", "ignored", "node_modules/y"):
        softmax_project(root / place, skipped)
    (root / "env" / "pyvenv.cfg").write_text("home = /usr\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / ".gitignore").write_text("ignored/\n")
    return root


def pretend_new_compiler(monkeypatch: pytest.MonkeyPatch, version: str = "2.99.0.0+other") -> None:
    """Make the double answer `--version` (and build NEFFs) as `version`, as if a new
    compiler had been installed (its files' stat unchanged)."""
    monkeypatch.setenv("NKIBUILD_FAKE_CC_VERSION", version)


@contextlib.contextmanager
def imported_bundle(project_dir: Path, package: str) -> Iterator[ModuleType]:
    """A generated bundle project (build/bundle/<distribution>) imported in this process,
    and forgotten afterwards (sys.path and sys.modules as before)."""
    sys.path.insert(0, str(project_dir))
    try:
        yield importlib.import_module(package)
    finally:
        sys.path.remove(str(project_dir))
        for name in [m for m in sys.modules if m.split(".")[0] == package]:
            del sys.modules[name]


def manifests_parsed(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The manifests parsed from now on (a build served by the plan cache parses none)."""
    import nkibuild.manifest

    parsed: list[Path] = []
    load_manifest = nkibuild.manifest.load_manifest

    def counted(path: Path) -> object:
        parsed.append(path)
        return load_manifest(path)

    monkeypatch.setattr(nkibuild.manifest, "load_manifest", counted)
    return parsed


class RemovesWhenLoaded:
    """What a crafted pickle in a build dir could hold: unpickling it calls os.remove."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.remove, (str(self.path),)


def venv_with_this_environment(directory: Path) -> Path:
    """A virtualenv that sees what this interpreter sees (nkibuild, jax, numpy, pip), also
    when this interpreter is itself a virtualenv's: `--system-site-packages` would give
    the base interpreter's only. Returns its python, whose `-m pip` installs into it: half
    the CPU of `pip --python`, which starts pip once here and again in the virtualenv."""
    import venv

    venv.EnvBuilder(with_pip=False).create(directory)
    python = directory / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    entries = [entry for entry in sys.path if entry and Path(entry).is_dir()]
    Path(site, "_this_environment.pth").write_text("\n".join(entries) + "\n")
    return python


def ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


def failed(
    result: subprocess.CompletedProcess[str], exit_code: int
) -> subprocess.CompletedProcess[str]:
    """A failure nkibuild reports itself: the expected exit code and no traceback."""
    assert result.returncode == exit_code, f"{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stdout + result.stderr
    return result
