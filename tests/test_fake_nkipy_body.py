"""The toolchain double's nkipy gives a module that changes when the real tracer's would
(issue 31, item 6): with the kernel's code and its constants, not only its signature;
and `doctor` counts what the double stands in for."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from conftest import run_nkibuild
from helpers import build, write_project

from nkibuild.formats.hlo import message_class, read_hlo
from nkibuild.frontends import load_artifact
from nkibuild.toolchain_double.fake_nkipy.nkipy.core.trace import NKIPyKernel, code_digest

KERNELS = """\
import numpy as np


def scaled(x, alpha):
    # scale, then shift
    return x * alpha + 1


def shifted(x, alpha):
    # scale, then shift
    return x * alpha - 1
"""

MANIFEST = """\
format-version: 1
package: {name: body, version: 1.0.0}
defaults: {targets: [trn2]}
kernels:
  scaled:
    frontend: nkipy
    source: k.py:scaled
    inputs:
      x: {shape: [64, 32], dtype: float32}
    constants: {alpha: 2.0}
  shifted:
    frontend: nkipy
    source: k.py:shifted
    inputs:
      x: {shape: [64, 32], dtype: float32}
    constants: {alpha: 2.0}
"""


def project_at(path: Path) -> Path:
    return write_project(path, MANIFEST, {"k.py": KERNELS})


def content_hash(project: Path, kernel: str) -> str:
    return load_artifact(project / "build" / "extract" / kernel / "default").content_hash


def compiled(project: Path) -> set[str]:
    """The compile tasks a build ran, each checked to have compiled (not a cache hit)."""
    summary = build(project)
    assert summary.ok, summary.to_json()
    ran = {name for name in summary.executed if name.startswith("compile:")}
    assert summary.to_json()["compile_origins"].get("compiled", 0) == len(ran)
    return ran


def test_kernels_of_one_signature_get_different_modules(tmp_path: Path) -> None:
    # One function name, parameters and constants; the files' bodies differ.
    manifest = MANIFEST.replace("source: k.py:shifted", "source: other.py:scaled")
    other = KERNELS.replace("x * alpha + 1", "x * alpha * 3")
    project = write_project(tmp_path / "p", manifest, {"k.py": KERNELS, "other.py": other})
    assert compiled(project) == {"compile:scaled/default/trn2", "compile:shifted/default/trn2"}
    assert content_hash(project, "scaled") != content_hash(project, "shifted")


def test_editing_a_body_recompiles_that_kernel_only(tmp_path: Path) -> None:
    project = project_at(tmp_path / "p")
    compiled(project)
    source = project / "k.py"
    source.write_text(source.read_text().replace("x * alpha + 1", "x * alpha + 2"))
    assert compiled(project) == {"compile:scaled/default/trn2"}


def test_editing_a_comment_recompiles_nothing(tmp_path: Path) -> None:
    project = project_at(tmp_path / "p")
    compiled(project)
    before = content_hash(project, "scaled")
    source = project / "k.py"
    source.write_text(source.read_text().replace("# scale, then shift", "# x times alpha, +-1"))
    assert compiled(project) == set()
    assert content_hash(project, "scaled") == before


def test_changing_a_constant_recompiles(tmp_path: Path) -> None:
    project = project_at(tmp_path / "p")
    compiled(project)
    manifest = project / "nkibuild.yaml"
    manifest.write_text(MANIFEST.replace("{alpha: 2.0}\n  shifted", "{alpha: 3.0}\n  shifted"))
    assert compiled(project) == {"compile:scaled/default/trn2"}


def test_the_same_kernel_in_two_checkouts_has_one_key(tmp_path: Path) -> None:
    first, second = project_at(tmp_path / "a" / "p"), project_at(tmp_path / "bb" / "elsewhere")
    compiled(first)
    summary = build(second)
    assert summary.ok, summary.to_json()
    assert summary.to_json()["compile_origins"] == {"cache-local": 2}  # no compile
    for kernel in ("scaled", "shifted"):
        assert content_hash(first, kernel) == content_hash(second, kernel)
    module = message_class("HloModuleProto")()
    stored = first / "build" / "extract" / "scaled" / "default" / "model.hlo_module.pb"
    module.ParseFromString(stored.read_bytes())
    files = {i.metadata.source_file for c in module.computations for i in c.instructions}
    assert files - {""} == {"k.py"}  # as the real tracer's, made project-relative


# --- the traced module itself --------------------------------------------------------------


def traced(fn: object, *args: object, **kwargs: object) -> bytes:
    kernel = NKIPyKernel.trace(fn).specialize(*args, **kwargs)
    return kernel._code.to_proto().SerializeToString()


def helper(x: np.ndarray) -> np.ndarray:
    return x + 1


def uses_helper(x: np.ndarray) -> np.ndarray:
    return helper(x) * 2


def with_default(x: np.ndarray, alpha: float = 0.5) -> np.ndarray:
    return x * alpha


def test_a_default_constant_is_in_the_module() -> None:
    x = np.zeros((4, 8), np.float32)
    assert traced(with_default, x) == traced(with_default, x, alpha=0.5)
    assert traced(with_default, x) != traced(with_default, x, alpha=0.25)
    assert read_hlo(traced(with_default, x)).parameters[0].name == "x"


def test_the_digest_follows_the_helpers_a_kernel_calls() -> None:
    before = code_digest(uses_helper)
    original = helper.__code__
    try:
        helper.__code__ = (lambda x: x + 2).__code__
        assert code_digest(uses_helper) != before
    finally:
        helper.__code__ = original
    assert code_digest(uses_helper) == before


# --- doctor ----------------------------------------------------------------------------


def test_doctor_does_not_call_what_the_double_supplies_missing(tmp_path: Path) -> None:
    fake = run_nkibuild(["doctor", "--toolchain", "fake", "--json"], cwd=tmp_path)
    assert fake.returncode == 0, fake.stderr
    packages = json.loads(fake.stdout)["packages"]
    assert packages["nkipy"]["version"] is not None or packages["nkipy"]["stand_in"]
    text = run_nkibuild(["doctor"], cwd=tmp_path, env={"NKIBUILD_TOOLCHAIN": "fake"}).stdout
    assert "nkipy: not importable" not in text
    assert "torch_xla: not importable" not in text  # the double's fake torch-xla
    if packages["torch_xla"]["version"] is None:  # without the fake, it is missing
        auto = run_nkibuild(["doctor", "--toolchain", "auto"], cwd=tmp_path).stdout
        assert "torch_xla: not importable — needed" in auto
