"""nkibuild toolchain double: fake `nkipy.core.nki_op` (nkipy's NKI op, for nki >= 0.4).

`wrap_nki_kernel(kernel, operands, is_nki_beta_3_version=True, platform_target=t)` compiles
an `nki.jit` kernel for the sample operands (which map to the kernel's parameters in
order, as the real op maps them) through the double's nki: simulated on zeros, a
placeholder compiled file in a temp dir. Called while `NKIPyKernel.specialize` traces a
function, the op returns the kernel's outputs and the traced module's root becomes the
kernel's `AwsNeuronCustomNativeKernel` custom-call, naming that file by absolute path,
as the real op's module does.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

_CALLS: contextvars.ContextVar[list[tuple[str, bytes]] | None] = contextvars.ContextVar(
    "nkipy_fake_nki_calls", default=None
)


@contextlib.contextmanager
def recording() -> Iterator[list[tuple[str, bytes]]]:
    """The NKI custom-calls a traced function makes (what `specialize` puts in its module)."""
    calls: list[tuple[str, bytes]] = []
    token = _CALLS.set(calls)
    try:
        yield calls
    finally:
        _CALLS.reset(token)


class NKICustomOp:
    def __init__(self, kernel: Any, operands: Sequence[Any], platform_target: str) -> None:
        from nki import JitKernel
        from nki._xla_trace import compile_kernel

        kernel = kernel if isinstance(kernel, JitKernel) else JitKernel(kernel)
        arguments = dict(zip(inspect.signature(kernel.func).parameters, operands, strict=False))
        self.result, _, _, self.custom_call, _ = compile_kernel(
            kernel, arguments, lambda value: isinstance(value, np.ndarray), platform_target
        )

    def __call__(self, *operands: Any) -> Any:
        calls = _CALLS.get()
        if calls is None:
            raise NotImplementedError(
                "toolchain double: an NKI op runs only inside a function nkipy traces"
            )
        calls.append(self.custom_call)
        return self.result


def wrap_nki_kernel(
    kernel: Any,
    operands: Sequence[Any],
    grid: tuple[int, ...] = (),
    is_nki_beta_2_version: bool = False,
    is_nki_beta_3_version: bool = False,
    platform_target: str | None = None,
    **_options: Any,
) -> NKICustomOp:
    if not is_nki_beta_3_version:
        raise ImportError(
            "nkibuild's toolchain double imitates only the Beta 3 NKI op (nki >= 0.4)"
        )
    return NKICustomOp(kernel, list(operands), platform_target or "trn1")
