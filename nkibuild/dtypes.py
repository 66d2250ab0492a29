"""Tensor element types: manifest names, NumPy names, HLO PrimitiveType numbers and how a
NEFF stores each one.

A NEFF (its tensor maps and `neff.json` signature) has no fp8 or boolean element types:
neuronx-cc records fp8 tensors as `int8` and `bool` tensors as `uint8` (spike's own
`spike_model.py` says so: fp8 "are currently as int8 in NEFF"). A check that compares an
HLO signature with the NEFF compiled from it must therefore compare through
`compatible_in_neff`, not by equal names.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DType:
    name: str  # manifest / NumPy (ml_dtypes) spelling
    hlo_type: int  # xla PrimitiveType enum value
    neff_name: str  # how a NEFF compiled by neuronx-cc stores it (tensor maps, neff.json)


_DTYPES = (
    DType("bool", 1, "uint8"),
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
    DType("float8_e5m2", 19, "int8"),
    DType("float8_e4m3fn", 20, "int8"),
    # xla F8E4M3 (IEEE-style, with infinities): what nkipy traces ml_dtypes.float8_e4m3 as.
    DType("float8_e4m3", 28, "int8"),
)

BY_NAME: dict[str, DType] = {d.name: d for d in _DTYPES}
BY_HLO_TYPE: dict[int, DType] = {d.hlo_type: d for d in _DTYPES}
NAMES: tuple[str, ...] = tuple(BY_NAME)


def hlo_type_name(hlo_type: int) -> str:
    """Manifest spelling of an HLO element type, or a descriptive placeholder."""
    dtype = BY_HLO_TYPE.get(hlo_type)
    return dtype.name if dtype else f"hlo-type-{hlo_type}"


def neff_storage_dtype(dtype: str) -> str:
    """The dtype a real NEFF records for a tensor declared as `dtype` (fp8 -> int8,
    bool -> uint8, the others unchanged; an unknown name is returned as it is)."""
    known = BY_NAME.get(dtype)
    return known.neff_name if known else dtype


def compatible_in_neff(declared: str, stored: str) -> bool:
    """Whether a NEFF tensor stored as `stored` can be the tensor declared as `declared`
    (in the HLO or the manifest): the same name, or the storage type neuronx-cc uses for
    it. Older placeholder NEFFs spell fp8 and bool by their own names, which also passes."""
    return stored == declared or stored == neff_storage_dtype(declared)


# Other tools' names of these dtypes (PyTorch, XLA, NKI, C), which a manifest author may
# well write: each is answered with a "did you mean" naming the manifest's spelling.
OTHER_SPELLINGS: dict[str, str] = {
    "pred": "bool",
    **{f"{prefix}{bits}": f"int{bits}" for prefix in ("i", "s") for bits in (8, 16, 32, 64)},
    "int": "int32",
    "long": "int64",
    **{f"u{bits}": f"uint{bits}" for bits in (8, 16, 32, 64)},
    **{f"{prefix}{bits}": f"float{bits}" for prefix in ("f", "fp") for bits in (16, 32, 64)},
    "half": "float16",
    "float": "float32",
    "double": "float64",
    "bf16": "bfloat16",
    **{
        f"{prefix}8{sep}{kind}": f"float8_{kind}"
        for prefix in ("f", "fp", "float")
        for sep in ("_", "")
        for kind in ("e5m2", "e4m3fn", "e4m3")
    },
}
