"""nkibuild toolchain double: a NumPy-backed subset of `nki.language`.

Tensors are NumPy arrays and slices of them are views, so `load`/`store` on slices
behave like NKI's HBM <-> SBUF moves for the purpose of simulation. Memory spaces
are accepted and ignored: everything lives in host RAM. Only what classic tiled
kernels (matmul, elementwise) use is here; it imitates NKI, it does not reimplement it.
"""

from __future__ import annotations

import contextvars
from typing import Any

import ml_dtypes
import numpy as np

float32 = np.float32
float16 = np.float16
bfloat16 = ml_dtypes.bfloat16
int32 = np.int32
int8 = np.int8
uint8 = np.uint8

# Memory spaces: only meaningful on hardware.
shared_hbm = "shared_hbm"
hbm = "hbm"
private_hbm = "private_hbm"
sbuf = "sbuf"
psum = "psum"


class tile_size:
    pmax = 128  # partitions of SBUF/PSUM: the largest contraction (K) tile
    gemm_stationary_fmax = 128  # free size of the stationary matmul operand (M tile)
    gemm_moving_fmax = 512  # free size of the moving matmul operand (N tile)


def numpy_dtype(dtype: Any) -> np.dtype:
    """NKI accepts dtypes as objects or strings; NumPy does not know "bfloat16" by name."""
    if isinstance(dtype, str) and dtype == "bfloat16":
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


def zeros(shape: tuple[int, ...], dtype: Any, buffer: Any = None, **_: Any) -> np.ndarray:
    return np.zeros(tuple(shape), dtype=numpy_dtype(dtype))


ndarray = zeros  # uninitialized on hardware; zeros keep simulation deterministic


def load(src: Any, dtype: Any = None, **_: Any) -> np.ndarray:
    """A fresh array (never a view: loads copy out of HBM), in `dtype` if given."""
    return np.array(src, dtype=None if dtype is None else numpy_dtype(dtype))


copy = load


def store(destination: np.ndarray, value: Any, **_: Any) -> None:
    destination[...] = value  # `destination` is a view into the output tensor


def matmul(x: np.ndarray, y: np.ndarray, transpose_x: bool = False, **_: Any) -> np.ndarray:
    # The tensor engine accumulates in fp32 PSUM whatever the operand dtype.
    left = x.T if transpose_x else x
    return np.matmul(left.astype(np.float32), y.astype(np.float32))


def add(x: Any, y: Any, dtype: Any = None, **_: Any) -> np.ndarray:
    return load(np.add(x, y), dtype)


def multiply(x: Any, y: Any, dtype: Any = None, **_: Any) -> np.ndarray:
    return load(np.multiply(x, y), dtype)


def exp(x: Any, dtype: Any = None, **_: Any) -> np.ndarray:
    return load(np.exp(x), dtype)


# Iterations are independent on hardware (may run in parallel); in order here.
affine_range = sequential_range = static_range = range
arange = np.arange


# The launch grid of the kernel being simulated (`kernel[2]` under LNC 2): one program
# per logical NeuronCore. The double runs the programs as one, as a kernel that splits
# its work by `program_id` would need all of them; it reports the grid it was given.
GRID: contextvars.ContextVar[int] = contextvars.ContextVar("nki_fake_grid", default=1)


def num_programs(axes: int | None = None) -> int:
    """Programs in the launch grid (nl.num_programs)."""
    return GRID.get()
