"""nkibuild toolchain double: how the fake nki traces a kernel on XLA tensors.

`PyTorchXLAKernel` is public as `nki._torch_xla.PyTorchXLAKernel` in the pre-0.3 layout
(see `_torch_xla.py`); in NKI 0.3 an `nki.jit` kernel does this itself when called on
XLA tensors. Calling it on (fake) XLA tensors records one graph on the fake XLA device: its
kernel module holds an `AwsNeuronCustomNativeKernel` custom-call whose
backend_config is base64 JSON naming the kernel's "compiled" file by absolute
path, in a temp dir of its own outside the dump directory, as the real toolchain
does. The output shapes come from running the kernel once under `nki.simulate`
on zeros of the tensors' shapes and dtypes.
"""

from __future__ import annotations

import base64
import hashlib
import inspect
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch_xla.core import xla_model

from nki import JitKernel, simulate
from nki.language import numpy_dtype

CUSTOM_CALL_TARGET = "AwsNeuronCustomNativeKernel"

Signature = list[tuple[str, str, tuple[int, ...]]]


class PyTorchXLAKernel:
    def __init__(self, func: Callable[..., Any], grid: int | None = None) -> None:
        kernel = func if isinstance(func, JitKernel) else JitKernel(func)
        self.kernel = kernel if grid is None else kernel[grid]

    def __getitem__(self, grid: int) -> PyTorchXLAKernel:
        return PyTorchXLAKernel(self.kernel, grid)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        tensors = [a for a in args if torch.is_tensor(a)]  # anything else specializes the kernel
        result = self._simulate(args, kwargs)
        outputs = result if isinstance(result, tuple) else (result,)
        inputs = [(f"p{i}", t.dtype.name, tuple(t.shape)) for i, t in enumerate(tensors)]
        results = [(np.dtype(o.dtype).name, tuple(o.shape)) for o in outputs]
        identity = self._identity(inputs, kwargs)
        graph = xla_model.Graph(
            self.kernel.__name__, inputs, results, self._custom_call(identity), identity
        )
        xla_model.record(graph)
        device = xla_model.xla_device()
        fakes = tuple(torch.Tensor(dims, getattr(torch, dtype), device) for dtype, dims in results)
        return fakes if isinstance(result, tuple) else fakes[0]

    def _simulate(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The kernel's outputs on zeros: how the double learns their shapes and dtypes."""
        samples = [_zeros_like(a) if torch.is_tensor(a) else a for a in args]
        result = simulate(self.kernel)(*samples, **kwargs)
        if result is None:
            raise TypeError(
                f"{self.kernel.__name__} returned nothing: the toolchain double supports "
                "kernels that return their outputs (nl.ndarray(..., buffer=nl.shared_hbm))"
            )
        return result

    def _identity(self, inputs: Signature, constants: dict[str, Any]) -> str:
        """What the real trace depends on: kernel source, signature, target, grid."""
        source = inspect.getsource(self.kernel.func)
        key = [source, inputs, sorted(constants.items()), xla_model.target(), self.kernel.grid]
        return hashlib.sha256(json.dumps(key, default=str).encode()).hexdigest()

    def _custom_call(self, identity: str) -> tuple[str, bytes]:
        # The real toolchain leaves the compiled kernel in a temp dir of its own,
        # named by absolute path: the HLO alone is not relocatable.
        bir = Path(tempfile.mkdtemp(prefix="nki-")) / f"{self.kernel.__name__}.klir"
        bir.write_bytes(b"nkibuild toolchain double: placeholder BIR " + identity.encode())
        config = {
            "func_name": self.kernel.__name__,
            "bir_path": str(bir),
            "grid": self.kernel.grid,
            "platform_target": xla_model.target(),
        }
        return CUSTOM_CALL_TARGET, base64.b64encode(json.dumps(config).encode())


def _zeros_like(tensor: Any) -> np.ndarray:
    return np.zeros(tuple(tensor.shape), numpy_dtype(tensor.dtype.name))
