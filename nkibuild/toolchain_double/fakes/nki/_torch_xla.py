"""nkibuild toolchain double: fake `nki._torch_xla` (NKI before 0.3).

NKI 0.3 (Neuron SDK 2.29) removed this module: `nki.jit` kernels are called on XLA
tensors directly. The double has it only when it imitates an NKI before 0.3
(`NKIBUILD_FAKE_NKI_VERSION`).
"""

from nki import RELEASE, __version__

if RELEASE >= (0, 3):
    raise ImportError(
        f"No module named 'nki._torch_xla' (removed in NKI 0.3; nkibuild's toolchain double "
        f"imitates NKI {__version__})",
        name="nki._torch_xla",
    )

from nki._xla_trace import PyTorchXLAKernel

__all__ = ["PyTorchXLAKernel"]
