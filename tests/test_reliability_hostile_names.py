"""Hostile names and paths in a manifest, through the real CLI: each is refused with
file:line:col and exit 2, nothing is written outside the build and dist dirs, and
no generated file contains it. Every name slot meets every hostile value."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from campaign import record
from conftest import EXAMPLES

from nkibuild.cli.main import main

TEMPLATE = """\
format-version: 1
package:
  name: {package}
  version: 0.1.0
defaults:
  targets: [trn2]
kernels:
  {kernel}:
    frontend: jax
    source: {source}
    reference: {reference}
    deps: [{deps}]
    inputs:
      {input}: {{shape: [128, 512], dtype: float32}}
      y: {{shape: [128, 512], dtype: float32}}
    constants:
      {constant}: 0.5
    variants:
      {variant}: {{{input}: [128, 512], y: [128, 512]}}
"""
FINE = {
    "package": "demo",
    "kernel": "scaled_add",
    "source": "kernels/jax_kernels.py:scaled_add",
    "reference": "kernels/reference.py:scaled_add",
    "deps": "kernels/*.py",
    "input": "x",
    "constant": "alpha",
    "variant": "v1",
}
HOSTILE_NAMES = [
    "../../x",
    "/tmp/x",
    "__import__('os')",
    "class",  # a Python keyword
    "\u0455caled_add",  # Cyrillic dze, looks like "s"
    "scaled\u200badd",  # a zero-width space
    "\uff21bc",  # fullwidth A
    "\u212aelvin",  # the Kelvin sign, NFKC-equal to "K"
    "a" * 300,
    "x; rm -rf ~",
    "$(touch pwned)",
    "..",
    "a\\b",
    "",
    "x\ny",
]
HOSTILE_PATHS = {
    "source": ["../../x.py:f", "/etc/x.py:f", "kernels/../../x.py:f",
               "kernels/jax_kernels.py:__import__", "kernels/jax_kernels.py:os.system"],
    "reference": ["../../x.py:f", "/etc/x.py:f", "kernels/reference.py:__import__",
                  "kernels/reference.py:class", "kernels/reference.py:\u0455caled_add"],
    "deps": ["../../*", "/etc/*", "kernels/../../*"],
}  # fmt: skip
NAME_SLOTS = ("package", "kernel", "input", "constant", "variant")
CASES = [(slot, value) for slot in NAME_SLOTS for value in HOSTILE_NAMES] + [
    (slot, value) for slot, values in HOSTILE_PATHS.items() for value in values
]
BILLION_LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + n)}: &{chr(98 + n)} [{', '.join([f'*{chr(97 + n)}'] * 10)}]\n" for n in range(8)
)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the project, so writes beside or above it would show."""
    root = tmp_path_factory.mktemp("hostile")
    shutil.copytree(EXAMPLES / "kernels", root / "project" / "kernels")
    return root


def files_under(root: Path) -> set[Path]:
    return {path for path in root.rglob("*")}


def run_build(
    workspace: Path, text: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> tuple[int, str, set[Path]]:
    project = workspace / "project"
    (project / "nkibuild.yaml").write_text(text, encoding="utf-8")
    for output in ("build", "dist"):
        shutil.rmtree(project / output, ignore_errors=True)
    before = files_under(workspace)
    monkeypatch.chdir(project)
    code = main(["build", "--toolchain", "fake"])
    written = files_under(workspace) - before
    return code, capsys.readouterr().err, written


def test_the_template_builds_when_nothing_is_hostile(
    workspace: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    code, err, _ = run_build(workspace, TEMPLATE.format(**FINE), monkeypatch, capsys)
    assert code == 0, err


@pytest.mark.parametrize(("slot", "value"), CASES, ids=[f"{s}-{v!r:.30}" for s, v in CASES])
def test_hostile_value_is_refused_and_nothing_is_written(
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    slot: str,
    value: str,
) -> None:
    text = TEMPLATE.format(**{**FINE, slot: json.dumps(value)})
    code, err, written = run_build(workspace, text, monkeypatch, capsys)
    assert code == 2, err
    assert "Traceback" not in err
    assert "nkibuild.yaml:" in err and ": error: " in err, err
    project = workspace / "project"
    outputs = (project / "build", project / "dist")
    assert all(any(out in path.parents for out in outputs) for path in written), written
    for path in written:
        if path.is_file() and value:
            assert value.encode() not in path.read_bytes(), path


def test_billion_laughs_is_refused_quickly(
    workspace: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    code, err, written = run_build(workspace, BILLION_LAUGHS, monkeypatch, capsys)
    assert code == 2
    assert "nkibuild.yaml:" in err and "expands to more than" in err, err
    assert not written
    record(
        "hostile names and paths in the manifest (through the CLI)",
        trials=len(CASES) + 1,
        result="all refused with file:line:col and exit 2; nothing written outside "
        "build/dist; no generated file contains them",
    )
