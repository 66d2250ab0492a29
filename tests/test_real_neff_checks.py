"""The compile stage's NEFF checks on a NEFF from a real neuronx-cc 2.23
(../shared/testdata/neff/matmul_small.neff: two subgraphs, one NeuronCore)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from golden_data import golden_path

from nkibuild.compiler.checks import checked_neff
from nkibuild.frontends import HloArtifact
from nkibuild.manifest.model import TensorSpec


@pytest.fixture
def golden() -> Path:
    return golden_path("neff/matmul_small.neff")


def artifact(x_dtype: str = "float16") -> HloArtifact:
    return HloArtifact(
        directory=Path("unused"),
        frontend="hlo",
        content_hash="unused",
        module_name="matmul",
        inputs=(TensorSpec("x", (128, 256), x_dtype), TensorSpec("y", (256, 128), "float16")),
        outputs=(TensorSpec("output0", (128, 128), "float16"),),
        toolchain=(),
    )


def test_a_real_single_core_neff_with_two_subgraphs_fits_lnc_1(golden: Path) -> None:
    info, problem = checked_neff(SimpleNamespace(lnc=1), artifact(), golden)  # type: ignore[arg-type]
    assert problem is None and info is not None and info.num_tpb == 1


def test_a_real_neff_is_refused_for_another_core_count_or_signature(golden: Path) -> None:
    _, wrong_cores = checked_neff(SimpleNamespace(lnc=2), artifact(), golden)  # type: ignore[arg-type]
    assert wrong_cores is not None and "for 1 NeuronCore(s) but the unit uses lnc=2" in wrong_cores
    _, wrong_dtype = checked_neff(SimpleNamespace(lnc=1), artifact("float32"), golden)  # type: ignore[arg-type]
    assert wrong_dtype is not None and "inputs are" in wrong_dtype
