"""nkibuild toolchain double: fake `nki` (public API of the NKI release it imitates, NumPy
underneath).

`NKIBUILD_FAKE_NKI_VERSION` names that release (default: the newest the double knows, as
`nkibuild.toolchain_double.fake_nki_version` says; this module imports no nkibuild, so
that a bundle run in isolation finds it), and the fake follows what changed in NKI at
0.3 and 0.7 (docs/toolchain-double.md). As the real `nki.jit` dispatches on its
arguments' types, a kernel runs on NumPy through `nki.simulate` and is traced through
the fake torch_xla when called on (fake) torch tensors; running on a device is refused.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from nki import isa, language  # noqa: F401 - `import nki; nki.language` works as in NKI

VERSION = os.environ.get("NKIBUILD_FAKE_NKI_VERSION") or "0.7.0"
__version__ = f"{VERSION}+nkibuild.fake"
RELEASE = tuple(int(part) for part in VERSION.split(".")[:2])


class JitKernel:
    """What `@nki.jit` returns: callable; before NKI 0.7 `kernel[grid]` picks the launch grid."""

    def __init__(
        self, func: Callable[..., Any], grid: int | None = None, mode: str = "auto"
    ) -> None:
        self.func = func
        self._grid = grid
        self.mode = mode if RELEASE < (0, 3) else "auto"  # ignored from 0.3 on
        self.__name__ = getattr(func, "__name__", "kernel")
        self.__wrapped__ = func

    @property
    def grid(self) -> int:
        if RELEASE >= (0, 7):
            return int(os.environ.get("NEURON_LOGICAL_NC_CONFIG") or 1)
        return self._grid or 1

    def __getitem__(self, grid: int) -> JitKernel:
        if RELEASE >= (0, 7):
            raise TypeError(
                f"{self.__name__}[{grid}]: NKI {VERSION} takes the launch grid "
                "from NEURON_LOGICAL_NC_CONFIG (1 or 2), set before the kernel runs"
            )
        return JitKernel(self.func, int(grid), self.mode)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.mode == "simulation":
            return simulate(self)(*args, **kwargs)
        # The real dispatch looks at argument types. No tensor can exist unless torch
        # was imported, and NumPy-only kernels must not need torch.
        torch = sys.modules.get("torch")
        tensors = torch is not None and any(map(torch.is_tensor, (*args, *kwargs.values())))
        if self.mode == "torchxla" or tensors:
            from nki._xla_trace import PyTorchXLAKernel

            return PyTorchXLAKernel(func=self)(*args, **kwargs)
        raise RuntimeError(
            f"nkibuild's toolchain double cannot run {self.__name__} on a device: "
            "use nki.simulate(kernel)(*arrays) on NumPy arrays, or call it on XLA tensors"
        )


def jit(func: Callable[..., Any] | None = None, mode: str = "auto", **options: Any) -> Any:
    if "platform_target" in options and RELEASE >= (0, 3):
        raise TypeError(
            "nki.jit() got an unexpected keyword argument 'platform_target' (NKI 0.3 removed "
            "it: set NEURON_PLATFORM_TARGET_OVERRIDE)"
        )
    if func is None:
        return lambda inner: JitKernel(inner, mode=mode)
    return JitKernel(func, mode=mode)


def simulate(kernel: Any) -> Callable[..., Any]:
    """Run a kernel on NumPy arrays (like nki.simulate, with the launch grid the kernel
    would run with); returns its outputs."""
    jitted = kernel if isinstance(kernel, JitKernel) else JitKernel(kernel)

    def run(*args: Any, **kwargs: Any) -> Any:
        token = language.GRID.set(jitted.grid)
        try:
            return jitted.func(*args, **kwargs)
        finally:
            language.GRID.reset(token)

    return run
