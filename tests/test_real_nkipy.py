"""nkibuild's HLO reader on modules traced by the REAL nkipy (aws-neuron/nkipy, installed
from ../shared/thirdparty by .ci/run), not by nkibuild's fake nkipy.

Tracing runs in a subprocess (as nkibuild's frontend workers do), so this process never
imports nkipy or its protos; the module bytes are read back with nkibuild's reader.
Every test skips, saying why, when the real nkipy is not importable.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from nkibuild.formats.hlo import HloShape, canonical_module, read_hlo

# Every double of nkibuild's (testing/fakes, testing/fake_nkipy) lives under here.
FAKES = Path(__file__).resolve().parents[1] / "nkibuild" / "toolchain_double"

KERNELS = """\
import numpy as np


def scaled_add(x, y, alpha=0.5):
    return x * alpha + y


def two_outputs(a, b):
    return a + b, (a * b).sum(axis=1)


def accumulate(acc, x):
    acc[:] = acc + x
    return acc * 2
"""

TRACE = """
import json, sys
import numpy as np, ml_dtypes
sys.path.insert(0, {kernels_dir!r})
import nkipy
from nkipy.core.trace import NKIPyKernel
import kernels

def dtype(name):
    return getattr(ml_dtypes, name) if hasattr(ml_dtypes, name) else np.dtype(name)

for name, inputs, out in {jobs!r}:
    kernel = NKIPyKernel.trace(getattr(kernels, name))
    kernel.specialize(*[np.zeros(shape, dtype(d)) for d, shape in inputs])
    with open(out, "wb") as handle:
        handle.write(kernel._code.to_proto().SerializeToString())
print(json.dumps(nkipy.__file__))
"""


def real_nkipy_origin() -> str:
    """Where `import nkipy` comes from in a clean interpreter; skip unless it is the real one."""
    probe = subprocess.run(
        [sys.executable, "-I", "-c", "import nkipy.core.trace, nkipy; print(nkipy.__file__)"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        pytest.skip(
            "the real nkipy is not importable (install ../shared/thirdparty/nkipy-*.whl with "
            "--no-deps, as .ci/run does)"
        )
    origin = probe.stdout.strip()
    if origin.startswith(str(FAKES)):
        pytest.skip(f"nkipy resolves to nkibuild's fake ({origin}), not the real tracer")
    return origin


@pytest.fixture(scope="module")
def nkipy_origin() -> str:
    return real_nkipy_origin()


def trace(
    kernels_dir: Path, jobs: list[tuple[str, list[tuple[str, tuple[int, ...]]]]], out_dir: Path
) -> dict[str, bytes]:
    """Trace each (kernel, [(dtype, shape)...]) with the real NKIPyKernel; name -> HLO bytes."""
    planned = [(name, inputs, str(out_dir / f"{name}.pb")) for name, inputs in jobs]
    script = TRACE.format(kernels_dir=str(kernels_dir), jobs=planned)
    result = subprocess.run(
        [sys.executable, "-I", "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert not json.loads(result.stdout).startswith(str(FAKES))
    return {name: Path(path).read_bytes() for name, _, path in planned}


def project(root: Path) -> Path:
    (root / "kernels").mkdir(parents=True)
    (root / "kernels" / "kernels.py").write_text(KERNELS)
    return root / "kernels"


@pytest.fixture(scope="module")
def traced(nkipy_origin: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    kernels_dir = project(tmp_path_factory.mktemp("nkipy") / "proj")
    jobs: list[tuple[str, list[tuple[str, tuple[int, ...]]]]] = [
        ("scaled_add", [("float64", (4, 8)), ("float32", (4, 8))]),
        ("two_outputs", [("int64", (4, 8)), ("int32", (4, 8))]),
        ("accumulate", [("float32", (4, 8)), ("float32", (4, 8))]),
        ("scaled_add:fp8", [("float8_e4m3", (4, 8)), ("float8_e4m3", (4, 8))]),
    ]
    jobs_by_function = [(name.split(":")[0], inputs) for name, inputs in jobs]
    modules = trace(kernels_dir, jobs_by_function[:3], kernels_dir.parent)
    fp8_dir = kernels_dir.parent / "fp8"
    fp8_dir.mkdir()
    modules["fp8"] = trace(kernels_dir, jobs_by_function[3:], fp8_dir)["scaled_add"]
    return modules


def signature(data: bytes) -> dict[str, Any]:
    info = read_hlo(data)
    return {
        "parameters": [(p.name, str(p.shape)) for p in info.parameters],
        "outputs": [str(s) for s in info.outputs()],
        "output_names": list(info.output_names),
        "aliases": [(a.output_shape_index, a.parameter) for a in info.aliases],
    }


def test_parameters_carry_the_python_names_and_float64_is_narrowed(
    traced: dict[str, bytes],
) -> None:
    # float64 inputs are traced as float32 (nkipy warns): the NEFF will expect float32.
    assert signature(traced["scaled_add"]) == {
        "parameters": [("x", "float32[4,8]"), ("y", "float32[4,8]")],
        "outputs": ["float32[4,8]"],
        "output_names": ["output0"],
        "aliases": [],
    }


def test_int64_is_narrowed_and_outputs_are_named_output0_output1(
    traced: dict[str, bytes],
) -> None:
    assert signature(traced["two_outputs"]) == {
        "parameters": [("a", "int32[4,8]"), ("b", "int32[4,8]")],
        "outputs": ["int32[4,8]", "int32[4]"],
        "output_names": ["output0", "output1"],
        "aliases": [],
    }


def test_writing_into_an_input_adds_an_aliased_output_named_after_it(
    traced: dict[str, bytes],
) -> None:
    found = signature(traced["accumulate"])
    # nkipy renames the written parameter (its NEFF input name) and gives its old name to
    # the aliased output: a loader must pass `acc` as "acc.must_alias_input".
    assert found["parameters"] == [("acc.must_alias_input", "float32[4,8]"), ("x", "float32[4,8]")]
    assert found["output_names"] == ["output0", "acc"]
    assert found["aliases"] == [((1,), 0)]  # result[1] is written into parameter 0
    assert found["outputs"] == ["float32[4,8]", "float32[4,8]"]


def test_fp8_is_xla_type_28(traced: dict[str, bytes]) -> None:
    info = read_hlo(traced["fp8"])
    assert [p.shape for p in info.parameters] == [HloShape(28, (4, 8))] * 2
    assert [p.shape.dtype for p in info.parameters] == ["float8_e4m3", "float8_e4m3"]


def test_absolute_source_paths_become_project_relative(nkipy_origin: str, tmp_path: Path) -> None:
    # The same kernel in two checkouts: nkipy records each one's absolute path.
    first, second = tmp_path / "a" / "proj", tmp_path / "elsewhere" / "copy"
    project(first)
    shutil.copytree(first, second)
    job = [("scaled_add", [("float32", (4, 8)), ("float32", (4, 8))])]
    raw_first = trace(first / "kernels", job, first)["scaled_add"]
    raw_second = trace(second / "kernels", job, second)["scaled_add"]
    assert str(first).encode() in raw_first and raw_first != raw_second
    portable_first = canonical_module(raw_first, root=str(first))
    portable_second = canonical_module(raw_second, root=str(second))
    assert portable_first == portable_second
    assert str(tmp_path).encode() not in portable_first
    assert b"kernels/kernels.py" in portable_first
    assert signature(portable_first) == signature(raw_first)
