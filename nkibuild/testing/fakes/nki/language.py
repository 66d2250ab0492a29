"""nkibuild toolchain double: a NumPy-backed subset of `nki.language`.

Tensors are NumPy arrays, slices of them are views, so `load`/`store` on slices
behave like NKI's HBM <-> SBUF moves for the purpose of simulation.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

float32 = np.float32
float16 = np.float16
bfloat16 = ml_dtypes.bfloat16
int32 = np.int32
int8 = np.int8

# Memory spaces: only meaningful on hardware; the simulation keeps everything in RAM.
shared_hbm = "shared_hbm"
hbm = "hbm"
private_hbm = "private_hbm"
sbuf = "sbuf"
psum = "psum"


class tile_size:
    pmax = 128
    gemm_stationary_fmax = 128
    gemm_moving_fmax = 512


def ndarray(shape: tuple[int, ...], dtype: Any, buffer: Any = None) -> np.ndarray:
    return np.zeros(shape, dtype=dtype)


zeros = ndarray


def load(source: np.ndarray, dtype: Any = None) -> np.ndarray:
    return np.array(source, dtype=dtype or source.dtype)


def store(destination: np.ndarray, value: Any) -> None:
    destination[...] = value


def matmul(x: np.ndarray, y: np.ndarray, transpose_x: bool = False) -> np.ndarray:
    left = x.T if transpose_x else x
    return np.matmul(left.astype(np.float32), y.astype(np.float32))


def copy(x: np.ndarray, dtype: Any = None) -> np.ndarray:
    return np.array(x, dtype=dtype or x.dtype)


def add(x: Any, y: Any, dtype: Any = None) -> np.ndarray:
    return np.asarray(np.add(x, y), dtype=dtype)


def multiply(x: Any, y: Any, dtype: Any = None) -> np.ndarray:
    return np.asarray(np.multiply(x, y), dtype=dtype)


def exp(x: np.ndarray, dtype: Any = None) -> np.ndarray:
    return np.asarray(np.exp(x), dtype=dtype)


def affine_range(*args: int) -> range:
    return range(*args)


sequential_range = affine_range
static_range = affine_range


def arange(*args: int) -> np.ndarray:
    return np.arange(*args)
