"""Where the real Neuron tools' golden data lives: `../shared/testdata` next to the
checkout (modules written by the real nkipy tracer, two real NEFFs, spike's API as data;
its README says what each is). Tests read it at test time and skip, saying why, where a
clone has no `shared` directory beside it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

TESTDATA = Path(__file__).resolve().parents[2] / "shared" / "testdata"
NKIPY_MODULES = "hlo/nkipy"


def golden_path(relative: str) -> Path:
    """`relative` under ../shared/testdata; skips the calling test when it is absent."""
    path = TESTDATA / relative
    if not path.exists():
        pytest.skip(
            f"{path} is absent: the real tools' golden data lives in ../shared/testdata, "
            "beside the checkout"
        )
    return path


def nkipy_cases() -> dict[str, Any]:
    """golden.json's cases: per kernel of golden_kernels.py, its sample inputs and what the
    real tracer's module holds (parameters, results, aliasing, source file)."""
    return json.loads(golden_path(f"{NKIPY_MODULES}/golden.json").read_text())["cases"]


def nkipy_module(case: dict[str, Any]) -> bytes:
    """The bytes the real nkipy tracer wrote for one case of golden.json."""
    return golden_path(f"{NKIPY_MODULES}/{case['hlo']}").read_bytes()
