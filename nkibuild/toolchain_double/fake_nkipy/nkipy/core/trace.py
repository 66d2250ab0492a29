"""nkibuild toolchain double: fake `nkipy.core.trace.NKIPyKernel`.

nkipy kernels are NumPy functions: `specialize` runs the function on the sample
arrays to learn its outputs, then describes the signature as an HLO module whose
parameters are the function's array arguments, by their Python names.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from nkibuild.toolchain_double.hlo_writer import build_hlo_module


class _Proto:
    def __init__(self, data: bytes) -> None:
        self._data = data

    def SerializeToString(self) -> bytes:
        return self._data


class _Code:
    def __init__(self, data: bytes) -> None:
        self._data = data

    def to_proto(self) -> _Proto:
        return _Proto(self._data)


class NKIPyKernel:
    def __init__(self, fn: Callable[..., Any], backend: str) -> None:
        self.fn = fn
        self.backend = backend
        self._code: _Code | None = None

    @classmethod
    def trace(cls, fn: Callable[..., Any], backend: str = "hlo") -> NKIPyKernel:
        return cls(fn, backend)

    def specialize(self, *args: Any, **kwargs: Any) -> NKIPyKernel:
        bound = inspect.signature(self.fn).bind(*args, **kwargs)
        parameters = [
            (name, np.dtype(value.dtype).name, value.shape)
            for name, value in bound.arguments.items()
            if isinstance(value, np.ndarray)  # non-array arguments pass through
        ]
        result = self.fn(*args, **kwargs)
        outputs = result if isinstance(result, tuple) else (result,)
        arrays = [np.asarray(output) for output in outputs]
        results = [(array.dtype.name, array.shape) for array in arrays]
        self._code = _Code(build_hlo_module(self.fn.__name__, parameters, results))
        return self
