"""nkibuild toolchain double: the sliver of `torch` the fake torch_xla needs.

It exists only so the fake extraction path runs where PyTorch is not installed;
tensors carry a shape, a dtype and a device, never data.
"""

from __future__ import annotations

from collections.abc import Sequence


class dtype:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"torch.{self.name}"


float32 = dtype("float32")
float16 = dtype("float16")
bfloat16 = dtype("bfloat16")
float64 = dtype("float64")
int8 = dtype("int8")
int16 = dtype("int16")
int32 = dtype("int32")
int64 = dtype("int64")
uint8 = dtype("uint8")
bool = dtype("bool")


class Tensor:
    def __init__(self, shape: Sequence[int], dtype: dtype, device: object = "cpu") -> None:
        self.shape = tuple(int(d) for d in shape)
        self.dtype = dtype
        self.device = device

    def to(self, device: object) -> Tensor:
        # Only `.to(device)`: a dtype conversion would need data the fake never has.
        return Tensor(self.shape, self.dtype, device)

    def __repr__(self) -> str:
        return f"Tensor(shape={self.shape}, dtype={self.dtype!r}, device={self.device})"


def is_tensor(value: object) -> bool:
    return isinstance(value, Tensor)


def zeros(*shape: int | Sequence[int], dtype: dtype = float32) -> Tensor:
    dims = shape[0] if len(shape) == 1 and not isinstance(shape[0], int) else shape
    return Tensor(dims, dtype)  # type: ignore[arg-type]
