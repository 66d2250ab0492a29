"""nkibuild's toolchain double for `nrtpy`, the Neuron runtime's Python binding.

nrtpy has spike's shape (`NrtpyModel.load_from_neff`, `input_tensors_info`, `model(inputs,
outputs=None)`, `NrtpyTensor.from_numpy`, `configure`, `reset`), so this double is a thin
renaming of the spike double's layer on the same CPU core (`spike._spike`): it never
computes a kernel (outputs are zeros) and records what it receives as the spike double
does. Labelled: `IS_TOOLCHAIN_DOUBLE`, which bundles check before loading a placeholder
NEFF. Standard library and NumPy only; it must not import nkibuild.
"""

import spike._spike as _core
from spike import (
    BenchmarkResult,
    NrtError,
    SpikeModel,
    SpikeTensor,
    TensorMetadata,
    configure,
    reset,
)
from spike import SpikeError as NrtpyError

# The label is the core's: real nrtpy next to the double's spike is not the double.
IS_TOOLCHAIN_DOUBLE = bool(getattr(_core, "IS_TOOLCHAIN_DOUBLE", False))


class NrtpyTensor(SpikeTensor):
    """A tensor on a NeuronCore of the double's CPU core."""


class NrtpyModel(SpikeModel):
    """A NEFF loaded into the double's CPU core."""


__all__ = [
    "BenchmarkResult",
    "NrtError",
    "NrtpyError",
    "NrtpyModel",
    "NrtpyTensor",
    "TensorMetadata",
    "configure",
    "reset",
]
