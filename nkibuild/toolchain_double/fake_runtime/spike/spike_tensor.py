"""`SpikeTensor`: a NumPy-typed handle on a tensor of the runtime."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ._spike import NrtTensor
from .spike_singleton import get_spike_singleton


class SpikeTensor:
    """A tensor "on the device" with a shape and a NumPy dtype; the runtime holds its bytes."""

    def __init__(
        self, tensor_ref: NrtTensor, shape: Any, dtype: Any, name: str | None = None
    ) -> None:
        self.tensor_ref = tensor_ref
        self.shape: tuple[int, ...] = (shape,) if isinstance(shape, int) else tuple(shape)
        self.dtype = dtype
        self.name = name

    @classmethod
    def from_numpy(cls, array: Any, name: str | None = None, core_id: int = 0) -> SpikeTensor:
        """Copy `array` to a new tensor on `core_id`.

        As spike: through np.ascontiguousarray, which also makes a 0-d array 1-d.
        """
        array = np.ascontiguousarray(array)
        runtime = get_spike_singleton()
        ref = runtime.allocate_tensor(size=array.nbytes, core_id=core_id, name=name)
        runtime.tensor_write_from_pybuffer(ref, array)
        return cls(tensor_ref=ref, shape=array.shape, dtype=array.dtype, name=name)

    def numpy(self) -> np.ndarray:
        array = np.empty(self.shape, dtype=self.dtype)
        get_spike_singleton().tensor_read_to_pybuffer(self.tensor_ref, array)
        return array

    def write_from_numpy(self, array: Any) -> None:
        """Overwrite the tensor's contents in place; the sizes must match."""
        array = np.ascontiguousarray(array)
        expected = math.prod(self.shape) * np.dtype(self.dtype).itemsize
        if array.nbytes != expected:
            raise ValueError(
                f"tensor {self.name!r} holds {expected} bytes; the array has {array.nbytes}"
            )
        get_spike_singleton().tensor_write_from_pybuffer(self.tensor_ref, array)
