"""nkibuild toolchain double: how the fake nki puts a kernel into an HLO module, on both
extraction routes: the fake nkipy's NKI op puts `compile_kernel`'s custom-call into the
module it traces, and `PyTorchXLAKernel` records it as a graph on the fake XLA device
(public as `nki._torch_xla.PyTorchXLAKernel` before NKI 0.3; from 0.3 an `nki.jit`
kernel does this itself when called on XLA tensors).
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

from nki import JitKernel, simulate
from nki.language import numpy_dtype

CUSTOM_CALL_TARGET = "AwsNeuronCustomNativeKernel"

Signature = list[tuple[str, str, tuple[int, ...]]]


def compile_kernel(
    kernel: JitKernel, arguments: dict[str, Any], is_tensor: Callable[[Any], bool], target: str
) -> tuple[Any, Signature, list[tuple[str, tuple[int, ...]]], tuple[str, bytes], str]:
    """The kernel's outputs (how the double learns them: `nki.simulate` on zeros), its
    tensor inputs and results, its `AwsNeuronCustomNativeKernel` custom-call and what its
    compilation depends on (kernel source, signature, target, launch grid). `arguments`
    by parameter name: tensors, and anything else that specializes the kernel."""
    tensors = {k: v for k, v in arguments.items() if is_tensor(v)}
    constants = sorted((k, v) for k, v in arguments.items() if k not in tensors)
    zeros = {k: np.zeros(tuple(v.shape), numpy_dtype(v.dtype.name)) for k, v in tensors.items()}
    result = simulate(kernel)(**(arguments | zeros))
    if result is None:
        raise TypeError(
            f"{kernel.__name__} returned nothing: the toolchain double supports "
            "kernels that return their outputs (nl.ndarray(..., buffer=nl.shared_hbm))"
        )
    outputs = result if isinstance(result, tuple) else (result,)
    inputs = [(f"p{i}", t.dtype.name, tuple(t.shape)) for i, t in enumerate(tensors.values())]
    results = [(np.dtype(o.dtype).name, tuple(o.shape)) for o in outputs]
    key = [inspect.getsource(kernel.func), inputs, constants, target, kernel.grid]
    identity = hashlib.sha256(json.dumps(key, default=str).encode()).hexdigest()
    return result, inputs, results, _custom_call(kernel, identity, target), identity


def _custom_call(kernel: JitKernel, identity: str, target: str) -> tuple[str, bytes]:
    # The real toolchain leaves the compiled kernel in a temp dir of its own,
    # named by absolute path: the HLO alone is not relocatable.
    bir = Path(tempfile.mkdtemp(prefix="nki-")) / f"{kernel.__name__}.klir"
    bir.write_bytes(b"nkibuild toolchain double: placeholder BIR " + identity.encode())
    config = {
        "func_name": kernel.__name__,
        "bir_path": str(bir),
        "grid": kernel.grid,
        "platform_target": target,
    }
    return CUSTOM_CALL_TARGET, base64.b64encode(json.dumps(config).encode())


class PyTorchXLAKernel:
    def __init__(self, func: Callable[..., Any], grid: int | None = None) -> None:
        kernel = func if isinstance(func, JitKernel) else JitKernel(func)
        self.kernel = kernel if grid is None else kernel[grid]

    def __getitem__(self, grid: int) -> PyTorchXLAKernel:
        return PyTorchXLAKernel(self.kernel, grid)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch
        from torch_xla.core import xla_model

        bound = inspect.signature(self.kernel.func).bind(*args, **kwargs)
        bound.apply_defaults()
        result, inputs, results, call, identity = compile_kernel(
            self.kernel, bound.arguments, torch.is_tensor, xla_model.target()
        )
        xla_model.record(xla_model.Graph(self.kernel.__name__, inputs, results, call, identity))
        device = xla_model.xla_device()
        fakes = tuple(torch.Tensor(dims, getattr(torch, dtype), device) for dtype, dims in results)
        return fakes if isinstance(result, tuple) else fakes[0]
