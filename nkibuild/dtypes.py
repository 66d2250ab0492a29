"""Tensor element types: manifest names, NumPy names and HLO PrimitiveType numbers."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DType:
    name: str  # manifest / NumPy spelling
    hlo_type: int  # xla PrimitiveType enum value
    neff_name: str  # spelling in NEFF tensor maps and spike metadata


_DTYPES = (
    DType("bool", 1, "bool"),
    DType("int8", 2, "int8"),
    DType("int16", 3, "int16"),
    DType("int32", 4, "int32"),
    DType("int64", 5, "int64"),
    DType("uint8", 6, "uint8"),
    DType("uint16", 7, "uint16"),
    DType("uint32", 8, "uint32"),
    DType("uint64", 9, "uint64"),
    DType("float16", 10, "float16"),
    DType("float32", 11, "float32"),
    DType("float64", 12, "float64"),
    DType("bfloat16", 16, "bfloat16"),
    DType("float8_e5m2", 19, "float8_e5m2"),
    DType("float8_e4m3fn", 20, "float8_e4m3fn"),
)

BY_NAME: dict[str, DType] = {d.name: d for d in _DTYPES}
BY_HLO_TYPE: dict[int, DType] = {d.hlo_type: d for d in _DTYPES}
NAMES: tuple[str, ...] = tuple(BY_NAME)


def hlo_type_name(hlo_type: int) -> str:
    """Manifest spelling of an HLO element type, or a descriptive placeholder."""
    dtype = BY_HLO_TYPE.get(hlo_type)
    return dtype.name if dtype else f"hlo-type-{hlo_type}"
