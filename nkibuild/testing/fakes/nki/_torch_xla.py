"""nkibuild toolchain double: fake `nki._torch_xla.PyTorchXLAKernel`.

Calling it on (fake) XLA tensors records one graph on the fake XLA device: its
kernel module holds an `AwsNeuronCustomNativeKernel` custom-call whose
backend_config is base64 JSON naming the kernel's "compiled" file by absolute
path, outside the dump directory, as the real toolchain does. The output shapes
come from running the kernel once under `nki.simulate` on zeros.
"""

from __future__ import annotations

import base64
import hashlib
import inspect
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import torch
from torch_xla.core import xla_model

from nki import JitKernel, simulate


def _numpy_dtype(name: str) -> Any:
    return ml_dtypes.bfloat16 if name == "bfloat16" else np.dtype(name)


class PyTorchXLAKernel:
    def __init__(self, func: Any, grid: int = 1) -> None:
        self.kernel = func if isinstance(func, JitKernel) else JitKernel(func, grid)

    def __getitem__(self, grid: int) -> PyTorchXLAKernel:
        return PyTorchXLAKernel(self.kernel[grid])

    def __call__(self, *tensors: torch.Tensor, **kwargs: Any) -> Any:
        samples = [np.zeros(t.shape, _numpy_dtype(t.dtype.name)) for t in tensors]
        result = simulate(self.kernel)(*samples, **kwargs)
        outputs = result if isinstance(result, tuple) else (result,)
        inputs = [(f"p{i}", t.dtype.name, t.shape) for i, t in enumerate(tensors)]
        results = [(str(o.dtype), tuple(o.shape)) for o in outputs]
        xla_model.record(
            xla_model.Graph(self.kernel.__name__, inputs, results, self._custom_call(inputs))
        )
        device = xla_model.xla_device()
        fakes = tuple(torch.Tensor(o.shape, getattr(torch, str(o.dtype)), device) for o in outputs)
        return fakes if isinstance(result, tuple) else fakes[0]

    def _custom_call(self, inputs: list) -> tuple[str, bytes]:
        source = inspect.getsource(self.kernel.func)
        target = os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
        identity = json.dumps([source, inputs, target, self.kernel.grid], default=str).encode()
        digest = hashlib.sha256(identity).hexdigest()
        # The real toolchain leaves the compiled kernel in a temp dir of its own.
        bir = Path(tempfile.mkdtemp(prefix="nki-")) / f"{self.kernel.__name__}.klir"
        bir.write_bytes(b"nkibuild toolchain double: placeholder BIR " + digest.encode())
        config = {
            "kernel_name": self.kernel.__name__,
            "bir_path": str(bir),
            "grid": self.kernel.grid,
        }
        return "AwsNeuronCustomNativeKernel", base64.b64encode(json.dumps(config).encode())
