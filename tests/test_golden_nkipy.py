"""nkibuild against modules written by the REAL nkipy tracer (../shared/testdata/hlo/nkipy,
golden.json saying what each holds), read at test time: the HLO reader, relocation and
the cache key on them, and the toolchain double's nkipy run on the same kernels
(golden_kernels.py) giving the same signatures. Skips, saying why, without the data."""

from __future__ import annotations

import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import ml_dtypes
import numpy as np
from conftest import run_nkibuild
from golden_data import NKIPY_MODULES, golden_path, nkipy_cases, nkipy_module
from helpers import write_project

from nkibuild.compiler import cache_key
from nkibuild.context import load_context
from nkibuild.formats.hlo import HloModuleInfo, canonical_module, message_class, read_hlo
from nkibuild.frontends.relocation import normalized_hash, relocate
from nkibuild.manifest.semantic import NKIPY_NARROWED
from nkibuild.settings import BuildOptions
from nkibuild.toolchain_double.fake_nkipy.nkipy.core.trace import NKIPyKernel


def signature(info: HloModuleInfo) -> dict[str, Any]:
    """What golden.json records of a module, as nkibuild's reader sees it."""
    return {
        "entry_parameters": [
            {"name": p.name, "element_type": p.shape.element_type, "dims": list(p.shape.dims)}
            for p in info.parameters
        ],
        "entry_results": [
            {"element_type": s.element_type, "dims": list(s.dims)} for s in info.outputs()
        ],
        "input_output_alias": [
            {"output_index": list(a.output_shape_index), "parameter_number": a.parameter}
            for a in info.aliases
        ],
    }


def source_files(data: bytes) -> set[str]:
    module = message_class("HloModuleProto")()
    module.ParseFromString(data)
    files = {i.metadata.source_file for c in module.computations for i in c.instructions}
    return files - {""}


def test_the_reader_reads_what_the_real_tracer_wrote() -> None:
    for name, case in nkipy_cases().items():
        data = nkipy_module(case)
        assert len(data) == case["bytes"], name
        info = read_hlo(data)
        assert signature(info) == {key: case[key] for key in signature(info)}, name
        assert source_files(data) == set(case["source_files_in_metadata"]), name
        # NEFF output names: output0... for what the kernel returns; an aliased output
        # carries the name of the input it is written into.
        returned = len(info.outputs()) - len(info.aliases)
        aliased = [
            info.parameters[a.parameter].name.removesuffix(".must_alias_input")
            for a in info.aliases
        ]
        expected = [f"output{i}" for i in range(returned)] + aliased
        assert list(info.output_names) == expected, name


def test_nkibuild_narrows_64_bit_nkipy_inputs_as_the_real_tracer_does() -> None:
    # The manifest check refuses float64/int64 nkipy inputs with NKIPY_NARROWED's advice.
    narrowed = {}
    for case in nkipy_cases().values():
        traced = read_hlo(nkipy_module(case)).parameters
        for given, parameter in zip(case["inputs"], traced, strict=True):
            if given["dtype"] != parameter.shape.dtype:
                narrowed[given["dtype"]] = parameter.shape.dtype
    assert narrowed == NKIPY_NARROWED


def test_two_checkouts_of_scaled_add_have_one_cache_key(tmp_path: Path) -> None:
    cases = nkipy_cases()
    modules = [nkipy_module(cases["scaled_add"])]
    modules.append(golden_path(f"{NKIPY_MODULES}/scaled_add.another-checkout.hlo.pb").read_bytes())
    project = write_project(tmp_path / "p", SCALED_ADD, {"k.pb": modules[0]})
    context = load_context(
        project / "nkibuild.yaml", project / "build", project / "dist", BuildOptions("fake")
    )
    (unit,) = context.units
    keys, portable = [], []
    for number, raw in enumerate(modules):
        (kernel_file,) = source_files(raw)
        root = str(Path(kernel_file).parents[1])  # the checkout: kernels/ is in it
        artifact = tmp_path / f"artifact{number}"
        data, sidecars = relocate(canonical_module(raw, root), artifact, (artifact,))
        portable.append(data)
        keys.append(cache_key(unit, normalized_hash(data, artifact, sidecars), context.toolchain))
    assert modules[0] != modules[1]  # each names its own checkout...
    assert portable[0] == portable[1]  # ...which the build makes project-relative
    assert source_files(portable[0]) == {"kernels/golden_kernels.py"}
    assert keys[0].digest == keys[1].digest


SCALED_ADD = """\
format-version: 1
package: {name: golden, version: 1.0.0}
defaults: {targets: [trn2]}
kernels:
  scaled_add:
    frontend: hlo
    source: k.pb
    inputs:
      x: {shape: [128, 512], dtype: float32}
      y: {shape: [128, 512], dtype: float32}
"""


# --- the toolchain double's nkipy on the same kernels ------------------------------------


def golden_kernels() -> ModuleType:
    """golden_kernels.py as a module, compiled from its file (no __pycache__ is written
    into the golden data)."""
    path = golden_path(f"{NKIPY_MODULES}/golden_kernels.py").resolve()
    module = ModuleType("golden_kernels")
    module.__file__ = str(path)
    exec(compile(path.read_text(), str(path), "exec"), module.__dict__)
    return module


def sample(spec: dict[str, Any]) -> np.ndarray:
    """A zero-filled sample array as golden.json lists it (fp8 and bf16 from ml_dtypes)."""
    return np.zeros(spec["shape"], getattr(ml_dtypes, spec["dtype"], spec["dtype"]))


def test_the_double_traces_the_golden_kernels_as_the_real_tracer_did() -> None:
    kernels = golden_kernels()
    for name, case in nkipy_cases().items():
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            kernel = NKIPyKernel.trace(getattr(kernels, name))
            kernel.specialize(*map(sample, case["inputs"]))
        data = kernel._code.to_proto().SerializeToString()
        real = read_hlo(nkipy_module(case))
        double = read_hlo(data)
        assert signature(double) == signature(real), name
        assert double.output_names == real.output_names, name
        assert source_files(data) == {kernels.__file__}, name  # its own absolute path
        narrowed = sum(s["dtype"] in NKIPY_NARROWED for s in case["inputs"])
        assert len(warned) == narrowed, name  # the real tracer warns when it narrows


def test_a_build_refuses_a_kernel_that_writes_into_its_input(tmp_path: Path) -> None:
    # The double, like the real tracer, turns `acc[...] += x` into an aliased output.
    kernel = "def accumulate(acc, x):\n    acc[...] += x\n    return acc * 2.0\n"
    project = write_project(tmp_path / "p", IN_PLACE, {"k.py": kernel})
    result = run_nkibuild(["build", "--toolchain", "fake"], project)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "k.py:accumulate writes into its input(s) acc" in result.stderr
    assert "return new arrays instead" in result.stderr
    (project / "k.py").write_text("def accumulate(acc, x):\n    return (acc + x) * 2.0\n")
    assert run_nkibuild(["build", "--toolchain", "fake"], project).returncode == 0


IN_PLACE = """\
format-version: 1
package: {name: in-place, version: 1.0.0}
defaults: {targets: [trn2]}
kernels:
  accumulate:
    frontend: nkipy
    source: k.py:accumulate
    inputs:
      acc: {shape: [4, 8], dtype: float32}
      x: {shape: [4, 8], dtype: float32}
"""
