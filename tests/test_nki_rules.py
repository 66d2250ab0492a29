"""NKI 0.3+ rules at validate time (issue 29 item 2), checked through the CLI with the
toolchain double reporting the NKI release NKIBUILD_FAKE_NKI_VERSION names."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_nkibuild
from helpers import build, failed, ok, write_project

from nkibuild.errors import ManifestError

KERNEL = """\
import nki
import nki.language as nl


@nki.jit{decorator}
def add(a, b):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.add(nl.load(a), nl.load(b)))
    return out
"""
MANIFEST = """\
format-version: 1
package: {{name: rules, version: 1.0.0}}
defaults: {{targets: [{targets}]}}
kernels:
  add:
    frontend: nki
    source: kernels/k.py:add
    inputs:
      a: {{shape: [128, 64], dtype: float32}}
      b: {{shape: [128, 64], dtype: float32}}
{extra}"""


def project(root: Path, targets: str = "trn2", decorator: str = "", extra: str = "") -> Path:
    manifest = MANIFEST.format(targets=targets, extra=extra)
    return write_project(root, manifest, {"kernels/k.py": KERNEL.format(decorator=decorator)})


def validate(root: Path, nki: str) -> tuple[int, str]:
    result = run_nkibuild(
        ["validate", "--toolchain", "fake"], root, {"NKIBUILD_FAKE_NKI_VERSION": nki}
    )
    return result.returncode, result.stdout + result.stderr


@pytest.mark.parametrize("nki", ["0.3.0", "0.7.0"])
def test_an_nki_kernel_for_trn1_is_refused_from_nki_0_3(tmp_path: Path, nki: str) -> None:
    root = project(tmp_path / "p", targets="trn1, trn2")
    output = failed(run_nkibuild(["validate", "--toolchain", "fake"], root,
                                 {"NKIBUILD_FAKE_NKI_VERSION": nki}), 2).stderr  # fmt: skip
    assert (
        f"nkibuild.yaml:5:3: error: kernel 'add' (frontend: nki) targets trn1, which NKI {nki} "
        "does not support" in output
    )
    assert (
        "hint: give the kernel `targets: [trn2, trn3]`, or build its trn1 NEFFs with Neuron "
        "SDK 2.28 or earlier" in output
    )


def test_before_nki_0_3_an_nki_kernel_for_trn1_validates(tmp_path: Path) -> None:
    root = project(tmp_path / "p", targets="trn1, trn2")
    assert validate(root, "0.2.0") == (0, "nkibuild.yaml: ok (1 kernel, 2 build units)\n")


def test_a_build_is_refused_alike(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NKIBUILD_FAKE_NKI_VERSION", "0.7.0")
    with pytest.raises(ManifestError, match=r"targets trn1, which NKI 0\.7\.0 does not support"):
        build(project(tmp_path / "p", targets="trn1"))


@pytest.mark.parametrize(
    ("decorator", "column", "why"),
    [
        ('(platform_target="trn2")', 10, "NKI 0.3 removed it (it raises)"),
        ('(mode="simulation")', 10, "NKI 0.3 ignores it"),
    ],
)
def test_dropped_nki_jit_keywords_are_reported_where_they_are(
    tmp_path: Path, decorator: str, column: int, why: str
) -> None:
    root = project(tmp_path / "p", decorator=decorator)
    keyword = decorator[1:].partition("=")[0]
    code, output = validate(root, "0.7.0")
    assert code == 2
    assert (
        f"kernels/k.py:5:{column}: error: nki.jit({keyword}=...) is not supported by NKI 0.7.0"
        in output
    )
    assert f"hint: remove it: {why}" in output
    assert validate(root, "0.2.0")[0] == 0  # both were valid before NKI 0.3


def test_compiler_args_may_not_set_an_nki_kernels_lnc(tmp_path: Path) -> None:
    extra = "    lnc: 2\n    compiler-args: [--verbose, --lnc=1]\n"
    code, output = validate(project(tmp_path / "p", extra=extra), "0.7.0")
    assert code == 2
    assert (
        "nkibuild.yaml:12:32: error: compiler-args set the lnc of kernel 'add' (frontend: nki)"
        in output
    )
    assert "hint: set `lnc:` instead" in output
    ok(
        run_nkibuild(
            ["validate", "--toolchain", "fake"], project(tmp_path / "q", extra="    lnc: 2\n")
        )
    )
