"""nkibuild toolchain double: fake `nki` (NKI 0.3-style public API, NumPy underneath).

`nki.jit` kernels run on NumPy through `nki.simulate`, as the real CPU simulator
runs them; called on (fake) XLA tensors they are traced through the fake
torch_xla instead. `nki.language` implements only what typical tiled kernels use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nki import language  # noqa: F401 - `import nki; nki.language` works as in NKI

__version__ = "0.3.0+nkibuild.fake"


class JitKernel:
    """What `@nki.jit` returns: callable, and `kernel[grid]` picks the launch grid."""

    def __init__(self, func: Callable[..., Any], grid: int = 1) -> None:
        self.func = func
        self.grid = grid
        self.__name__ = getattr(func, "__name__", "kernel")
        self.__wrapped__ = func

    def __getitem__(self, grid: int) -> JitKernel:
        return JitKernel(self.func, int(grid))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from nki._torch_xla import PyTorchXLAKernel

        return PyTorchXLAKernel(func=self)(*args, **kwargs)


def jit(func: Callable[..., Any] | None = None, **_options: Any) -> Any:
    if func is None:
        return lambda inner: JitKernel(inner)
    return JitKernel(func)


def simulate(kernel: Any) -> Callable[..., Any]:
    """Run a kernel on NumPy arrays (like nki.simulate); returns its outputs."""
    func = kernel.func if isinstance(kernel, JitKernel) else kernel
    return lambda *args, **kwargs: func(*args, **kwargs)
