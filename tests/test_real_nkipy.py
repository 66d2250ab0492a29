"""Against an installed REAL nkipy tracer (aws-neuron/nkipy), not nkibuild's double: it
still writes what the golden modules (../shared/testdata/hlo/nkipy) record, which the
rest of the suite checks nkibuild against (tests/test_golden_nkipy.py).

Tracing runs in a subprocess (as nkibuild's frontend workers do), so this process never
imports nkipy or its protos. nkipy is not installable from a package registry: every
test skips, saying why, where the real tracer is not importable.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from golden_data import NKIPY_MODULES, golden_path, nkipy_cases, nkipy_module
from test_golden_nkipy import signature, source_files

from nkibuild.formats.hlo import canonical_module, read_hlo

FAKES = Path(__file__).resolve().parents[1] / "nkibuild" / "toolchain_double"

# Traces every case of golden.json from the kernels in argv[1]; writes NAME.pb there.
TRACE = """
import json, sys
import ml_dtypes, numpy as np
kernels_dir, cases = sys.argv[1], json.loads(sys.argv[2])
sys.path.insert(0, kernels_dir)
import golden_kernels
from nkipy.core.trace import NKIPyKernel
for name, inputs in cases.items():
    arrays = [np.zeros(i["shape"], getattr(ml_dtypes, i["dtype"], i["dtype"])) for i in inputs]
    kernel = NKIPyKernel.trace(getattr(golden_kernels, name))
    kernel.specialize(*arrays)
    with open(f"{kernels_dir}/{name}.pb", "wb") as out:
        out.write(kernel._code.to_proto().SerializeToString())
"""


@pytest.fixture(scope="module")
def real_nkipy() -> None:
    probe = subprocess.run(
        [sys.executable, "-I", "-c", "import nkipy.core.trace, nkipy; print(nkipy.__file__)"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        pytest.skip("the real nkipy tracer is not importable here (aws-neuron/nkipy's wheel)")
    if probe.stdout.strip().startswith(str(FAKES)):
        pytest.skip(f"nkipy resolves to nkibuild's double ({probe.stdout.strip()})")


def trace_golden_kernels(checkout: Path) -> dict[str, bytes]:
    """golden_kernels.py copied to `checkout`/kernels and traced there: name -> module."""
    kernels = checkout / "kernels"
    kernels.mkdir(parents=True)
    shutil.copy(golden_path(f"{NKIPY_MODULES}/golden_kernels.py"), kernels)
    cases = {name: case["inputs"] for name, case in nkipy_cases().items()}
    command = [sys.executable, "-I", "-c", TRACE, str(kernels), json.dumps(cases)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    return {name: (kernels / f"{name}.pb").read_bytes() for name in cases}


def test_the_installed_tracer_writes_what_the_golden_modules_hold(
    real_nkipy: None, tmp_path: Path
) -> None:
    traced = trace_golden_kernels(tmp_path / "checkout")
    for name, case in nkipy_cases().items():
        golden = read_hlo(nkipy_module(case))
        assert signature(read_hlo(traced[name])) == signature(golden), name
        assert read_hlo(traced[name]).output_names == golden.output_names, name


def test_two_checkouts_traced_here_are_one_module_once_relocated(
    real_nkipy: None, tmp_path: Path
) -> None:
    checkouts = [tmp_path / "a" / "proj", tmp_path / "elsewhere" / "copy"]
    raw = [trace_golden_kernels(checkout)["scaled_add"] for checkout in checkouts]
    assert raw[0] != raw[1]  # each names its own absolute path
    portable = [canonical_module(data, str(c)) for data, c in zip(raw, checkouts, strict=True)]
    assert portable[0] == portable[1]
    assert source_files(portable[0]) == {"kernels/golden_kernels.py"}
