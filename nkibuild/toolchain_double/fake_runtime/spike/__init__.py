"""nkibuild's toolchain double for `spike`, the Neuron runtime binding from aws-neuron/nkipy:
nkibuild's own Python layer (`SpikeModel`, `SpikeTensor`, `configure`, ...) over a CPU
stand-in for spike's native core (`spike._spike`), offering the public names, parameters
and defaults that `../shared/testdata/spike-api.json` records of spike, so code written for
spike runs here unchanged. It must not import nkibuild: it runs in environments where
only a bundle is installed.
"""

# The double's labels, outside __all__ (which is spike's): re-exported by alias.
from ._spike import CALLS as CALLS
from ._spike import IS_TOOLCHAIN_DOUBLE as IS_TOOLCHAIN_DOUBLE
from ._spike import (
    ModelTensorInfo,
    NrtError,
    NrtModel,
    NrtTensor,
    SpikeError,
    SystemTraceSession,
    TensorMetadata,
)
from .profiler_adapter import SpikeProfiler
from .spike_model import BenchmarkResult, SpikeModel
from .spike_singleton import configure, get_spike_singleton, reset
from .spike_tensor import SpikeTensor

__all__ = [
    "BenchmarkResult",
    "ModelTensorInfo",
    "NrtError",
    "NrtModel",
    "NrtTensor",
    "SpikeError",
    "SpikeModel",
    "SpikeProfiler",
    "SpikeTensor",
    "SystemTraceSession",
    "TensorMetadata",
    "configure",
    "get_spike_singleton",
    "reset",
]
