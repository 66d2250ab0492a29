"""nkibuild toolchain double: fake `nki._torch_xla` (NKI before 0.3).

NKI 0.3 (Neuron SDK 2.29) removed this module: `nki.jit` kernels are called on XLA
tensors directly. The double imitates the layout `NKIBUILD_FAKE_NKI_LAYOUT` names:
`0.2` has this module, `0.3` (the default, as the double's version says) does not.
"""

from nki import LAYOUT

if LAYOUT != "0.2":
    raise ImportError(
        "No module named 'nki._torch_xla' (removed in NKI 0.3; nkibuild's toolchain double "
        "imitates NKI 0.3 unless NKIBUILD_FAKE_NKI_LAYOUT=0.2)",
        name="nki._torch_xla",
    )

from nki._xla_trace import PyTorchXLAKernel

__all__ = ["PyTorchXLAKernel"]
