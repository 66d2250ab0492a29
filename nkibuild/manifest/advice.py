"""Warnings: what a manifest may say but likely does not mean.

Read from the model alone (no YAML, no schema), so that a plan from the plan cache
warns alike and `validate` of an unchanged manifest stays light.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from nkibuild.errors import Diagnostic
from nkibuild.manifest.model import Kernel, Manifest, TensorSpec


def manifest_warnings(manifest: Manifest) -> list[Diagnostic]:
    """Every warning about the manifest, in manifest order."""
    return [warning for kernel in manifest.kernels for warning in _unbuilt_declaration(kernel)]


def _unbuilt_declaration(kernel: Kernel) -> Iterator[Diagnostic]:
    """The declared inputs are the kernel's sample call (docs, `verify`, a user's first
    try): a bundle whose variants all differ from them refuses that call."""
    padded = dict(kernel.padding.inputs) if kernel.padding else {}
    if any(_takes(variant.inputs, kernel.inputs, padded) for variant in kernel.variants):
        return
    declared = ", ".join(str(spec) for spec in kernel.inputs)
    yield Diagnostic(
        f"no variant of kernel {kernel.name!r} takes its declared inputs ({declared})",
        kernel.location,
        f"$.kernels.{kernel.name}.inputs",
        hint="the bundle will refuse a call with the declared shapes: add a variant that "
        "keeps them (one that names no input, e.g. `base: {}`), or declare the inputs of "
        "one of the variants",
        severity="warning",
    )


def _takes(
    bucket: Sequence[TensorSpec],
    call: Sequence[TensorSpec],
    padded: dict[str, tuple[int, ...]],
) -> bool:
    """Whether a variant takes the call: equal dtypes and shapes, except that a padded
    axis may be shorter in the call (as the bundle's runtime decides)."""
    return all(
        have.dtype == most.dtype
        and len(have.shape) == len(most.shape)
        and all(
            length <= limit if axis in padded.get(have.name, ()) else length == limit
            for axis, (length, limit) in enumerate(zip(have.shape, most.shape, strict=True))
        )
        for have, most in zip(call, bucket, strict=True)
    )
