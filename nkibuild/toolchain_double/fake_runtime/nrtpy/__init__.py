"""nkibuild's toolchain double for `nrtpy`, the Neuron runtime's Python binding.

nrtpy has spike's shape (`NrtpyModel.load_from_neff`, `input_tensors_info`, `model(inputs,
outputs=None)`, `NrtpyTensor.from_numpy`, `configure`, `reset`), so this double is the
spike double's layer renamed, on the same CPU core (`spike._spike`): it computes nothing
(outputs are zeros) and records what it receives as the spike double does. Labelled by
`IS_TOOLCHAIN_DOUBLE`. Standard library and NumPy only; it must not import nkibuild.
"""

import spike._spike as _core
from spike import (  # noqa: F401
    BenchmarkResult,
    NrtError,
    SpikeModel,
    SpikeTensor,
    TensorMetadata,
    configure,
    reset,
)
from spike import SpikeError as NrtpyError  # noqa: F401

# The label is the core's: real nrtpy next to the double's spike is not the double.
IS_TOOLCHAIN_DOUBLE = bool(getattr(_core, "IS_TOOLCHAIN_DOUBLE", False))


class NrtpyTensor(SpikeTensor):
    """A tensor on the double's CPU core."""


class NrtpyModel(SpikeModel):
    """A NEFF loaded into the double's CPU core."""
