"""Runtime shared by every kernel bundle; copied verbatim into each bundle as `_runtime.py`.

It is vendored rather than depended on so that an installed bundle needs only
NumPy: not nkibuild, not the compiler, not nki, not jax (nrtpy and nki cannot even
share an environment). It must stay importable on Python >= 3.10 with the standard
library and NumPy alone. It imports a runtime binding (nrtpy, else spike) only when a
kernel first runs in `neuron` mode, nki only in `simulate` mode, torch
only when asked for the kernels as torch ops (`<package>.torch_ops`; otherwise a
torch tensor passed in brings its module along), and ml_dtypes only to convert a
bfloat16 torch tensor.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from functools import cache, cached_property
from importlib import resources
from typing import Any, NamedTuple

MODES = ("auto", "neuron", "simulate", "reference")
MODE_ENV = "NKIBUILD_MODE"
TARGET_ENV = "NKIBUILD_TARGET"
SDK_VERSION_ENV = "NKIBUILD_NEURON_SDK_VERSION"
LNC_ENV = "NEURON_LOGICAL_NC_CONFIG"
PRODUCT_NAME_FILE = "/sys/devices/virtual/dmi/id/product_name"
PLATFORM_TARGET_ENV = "NEURON_PLATFORM_TARGET_OVERRIDE"  # the target NKI lowers for
TARGETS = ("trn1", "trn2", "trn3")
# EC2 instance families (the instance type before the dot) and the target of their chips.
TARGET_OF_FAMILY = {
    "trn1": "trn1",
    "trn1n": "trn1",
    "trn2": "trn2",
    "trn2u": "trn2",
    "trn3": "trn3",
}
NEURON_FAMILY_PREFIXES = ("trn", "inf")
BINDING_ENV = "NKIBUILD_RUNTIME"
# Each binding, in the order `auto` tries them, and the module whose import proves it can
# reach libnrt (and which carries the toolchain double's label).
BINDINGS = {"nrtpy": "nrtpy", "spike": "spike._spike"}
BINDING_HELP = {
    "nrtpy": "install it from the Neuron pip repository, in an environment without nki",
    "spike": "not PyPI's unrelated 'spike': install it from aws-neuron/nkipy",
}
LEGACY_NEFF_ENV = "NEURON_RT_ALLOW_LEGACY_NEFF"  # lets a trn2 runtime load a trn1 NEFF
DEFAULT_LNC = {"trn1": 1, "trn2": 2, "trn3": 2}  # the runtime's when LNC_ENV is unset
NEFF_MIN_RUNTIME = {(2,): (1, 6, 5)}  # NEFF format's major -> the oldest runtime loading it

logger = logging.getLogger("nkibuild.bundle")


class KernelError(RuntimeError):
    """A kernel could not run as asked (bad arguments, no matching variant, no runtime)."""


def build_info(package: str) -> dict[str, Any]:
    """The bundle's build metadata (units, compiler version, flags, NEFF sha256s), and under
    `runtime` the binding this host runs its NEFFs through, and why."""
    return {**_document(package), "runtime": runtime_binding().report()}


@cache
def _document(package: str) -> dict[str, Any]:
    return json.loads(resources.files(package).joinpath("_build.json").read_text("utf-8"))


def host_target() -> str | None:
    """The Trainium target of this host (trn1/trn2/trn3): NKIBUILD_TARGET, else the instance
    type's family (`trn1n.32xlarge` -> trn1); None on a host that is no Neuron instance.

    A Neuron family nkibuild does not know (Inferentia, a newer Trainium) is an error,
    never a quiet fallback to the reference: its NEFFs might run there, or not.
    """
    override = os.environ.get(TARGET_ENV)
    if override:
        if override not in TARGETS:
            raise KernelError(
                f"{TARGET_ENV}={override!r} is not a target; use one of {', '.join(TARGETS)}"
            )
        return override
    instance = _instance_type()
    family = instance.split(".")[0] if instance else ""
    if family in TARGET_OF_FAMILY:
        return TARGET_OF_FAMILY[family]
    if family.startswith(NEURON_FAMILY_PREFIXES):
        raise KernelError(
            f"this host is a {instance} instance, whose Neuron target nkibuild does not know "
            f"(known families: {', '.join(TARGET_OF_FAMILY)}); set {TARGET_ENV} to the "
            f"target whose NEFFs it runs, or {MODE_ENV}=reference"
        )
    return None


def _instance_type() -> str | None:
    try:
        with open(PRODUCT_NAME_FILE, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return None


class Binding(NamedTuple):
    """The runtime binding this process runs NEFFs through, and why that one."""

    name: str | None  # "nrtpy" or "spike"; None: neither can run NEFFs here (`why` says why)
    why: str

    @property
    def double(self) -> bool:
        """Whether its core is nkibuild's CPU double, the only one a placeholder NEFF may be
        loaded into (spike's real Python layer on the double's core counts)."""
        core = sys.modules.get(BINDINGS.get(self.name or "", ""))
        return bool(getattr(core, "IS_TOOLCHAIN_DOUBLE", False))

    def report(self) -> dict[str, Any]:
        return {"binding": self.name, "why": self.why, "double": self.double}

    def api(self, kind: str) -> Any:
        """`NrtpyModel`/`SpikeModel` (kind "Model") or the Tensor class: nrtpy has spike's shape."""
        return getattr(importlib.import_module(str(self.name)), str(self.name).title() + kind)


@cache
def runtime_binding() -> Binding:
    """nrtpy where it is importable, else spike; NKIBUILD_RUNTIME=nrtpy|spike forces one.
    Resolved once. Importable means its native core loads: PyPI's unrelated `spike` has
    none, and either binding fails to load it without libnrt."""
    forced = os.environ.get(BINDING_ENV, "").strip()
    if forced and forced not in BINDINGS:
        return Binding(None, f"{BINDING_ENV}={forced!r} is not a binding; use nrtpy or spike")
    problems: list[str] = []
    for name in [forced] if forced else BINDINGS:
        try:
            importlib.import_module(BINDINGS[name])
        except ImportError as error:
            problems.append(f"{name} is not importable ({BINDING_HELP[name]}; {error})")
            continue
        chosen = f"{BINDING_ENV}={name}" if forced else f"{name} is importable"
        return Binding(name, "; ".join([*problems, chosen]))
    return Binding(None, "; ".join(problems) + (f" ({BINDING_ENV}={forced})" if forced else ""))


class Padding:
    """A kernel's opt-in padding to shape buckets (the manifest's `padding`, as JSON).

    A call fits a variant when its inputs have the variant's ranks, every padded axis
    is at most the variant's and every other axis equal; it is padded at the end of
    each padded axis with `value`, and each declared output axis is cut back to the
    call's length of the input axis it follows.
    """

    def __init__(
        self,
        names: Sequence[str],
        inputs: dict[str, list[int]],
        value: float | str,
        outputs: list[tuple[int, int, str, int]],
    ) -> None:
        self.axes = [frozenset(inputs.get(name, ())) for name in names]
        self.value = float(value)  # -inf and nan come as strings
        self.outputs = [
            (output, axis, list(names).index(name), input_axis)
            for output, axis, name, input_axis in outputs
        ]

    def fits(self, shapes: Sequence[tuple[int, ...]], bucket: Sequence[tuple[int, ...]]) -> bool:
        return all(
            len(shape) == len(limit)
            and all(
                have <= most if axis in padded else have == most
                for axis, (have, most) in enumerate(zip(shape, limit, strict=True))
            )
            for shape, limit, padded in zip(shapes, bucket, self.axes, strict=True)
        )

    def pad(self, arrays: Sequence[Any], bucket: Sequence[tuple[int, ...]]) -> list[Any]:
        import numpy as np

        padded = []
        for array, limit in zip(arrays, bucket, strict=True):
            widths = [(0, most - have) for have, most in zip(array.shape, limit, strict=True)]
            fill = np.asarray(self.value).astype(array.dtype)
            padded.append(np.pad(array, widths, constant_values=fill))
        return padded

    def cut_shapes(
        self, outputs: Sequence[tuple[int, ...]], shapes: Sequence[tuple[int, ...]]
    ) -> list[tuple[int, ...]]:
        """The outputs' shapes for a call of `shapes`, from the variant's `outputs`."""
        cut = [list(shape) for shape in outputs]
        for output, axis, argument, input_axis in self.outputs:
            cut[output][axis] = shapes[argument][input_axis]
        return [tuple(shape) for shape in cut]

    def cut(self, result: Any, shapes: Sequence[tuple[int, ...]]) -> Any:
        import numpy as np

        results = [np.asarray(r) for r in (result if isinstance(result, tuple) else [result])]
        wanted = self.cut_shapes([r.shape for r in results], shapes)
        cut = tuple(r[tuple(map(slice, shape))] for r, shape in zip(results, wanted, strict=True))
        return cut if isinstance(result, tuple) else cut[0]


class Kernel:
    """A callable kernel of a bundle: checks arguments, picks the variant, dispatches."""

    def __init__(self, package: str, name: str, padding: dict[str, Any] | None = None) -> None:
        self.package = package
        self.name = name
        self._info = _document(package)["kernels"][name]
        self._announced: str | None = None
        self.last_mode: str | None = None  # the mode the latest call ran in
        # Precomputed: every call checks against these, so they must cost nothing.
        self._names = [arg["name"] for arg in self._info["inputs"]]
        self._dtypes = [arg["dtype"] for arg in self._info["inputs"]]
        self._shapes_by_variant = [
            (variant, tuple(tuple(t["shape"]) for t in spec["inputs"]))
            for variant, spec in self._info["variants"].items()
        ]
        self._padding = Padding(self._names, **padding) if padding else None
        # Padding picks the smallest variant that fits: fewest input elements first.
        self._buckets = sorted(self._shapes_by_variant, key=lambda v: sum(map(math.prod, v[1])))
        self._constant_values = {n: _constant(v) for n, v in self._info["constants"]}
        # nkipy kernels are NumPy code: without a reference, the kernel is its own.
        nkipy_source = self._info.get("source") if self._info["frontend"] == "nkipy" else None
        self._reference = self._info["reference"] or nkipy_source

    @property
    def signature(self) -> tuple[tuple[str, str], ...]:
        """(argument name, dtype) in call order; shapes depend on the variant."""
        return tuple(zip(self._names, self._dtypes, strict=True))

    @property
    def variants(self) -> dict[str, dict[str, tuple[int, ...]]]:
        return {
            v: dict(zip(self._names, shapes, strict=True)) for v, shapes in self._shapes_by_variant
        }

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(self._info["neffs"])

    @property
    def frontend(self) -> str:
        """nki, nkipy, jax or hlo: which modes apply (simulate is for nki kernels)."""
        return str(self._info["frontend"])

    def __call__(self, *args: Any, mode: str | None = None, **kwargs: Any) -> Any:
        arrays, device = self._bind(args, kwargs)
        variant, inputs = self._fitted(arrays)
        chosen, reason = self._resolve_mode(mode, variant)
        result = getattr(self, f"_run_{chosen}")(inputs, variant)
        if inputs is not arrays and self._padding is not None:  # padded: cut back
            result = self._padding.cut(result, [a.shape for a in arrays])
        # Said after the run: a mode that then fails (no target, no spike) must not have
        # been logged as the one this kernel runs in; its error says what happened.
        self._announce(chosen, reason)
        self.last_mode = chosen
        return result if device is None else _as_torch(result, device)

    def load(self, target: str | None = None, variant: str | None = None) -> Any:
        """The binding's model (NrtpyModel or SpikeModel) for a (target, variant); loaded
        once and cached."""
        target = self._target(target)
        variant = variant or next(iter(self._info["variants"]))
        if variant not in self._info["variants"]:
            raise KernelError(f"{self.name} has no variant {variant!r}: {self._listing()}")
        self._neff(target, variant)  # a target built without this kernel: said, not a KeyError
        return _load_model(self.package, self.name, target, variant)

    def benchmark(
        self, *args: Any, warmup_iter: int = 5, benchmark_iter: int = 5, **kwargs: Any
    ) -> Any:
        """The binding's benchmark of the NEFF that `args` select, on this host's device."""
        arrays, _ = self._bind(args, kwargs)
        variant, fitted = self._fitted(arrays)
        model, inputs, _ = self._loaded(fitted, variant)
        return model.benchmark(
            inputs, outputs=None, warmup_iter=warmup_iter, benchmark_iter=benchmark_iter
        )

    # --- arguments ---------------------------------------------------------------------

    def _bind(self, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[list[Any], Any]:
        """Arguments by name, as NumPy arrays, and the torch device to return results on
        (None when no torch tensor was passed)."""
        import numpy as np

        names = self._names
        if len(args) > len(names):
            raise KernelError(f"{self.name}() takes {len(names)} arguments ({', '.join(names)})")
        bound = dict(zip(names, args, strict=False))
        for key, value in kwargs.items():
            if key not in names:
                raise KernelError(
                    f"{self.name}() has no argument {key!r}; it takes {', '.join(names)}"
                )
            if key in bound:
                raise KernelError(f"{self.name}() got argument {key!r} twice")
            bound[key] = value
        missing = [name for name in names if name not in bound]
        if missing:
            raise KernelError(f"{self.name}() is missing {', '.join(missing)}")
        values = [bound[name] for name in names]
        if all(type(value) is np.ndarray for value in values):
            return values, None  # the common case, without conversions
        devices = [value.device for value in values if _is_torch(value)]
        return [_as_numpy(value) for value in values], (devices[0] if devices else None)

    def _fitted(self, arrays: list[Any]) -> tuple[str, list[Any]]:
        """The variant for the arrays, and the arrays it runs on: `arrays` itself, or
        padded copies when the kernel pads and no variant matches exactly."""
        shapes = tuple(a.shape for a in arrays)
        variant, bucket = self._select_variant([a.dtype.name for a in arrays], shapes)
        if bucket is None or self._padding is None:
            return variant, arrays
        return variant, self._padding.pad(arrays, bucket)

    def _select_variant(
        self, dtypes: Sequence[str], shapes: tuple[tuple[int, ...], ...]
    ) -> tuple[str, tuple[tuple[int, ...], ...] | None]:
        """The variant for a call's dtypes and shapes, and the shapes to pad to (None: exact)."""
        if list(dtypes) != self._dtypes:
            raise KernelError(
                f"{self.name}() expects dtypes ({', '.join(self._dtypes)}), "
                f"got ({', '.join(dtypes)})"
            )
        for variant, variant_shapes in self._shapes_by_variant:
            if variant_shapes == shapes:
                return variant, None
        if self._padding is not None:
            for variant, variant_shapes in self._buckets:
                if self._padding.fits(shapes, variant_shapes):
                    return variant, variant_shapes
        raise KernelError(
            f"{self.name}() has no variant for shapes {_shapes(shapes)}"
            f"{self._padding_rule()}; {self._listing()}"
        )

    def _padding_rule(self) -> str:
        if self._padding is None:
            return ""
        padded = [
            f"{name} axes {','.join(map(str, sorted(axes)))}"
            for name, axes in zip(self._names, self._padding.axes, strict=True)
            if axes
        ]
        return f" (even padded: {'; '.join(padded)} may be shorter, every other axis equal)"

    def output_signature(
        self, dtypes: Sequence[str], shapes: tuple[tuple[int, ...], ...]
    ) -> list[tuple[str, tuple[int, ...]]]:
        """(dtype, shape) of each output of a call with these inputs, from the NEFFs of
        the variant it selects (cut back if the call is padded); KernelError if none fits."""
        variant, bucket = self._select_variant(dtypes, shapes)
        outputs = self._neff(self._signature_target(), variant)["outputs"]
        found = [tuple(t["shape"]) for t in outputs]
        if bucket is not None and self._padding is not None:
            found = self._padding.cut_shapes(found, shapes)
        return [(t["dtype"], shape) for t, shape in zip(outputs, found, strict=True)]

    def open_signature(
        self, dtypes: Sequence[str], shapes: Sequence[tuple[Any, ...]]
    ) -> list[tuple[str, tuple[Any, ...]]] | None:
        """The outputs of a call whose padded axes may have lengths not known yet (the
        symbols of a tracer), or None if the lengths decide them: when every variant the
        known lengths allow has the same outputs but for the axes cut back, those are the
        outputs, with the call's own lengths on the cut-back axes. Each unknown length is
        compared with the largest variant's (a tracer's guard, not a constant)."""
        if self._padding is None or list(dtypes) != self._dtypes:
            return None
        # An unknown length where only one length fits becomes known (int() of a
        # tracer's symbol makes it a constant): a NEFF's length there is fixed.
        shapes = [
            tuple(n if axis in self._padding.axes[argument] else int(n) for axis, n in enumerate(s))
            for argument, s in enumerate(shapes)
        ]
        # The variants the known lengths fit (an unknown length is on a padded axis).
        known = [tuple(n if isinstance(n, int) else 0 for n in shape) for shape in shapes]
        candidates = [v for v, bucket in self._buckets if self._padding.fits(known, bucket)]
        listed = {(output, axis) for output, axis, _, _ in self._padding.outputs}
        kept = {self._kept_outputs(variant, listed) for variant in candidates}
        if len(kept) != 1:
            return None
        for argument, shape in enumerate(shapes):
            for axis, length in enumerate(shape):
                if not isinstance(length, int) and not length <= max(
                    self.variants[v][self._names[argument]][axis] for v in candidates
                ):
                    return None  # longer than any variant: the known-length path refuses it
        outputs = self._neff(self._signature_target(), candidates[0])["outputs"]
        found = self._padding.cut_shapes([tuple(t["shape"]) for t in outputs], shapes)
        return [(t["dtype"], shape) for t, shape in zip(outputs, found, strict=True)]

    def _kept_outputs(self, variant: str, listed: set[tuple[int, int]]) -> tuple[Any, ...]:
        """A variant's outputs (dtype, shape) on every target, cut-back axes left out."""
        return tuple(
            (t["dtype"], tuple(None if (o, a) in listed else n for a, n in enumerate(t["shape"])))
            for target in self.targets
            for o, t in enumerate(self._neff(target, variant)["outputs"])
        )

    def output_count(self) -> int:
        """How many outputs every NEFF of the kernel has; KernelError if they differ."""
        counts = {
            f"{target}/{variant}": len(neff["outputs"])
            for target, by_variant in self._info["neffs"].items()
            for variant, neff in by_variant.items()
        }
        if len(set(counts.values())) != 1:
            listed = ", ".join(f"{where}: {count}" for where, count in sorted(counts.items()))
            raise KernelError(
                f"{self.name}: its NEFFs have different numbers of outputs ({listed})"
            )
        return next(iter(counts.values()))

    def _listing(self) -> str:
        return "built variants: " + "; ".join(
            f"{v}: {_shapes(s)}" for v, s in self._shapes_by_variant
        )

    # --- modes -------------------------------------------------------------------------

    def _resolve_mode(self, mode: str | None, variant: str) -> tuple[str, str]:
        requested = mode or os.environ.get(MODE_ENV) or "auto"
        if requested not in MODES:
            raise KernelError(f"unknown mode {requested!r}; choose one of {', '.join(MODES)}")
        if requested != "auto":
            return requested, f"requested ({'argument' if mode else MODE_ENV})"
        problem = self._neuron_problem(variant)
        if problem is None:
            return "neuron", f"Neuron host {host_target()}"
        if self._reference is None:
            raise KernelError(f"{self.name}: cannot run: {problem}; and no reference was built")
        return "reference", problem

    def _neuron_problem(self, variant: str) -> str | None:
        """Why `auto` must not pick neuron mode here, or None."""
        target = host_target()
        if target is None:
            return "this host is not a Trainium instance"
        if target not in self._info["neffs"]:
            return f"no NEFF was built for {target} (built: {', '.join(self.targets)})"
        neff = self._info["neffs"][target][variant]
        if neff["placeholder"]:
            return "the NEFFs are placeholders from nkibuild's toolchain double"
        binding = runtime_binding()
        return _missing_part(self.package, target, neff) or (None if binding.name else binding.why)

    def _announce(self, mode: str, reason: str) -> None:
        if self._announced != mode:
            self._announced = mode
            where = "on the Neuron device" if mode == "neuron" else "on the CPU"
            logger.warning(
                "%s.%s runs in %s mode %s: %s", self.package, self.name, mode, where, reason
            )

    def _run_reference(self, arrays: Sequence[Any], _variant: str) -> Any:
        return self._reference_function(*arrays, **self._constant_values)

    @cached_property
    def _reference_function(self) -> Callable[..., Any]:
        if self._reference is None:
            raise KernelError(
                f"{self.name}: no reference implementation was built into this bundle"
            )
        return _shipped_function(self.package, self._reference)

    def _run_simulate(self, arrays: Sequence[Any], variant: str) -> Any:
        source = self._info.get("source")
        if self._info["frontend"] != "nki" or source is None:
            raise KernelError(
                f"{self.name}: simulate mode runs NKI kernels under nki.simulate; this is a "
                f"{self._info['frontend']} kernel (use mode='reference')"
            )
        try:
            nki = importlib.import_module("nki")
        except ImportError:
            raise KernelError(
                f"{self.name}: simulate mode needs the `nki` package (NKI's CPU simulator)"
            ) from None
        # As the NEFF runs it: the unit's launch grid (lnc) and the target it was built for.
        target = self._signature_target()
        lnc = int(self._neff(target, variant)["lnc"])
        kernel = _shipped_function(self.package, source)
        # From NKI 0.7 the variable alone says it; an unknown version is taken as older.
        if lnc > 1 and _release(str(getattr(nki, "__version__", ""))) < (0, 7):
            kernel = (kernel if hasattr(kernel, "__getitem__") else nki.jit(kernel))[lnc]
        with _platform_target(target, lnc):
            return nki.simulate(kernel)(*arrays, **self._constant_values)

    def _signature_target(self) -> str:
        """This host's target if the bundle has NEFFs for it, else the first one built:
        the NEFF simulate mode imitates, and whose outputs describe a call."""
        host = host_target()
        return host if host in self.targets else self.targets[0]

    def _run_neuron(self, arrays: Sequence[Any], variant: str) -> Any:
        model, inputs, neff = self._loaded(arrays, variant)
        outputs = model(inputs=inputs, outputs=None)
        results = tuple(outputs[name].numpy() for name in neff["output_names"])
        return results[0] if len(results) == 1 else results

    def _loaded(
        self, arrays: Sequence[Any], variant: str
    ) -> tuple[Any, dict[str, Any], dict[str, Any]]:
        """The model of this host's NEFF of `variant`, `arrays` as its input tensors, and
        the NEFF's record."""
        target = self._target(None)
        model = self.load(target, variant)
        neff = self._neff(target, variant)
        tensor = runtime_binding().api("Tensor")
        # The NEFF's own input names, in parameter order: input0..., parameter names, ...
        inputs = {
            name: tensor.from_numpy(as_neff_storage(array), name)
            for name, array in zip(neff["input_names"], arrays, strict=True)
        }
        return model, inputs, neff

    def _neff(self, target: str, variant: str) -> dict[str, Any]:
        if target not in self._info["neffs"]:
            raise KernelError(
                f"{self.name}: no NEFF was built for {target} (built: {', '.join(self.targets)})"
            )
        return self._info["neffs"][target][variant]

    def _target(self, target: str | None) -> str:
        found = target or host_target()
        if found is None:
            raise KernelError(
                f"{self.name}: cannot tell the Trainium target of this host; set {TARGET_ENV}"
            )
        return found


@cache
def torch_ops(package: str) -> Any:
    """The bundle's kernels as torch custom ops, `torch.ops.<package>.<kernel>`, registered
    once per process: traceable by torch.compile and torch.export (a fake implementation
    gives each output's dtype and shape from the NEFFs), run eagerly by the kernel."""
    import types

    try:
        torch = importlib.import_module("torch")
    except ImportError:
        raise KernelError(f"{package}.torch_ops needs torch: pip install torch") from None
    bundle = importlib.import_module(package)
    kernels = [getattr(bundle, name).kernel for name in _document(package)["kernels"]]
    return types.SimpleNamespace(**{k.name: _torch_op(torch, k) for k in kernels})


def _torch_op(torch: Any, kernel: Kernel) -> Any:
    names = kernel.signature
    for name, _ in names:  # checked by the manifest; the schema must not be fooled either
        if not (name.isascii() and name.isidentifier()):
            raise KernelError(f"{kernel.name}: input name {name!r} cannot be a torch schema name")
    outputs = kernel.output_count()
    arguments = ", ".join(f"Tensor {name}" for name, _ in names)
    returns = "Tensor" if outputs == 1 else f"({', '.join(['Tensor'] * outputs)})"

    def run(*tensors: Any) -> Any:
        result = kernel(*tensors)
        _check_signature(kernel, tensors, result)
        return _unaliased(result, tensors)

    def fake(*tensors: Any) -> Any:
        made = tuple(
            torch.empty(shape, dtype=getattr(torch, dtype), device=tensors[0].device)
            for dtype, shape in _expected_outputs(kernel, tensors)
        )
        return made[0] if len(made) == 1 else made

    qualified = f"{kernel.package}::{kernel.name}"
    try:
        op = torch.library.custom_op(
            qualified, run, mutates_args=(), schema=f"({arguments}) -> {returns}"
        )
    except RuntimeError as error:  # a namespace torch owns (aten, prims), or taken
        raise KernelError(f"cannot register the torch op {qualified}: {error}") from None
    op.register_fake(fake)
    return getattr(getattr(torch.ops, kernel.package), kernel.name)


def _expected_outputs(kernel: Kernel, tensors: Sequence[Any]) -> list[tuple[str, tuple[Any, ...]]]:
    """What a call returns; a traced call's lengths may be symbols (dynamic shapes). On
    padded axes they stay symbols where the outputs allow; elsewhere the NEFFs' static
    shapes make them constants (int() specializes a symbol)."""
    dtypes = [str(t.dtype).removeprefix("torch.") for t in tensors]
    shapes = [tuple(t.shape) for t in tensors]
    if any(not isinstance(length, int) for shape in shapes for length in shape):
        found = kernel.open_signature(dtypes, shapes)
        if found is not None:
            return found
    return kernel.output_signature(dtypes, tuple(tuple(int(n) for n in s) for s in shapes))


def _check_signature(kernel: Kernel, tensors: Sequence[Any], result: Any) -> None:
    """What ran must be what tracing assumed: a reference returning another dtype or
    shape than the NEFF would make a compiled graph wrong, so it is an error here."""
    results = result if isinstance(result, tuple) else (result,)
    found = [(str(t.dtype).removeprefix("torch."), tuple(t.shape)) for t in results]
    expected = _expected_outputs(kernel, tensors)
    if found != expected:
        raise KernelError(
            f"{kernel.name} returned {_signature_text(found)} in {kernel.last_mode} mode, but "
            f"its NEFFs return {_signature_text(expected)}; as a torch op its results must "
            "match the NEFFs' (fix the reference)"
        )


def _signature_text(outputs: Sequence[tuple[str, tuple[int, ...]]]) -> str:
    return ", ".join(f"{dtype}[{','.join(map(str, shape))}]" for dtype, shape in outputs)


def _unaliased(result: Any, inputs: Sequence[Any]) -> Any:
    """A custom op's outputs may not share memory with its inputs; a reference that
    returns an input (or a view of one) gets a copy."""
    if isinstance(result, tuple):
        return tuple(_unaliased(item, inputs) for item in result)
    storage = result.untyped_storage().data_ptr()
    shared = any(t.untyped_storage().data_ptr() == storage for t in inputs)
    return result.clone() if shared else result


@cache
def _load_model(package: str, kernel: str, target: str, variant: str) -> Any:
    info, binding, what = _document(package), runtime_binding(), f"{package}.{kernel}"
    neffs = info["kernels"][kernel]["neffs"]
    neff = neffs[target][variant]
    if binding.name is None:
        raise KernelError(
            f"{what}: no Neuron runtime binding can run NEFFs here: {binding.why}; "
            f"or run in reference mode ({MODE_ENV}=reference)"
        )
    if neff["placeholder"] and not binding.double:
        raise KernelError(
            f"{what}: the NEFF for {target}/{variant} is a placeholder written by "
            "nkibuild's toolchain double, not a real compiled kernel; rebuild the bundle with "
            "`nkibuild build --toolchain neuron` on a host with neuronx-cc"
        )
    _preflight(what, target, neff, binding, sorted(neffs))
    _check_sdk(what, info.get("neuron_sdk"), binding)
    if missing := _missing_part(package, target, neff):
        raise KernelError(f"{what}: {missing}")
    home = neff.get("package", package)
    with resources.as_file(resources.files(home).joinpath(neff["path"])) as path:
        return binding.api("Model").load_from_neff(str(path))


def _preflight(
    what: str, target: str, neff: dict[str, Any], binding: Binding, built: list[str]
) -> None:
    """What the runtime would refuse with an opaque error, said before the first load in one
    KernelError: the NEFF's target against the instance family, its lnc against the
    runtime's, its NEFF format against the runtime's version (where known)."""
    instance, version = _host(binding)
    family = TARGET_OF_FAMILY.get((instance or "").split(".")[0])
    problems = [
        _target_problem(target, instance, family, built),
        _lnc_problem(neff["lnc"], family),
        _version_problem(neff, version, binding),
    ]
    if any(problems):
        raise KernelError(f"{what}: " + "; ".join(filter(None, problems)))


def _host(binding: Binding) -> tuple[str | None, str | None]:
    """(instance type, runtime version). The double reports what a test configured; a real
    host's instance type is its DMI product name, and neither spike nor nrtpy reports the
    runtime's version."""
    if binding.double:
        with contextlib.suppress(ImportError):
            return importlib.import_module("_nkibuild_double_host").reported_host()
    return _instance_type(), None


def _target_problem(
    target: str, instance: str | None, family: str | None, built: list[str]
) -> str | None:
    legacy = (target, family) == ("trn1", "trn2")
    if family in (None, target) or (legacy and os.environ.get(LEGACY_NEFF_ENV) == "1"):
        return None
    ways = [
        f"run its {family} NEFF ({TARGET_ENV}={family} or unset)"
        if family in built
        else f"rebuild it for {family} (built: {', '.join(built)})",
        *([f"set {LEGACY_NEFF_ENV}=1 to run the trn1 NEFF on trn2"] if legacy else []),
    ]
    return (
        f"this is the {target} NEFF but this host is a {instance} ({family}) instance; "
        + " or ".join(ways)
    )


def _lnc_problem(lnc: int, family: str | None) -> str | None:
    configured = os.environ.get(LNC_ENV, "").strip()
    runtime = configured or str(DEFAULT_LNC.get(family or "", ""))
    if runtime in ("", str(lnc)):
        return None
    default = f"runs {family}'s default lnc={runtime} ({LNC_ENV} unset)"
    setting = f"is set to {LNC_ENV}={configured}" if configured else default
    return (
        f"this NEFF was compiled for lnc={lnc} but the Neuron runtime {setting}; "
        f"set {LNC_ENV}={lnc} or rebuild with lnc: {runtime} in nkibuild.yaml"
    )


def _version_problem(neff: dict[str, Any], version: str | None, binding: Binding) -> str | None:
    written = neff.get("neff_version")  # absent in bundles from before it was recorded
    needed = NEFF_MIN_RUNTIME.get(_release(str(written))[:1])
    if version is None or needed is None or _release(version) >= needed:
        return None
    oldest = ".".join(map(str, needed))
    return (
        f"this NEFF (format {written}, from neuronx-cc {neff['compiler_version']}) needs a "
        f"Neuron runtime >= {oldest}, but {binding.name} runs on runtime {version}; upgrade "
        "the Neuron runtime or rebuild with a compiler that writes an older NEFF format"
    )


def as_neff_storage(array: Any) -> Any:
    """`array` as its NEFF tensor holds it: in this machine's byte order (a big-endian
    array has the same dtype name, and its bytes would reach the device as they are),
    and viewed as the dtype the NEFF has. neuronx-cc stores bool as uint8 and fp8 as
    int8, and spike checks dtypes strictly: it lets only ml_dtypes' float8_e4m3 and
    float8_e5m2 through for int8, so bool and float8_e4m3fn arrays are reinterpreted."""
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    stored = {"bool": "uint8", "float8_e4m3fn": "int8"}.get(array.dtype.name)
    return array if stored is None else array.view(stored)


def _missing_part(package: str, target: str, neff: dict[str, Any]) -> str | None:
    """What to install if the NEFF is in a package of its own that is not installed (a split
    bundle keeps each target's NEFFs in a package installed by an extra)."""
    home = neff.get("package", package)
    if home == package or importlib.util.find_spec(home) is not None:
        return None
    return (
        f"the {target} NEFFs are in a separate package that is not installed: "
        f"pip install '{_document(package)['package']}[{target}]'"
    )


def _check_sdk(what: str, required: str | None, binding: Binding) -> None:
    """Refuse to load NEFFs into a runtime older than the bundle says it needs.

    A newer compiler's NEFF may be refused by an older runtime with an obscure error;
    this says which versions disagree instead. Neither binding reports the SDK's
    version, so the host's Neuron SDK version is what NKIBUILD_NEURON_SDK_VERSION says;
    unset, nothing is checked (and a debug log says so).
    """
    if not required:
        return
    installed = os.environ.get(SDK_VERSION_ENV)
    if not installed or binding.double:
        logger.debug(
            "%s: neuron-sdk %s not checked: set %s to the host's Neuron SDK version",
            what,
            required,
            SDK_VERSION_ENV,
        )
        return
    if not _version_ok(installed, required):
        raise KernelError(
            f"{what}: built for Neuron SDK {required}, but this host has {installed}; "
            f"install a matching SDK or rebuild the bundle (override: {SDK_VERSION_ENV})"
        )


@contextlib.contextmanager
def _platform_target(target: str, lnc: int) -> Iterator[None]:
    """For one simulated call: NEURON_PLATFORM_TARGET_OVERRIDE set to `target` unless the
    user set it (NKI reads it to lower, and simulate, for a target), and the NEFF's lnc
    as NEURON_LOGICAL_NC_CONFIG (NKI 0.7 takes the launch grid from it)."""
    wanted = {LNC_ENV: str(lnc), PLATFORM_TARGET_ENV: os.environ.get(PLATFORM_TARGET_ENV) or target}
    saved = {name: os.environ.get(name) for name in wanted}
    os.environ.update(wanted)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


def _version_ok(installed: str, required: str) -> bool:
    """`required` is a comma-separated list of `>=X`, `<X`, `==X`, ... on release numbers."""
    operators: dict[str, Callable[[tuple[int, ...], tuple[int, ...]], bool]] = {
        ">=": lambda a, b: a >= b,
        "<=": lambda a, b: a <= b,
        "==": lambda a, b: a[: len(b)] == b,
        "!=": lambda a, b: a[: len(b)] != b,
        ">": lambda a, b: a > b,
        "<": lambda a, b: a < b,
    }
    have = _release(installed)
    for clause in filter(None, (c.strip() for c in required.split(","))):
        symbol = next(s for s in operators if clause.startswith(s))
        if not operators[symbol](have, _release(clause[len(symbol) :])):
            return False
    return True


def _release(version: str) -> tuple[int, ...]:
    numbers = []
    for part in version.strip().split("+")[0].split("."):
        digits = "".join(c for c in part if c.isdigit())
        if not digits:
            break
        numbers.append(int(digits))
    return tuple(numbers)


def _shipped_function(package: str, where: dict[str, str]) -> Callable[..., Any]:
    """A function of a module shipped in the bundle (a reference or a kernel's own source)."""
    module = importlib.import_module(f"{package}.{where['package']}.{where['module']}")
    return getattr(module, where["function"])


def _constant(value: Any) -> Any:
    # JSON has no tuples; constants were tuples in the manifest model.
    return tuple(_constant(v) for v in value) if isinstance(value, list) else value


def _is_torch(value: Any) -> bool:
    return type(value).__module__.split(".")[0] == "torch" and hasattr(value, "detach")


def _as_numpy(value: Any) -> Any:
    import numpy as np

    if not _is_torch(value):
        return np.asarray(value)
    torch = sys.modules["torch"]
    tensor = value.detach().cpu()
    if tensor.dtype == torch.bfloat16:  # NumPy knows bfloat16 only through ml_dtypes
        import ml_dtypes

        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def _as_torch(result: Any, device: Any) -> Any:
    if isinstance(result, tuple):
        return tuple(_as_torch(item, device) for item in result)
    import numpy as np

    torch = sys.modules["torch"]
    array = np.ascontiguousarray(result)
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16).to(device)
    return torch.from_numpy(array).to(device)


def _shapes(shapes: Any) -> str:
    return "(" + ", ".join("[" + ",".join(map(str, s)) + "]" for s in shapes) + ")"
