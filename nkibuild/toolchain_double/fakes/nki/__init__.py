"""nkibuild toolchain double: fake `nki` (NKI 0.3-style public API, NumPy underneath).

`NKIBUILD_FAKE_NKI_LAYOUT=0.2` makes it the pre-0.3 layout instead: it then also has
`nki._torch_xla.PyTorchXLAKernel`, which NKI 0.3 removed.

`nki.jit` kernels run on NumPy through `nki.simulate`, as the real CPU simulator
runs them; called on (fake) torch XLA tensors they are traced through the fake
torch_xla, as the real `nki.jit` dispatches on its arguments' types. Running on a
device ("baremetal") is refused. `nki.language` implements only what typical tiled
kernels use, `nki.isa` the few instructions of the NKI 0.3 tutorials.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from nki import isa, language  # noqa: F401 - `import nki; nki.language` works as in NKI

LAYOUT = os.environ.get("NKIBUILD_FAKE_NKI_LAYOUT", "0.3")
__version__ = f"{LAYOUT}.0+nkibuild.fake"


class JitKernel:
    """What `@nki.jit` returns: callable, and `kernel[grid]` picks the launch grid."""

    def __init__(self, func: Callable[..., Any], grid: int = 1, mode: str = "auto") -> None:
        self.func = func
        self.grid = grid
        self.mode = mode
        self.__name__ = getattr(func, "__name__", "kernel")
        self.__wrapped__ = func

    def __getitem__(self, grid: int) -> JitKernel:
        return JitKernel(self.func, int(grid), self.mode)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.mode == "simulation":
            return simulate(self)(*args, **kwargs)
        if self.mode == "torchxla" or _has_torch_tensor(args, kwargs):
            from nki._xla_trace import PyTorchXLAKernel

            return PyTorchXLAKernel(func=self)(*args, **kwargs)
        raise RuntimeError(
            f"nkibuild's toolchain double cannot run {self.__name__} on a device: "
            "use nki.simulate(kernel)(*arrays) on NumPy arrays, or call it on XLA tensors"
        )


def _has_torch_tensor(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    # The real dispatch looks at argument types. No tensor can exist unless torch
    # was imported, and NumPy-only kernels must not need torch.
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    return any(torch.is_tensor(value) for value in (*args, *kwargs.values()))


def jit(func: Callable[..., Any] | None = None, mode: str = "auto", **_options: Any) -> Any:
    if func is None:
        return lambda inner: JitKernel(inner, mode=mode)
    return JitKernel(func, mode=mode)


def simulate(kernel: Any) -> Callable[..., Any]:
    """Run a kernel on NumPy arrays (like nki.simulate, `nki.simulate(kernel[2])` for a
    launch grid of 2); returns its outputs."""
    func = kernel.func if isinstance(kernel, JitKernel) else kernel
    grid = kernel.grid if isinstance(kernel, JitKernel) else 1

    def run(*args: Any, **kwargs: Any) -> Any:
        token = language.GRID.set(grid)
        try:
            return func(*args, **kwargs)
        finally:
            language.GRID.reset(token)

    return run
