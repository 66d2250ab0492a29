"""Checks of a kernel's `padding` declaration (padding calls up to a shape bucket).

Two stages know different things: the manifest knows the inputs and variants
(`padding_diagnostics`, run with the semantic checks), only the compiled NEFFs know
the outputs (`output_problems`, run when the bundle is generated).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from nkibuild.errors import Diagnostic
from nkibuild.manifest.model import Kernel, Manifest, PaddedOutputAxis, Padding
from nkibuild.manifest.phrases import did_you_mean

if TYPE_CHECKING:  # the bundle stage imports this module and must not load a YAML parser
    from nkibuild.manifest.yamlsource import JsonPath, YamlDocument

# Float formats narrower than float64: significand bits (the implicit one included),
# smallest normal exponent, largest finite value, whether it has infinities.
_FLOATS = {
    "float16": (11, -14, 65504.0, True),
    "bfloat16": (8, -126, (2 - 2.0**-7) * 2.0**127, True),
    "float32": (24, -126, (2 - 2.0**-23) * 2.0**127, True),
    "float8_e5m2": (3, -14, 57344.0, True),
    "float8_e4m3fn": (4, -6, 448.0, False),
    "float8_e4m3": (4, -6, 240.0, True),
}


def holds_exactly(dtype: str, number: float) -> bool:
    """Whether `dtype` holds `number` exactly: a pad value it would round, overflow or
    wrap is not what the manifest says padded elements hold."""
    try:
        value = float(number)  # YAML gives ints as they are written
    except OverflowError:
        return False
    if isinstance(number, int) and value != number:  # beyond float64's precision
        return False
    if dtype == "float64" or (dtype in _FLOATS and math.isnan(value)):
        return True
    if dtype in _FLOATS:
        bits, smallest, largest, infinite = _FLOATS[dtype]
        if math.isinf(value):
            return infinite
        exponent = max(math.frexp(value)[1] - 1, smallest)  # subnormals: the smallest
        return abs(value) <= largest and (value * 2.0 ** (bits - 1 - exponent)).is_integer()
    if not value.is_integer():  # nan and inf are not either
        return False
    if dtype == "bool":
        return value in (0, 1)
    width = int(dtype.removeprefix("u").removeprefix("int"))
    low = 0 if dtype.startswith("u") else -(2 ** (width - 1))
    return low <= value < low + 2**width


def padding_diagnostics(manifest: Manifest, doc: YamlDocument) -> Iterator[Diagnostic]:
    """Problems of every kernel's `padding` the schema cannot see."""
    for kernel in manifest.kernels:
        if kernel.padding is not None:
            yield from _inputs(kernel, kernel.padding, doc)
            yield from _outputs(kernel, kernel.padding, doc)


def _inputs(kernel: Kernel, padding: Padding, doc: YamlDocument) -> Iterator[Diagnostic]:
    """Each padded input must exist, have the padded axes in every variant, and hold the
    pad value exactly in every dtype it has."""
    base: JsonPath = ("kernels", kernel.name, "padding")
    names = [spec.name for spec in kernel.inputs]
    for name, axes in padding.inputs:
        if name not in names:
            yield doc.at(
                f"padding names {name!r}, not an input of {kernel.name!r}",
                (*base, "inputs", name),
                key=True,
                expected="one of " + ", ".join(names),
                hint=did_you_mean(name, names),
            )
        for index, axis in enumerate(axes):
            for variant in kernel.variants:
                rank = next((len(t.shape) for t in variant.inputs if t.name == name), None)
                if rank is not None and axis >= rank:
                    yield doc.at(
                        f"{name!r} has no axis {axis}: it has {rank} in variant {variant.name!r}",
                        (*base, "inputs", name, index),
                        expected=f"an axis from 0 to {rank - 1}" if rank else "no axis",
                    )
                    break
        dtypes = {t.dtype for v in kernel.variants for t in v.inputs if t.name == name}
        for dtype in sorted(d for d in dtypes if not holds_exactly(d, padding.value)):
            yield doc.at(
                f"pad value {padding.value} cannot be held exactly by {name!r} ({dtype})",
                (*base, "value"),
                expected=f"a value {dtype} holds exactly",
            )


def _outputs(kernel: Kernel, padding: Padding, doc: YamlDocument) -> Iterator[Diagnostic]:
    """Each output axis must follow a padded input axis, and be listed once."""
    padded = {name: set(axes) for name, axes in padding.inputs}
    seen: set[tuple[int, int]] = set()
    for index, entry in enumerate(padding.outputs):
        path = ("kernels", kernel.name, "padding", "outputs", index)
        if entry.input_axis not in padded.get(entry.input, set()):
            listed = ", ".join(f"{n}.{a}" for n, axes in padding.inputs for a in axes)
            yield doc.at(
                f"output {entry.output} axis {entry.axis} follows {entry.follows!r}, "
                "which is not a padded input axis",
                (*path, "follows"),
                expected=f"one of {listed}",
            )
        if (entry.output, entry.axis) in seen:
            yield doc.at(
                f"output {entry.output} axis {entry.axis} is listed twice",
                path,
                hint="an output axis follows one input axis",
            )
        seen.add((entry.output, entry.axis))


def output_problems(
    kernel: Kernel, outputs: Mapping[str, Mapping[str, Sequence[tuple[int, ...]]]]
) -> list[str]:
    """Why the declared output axes do not fit the compiled outputs (each NEFF's output
    shapes, by target and variant), one line each. In every variant, a declared output
    axis must exist and be as long as the input axis it follows: that is what makes
    cutting it back to the call's length right."""
    if kernel.padding is None:
        return []
    shapes = {v.name: {t.name: t.shape for t in v.inputs} for v in kernel.variants}
    problems = []
    for index, entry in enumerate(kernel.padding.outputs):
        found = (
            _axis_problem(entry, shapes[variant], target, variant, shapes_found)
            for target, by_variant in sorted(outputs.items())
            for variant, shapes_found in by_variant.items()
        )
        problem = next(filter(None, found), None)  # one per declared axis is enough to fix it
        if problem:
            problems.append(f"kernels.{kernel.name}.padding.outputs[{index}]: {problem}")
    return problems


def _axis_problem(
    entry: PaddedOutputAxis,
    inputs: Mapping[str, tuple[int, ...]],
    target: str,
    variant: str,
    found: Sequence[tuple[int, ...]],
) -> str | None:
    expected = inputs[entry.input][entry.input_axis]
    output, axis = entry.output, entry.axis
    if output >= len(found):
        problem = f"the kernel has {len(found)} output{'s' if len(found) != 1 else ''}"
    elif axis >= len(found[output]):
        problem = f"output {output} has shape {list(found[output])}, without axis {axis}"
    elif found[output][axis] != expected:
        problem = f"it is {found[output][axis]} long (shape {list(found[output])})"
    else:
        return None
    return (
        f"output {output} axis {axis} should follow {entry.follows} ({expected} in variant "
        f"{variant!r}), but in the {target} NEFF of {variant!r} {problem}"
    )
