"""nkibuild toolchain double: the few `nki.isa` instructions of the NKI 0.3 tutorials.

They write into `dst` (a NumPy array or a view of one), as the real instructions do.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nki.language import matmul, numpy_dtype


def dma_copy(dst: np.ndarray, src: Any, **_: Any) -> None:
    dst[...] = src


def tensor_copy(dst: np.ndarray, src: Any, dtype: Any = None, **_: Any) -> None:
    dst[...] = np.asarray(src, dtype=numpy_dtype(dtype) if dtype is not None else None)


def nc_matmul(dst: np.ndarray, stationary: np.ndarray, moving: np.ndarray, **_: Any) -> None:
    # PSUM accumulates: dst += stationary.T @ moving (stationary is stored transposed).
    dst += matmul(stationary, moving, transpose_x=True)
