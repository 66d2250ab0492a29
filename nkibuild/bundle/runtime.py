"""Runtime shared by every kernel bundle; copied verbatim into each bundle as `_runtime.py`.

It is vendored rather than depended on so that an installed bundle needs only
NumPy: not nkibuild, not the compiler, not jax or torch. It must stay
importable on Python >= 3.10 with the standard library and NumPy alone, and it
imports spike only when a kernel first runs in `neuron` mode.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import os
from collections.abc import Sequence
from functools import cache
from typing import Any

MODES = ("auto", "neuron", "reference")
MODE_ENV = "NKIBUILD_MODE"
TARGET_ENV = "NKIBUILD_TARGET"
PRODUCT_NAME_FILE = "/sys/devices/virtual/dmi/id/product_name"
SPIKE_HELP = (
    "the Neuron runtime binding 'spike' is not importable. It is not the PyPI project named "
    "'spike' (an unrelated simulator): install it from the aws-neuron/nkipy repository on a "
    "Neuron host (it needs libnrt), or run in reference mode (NKIBUILD_MODE=reference)."
)

logger = logging.getLogger("nkibuild.bundle")


class KernelError(RuntimeError):
    """A kernel could not run as asked (bad arguments, no matching variant, no runtime)."""


@cache
def build_info(package: str) -> dict[str, Any]:
    """The bundle's build metadata: units, compiler version, flags, NEFF sha256s."""
    from importlib import resources

    return json.loads(resources.files(package).joinpath("_build.json").read_text("utf-8"))


def host_target() -> str | None:
    """Trainium family of this host (trn1/trn2/trn3), from NKIBUILD_TARGET or the instance type."""
    override = os.environ.get(TARGET_ENV)
    if override:
        return override
    try:
        with open(PRODUCT_NAME_FILE, encoding="utf-8") as handle:
            family = handle.read().strip().split(".")[0]
    except OSError:
        return None
    return family if family.startswith("trn") else None


class Kernel:
    """A callable kernel of a bundle: checks arguments, picks the variant, dispatches."""

    def __init__(self, package: str, name: str) -> None:
        self.package = package
        self.name = name
        self._info = build_info(package)["kernels"][name]
        self._announced: str | None = None

    @property
    def signature(self) -> tuple[tuple[str, str], ...]:
        """(argument name, dtype) in call order; shapes depend on the variant."""
        return tuple((arg["name"], arg["dtype"]) for arg in self._info["inputs"])

    @property
    def variants(self) -> dict[str, dict[str, tuple[int, ...]]]:
        return {
            variant: {t["name"]: tuple(t["shape"]) for t in spec["inputs"]}
            for variant, spec in self._info["variants"].items()
        }

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(self._info["neffs"])

    def __call__(self, *args: Any, mode: str | None = None, **kwargs: Any) -> Any:
        arrays = self._bind(args, kwargs)
        variant = self._select_variant(arrays)
        chosen, reason = self._resolve_mode(mode, variant)
        self._announce(chosen, reason)
        if chosen == "neuron":
            return self._run_neuron(arrays, variant)
        return self._run_reference(arrays)

    def _bind(self, args: Sequence[Any], kwargs: dict[str, Any]) -> list:
        import numpy as np

        names = [name for name, _ in self.signature]
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
        return [np.asarray(bound[name]) for name in names]

    def _select_variant(self, arrays: Sequence[Any]) -> str:
        dtypes = [dtype for _, dtype in self.signature]
        found = [str(a.dtype) for a in arrays]
        if found != dtypes:
            raise KernelError(
                f"{self.name}() expects dtypes ({', '.join(dtypes)}), got ({', '.join(found)})"
            )
        shapes = tuple(tuple(a.shape) for a in arrays)
        for variant, spec in self.variants.items():
            if tuple(spec.values()) == shapes:
                return variant
        listing = "; ".join(f"{v}: {_shapes(s.values())}" for v, s in self.variants.items())
        raise KernelError(
            f"{self.name}() has no variant for shapes {_shapes(shapes)}; built variants: {listing}"
        )

    def _resolve_mode(self, mode: str | None, variant: str) -> tuple[str, str]:
        requested = mode or os.environ.get(MODE_ENV) or "auto"
        if requested not in MODES:
            raise KernelError(f"unknown mode {requested!r}; choose one of {', '.join(MODES)}")
        if requested != "auto":
            return requested, f"requested ({'argument' if mode else MODE_ENV})"
        problem = self._neuron_problem(variant)
        if problem is None:
            return "neuron", f"Neuron host {host_target()}"
        if self._info["reference"] is None:
            raise KernelError(f"{self.name}: cannot run: {problem}; and no reference was built")
        return "reference", problem

    def _neuron_problem(self, variant: str) -> str | None:
        target = host_target()
        if target is None:
            return "this host is not a Trainium instance"
        if target not in self._info["neffs"]:
            return f"no NEFF was built for {target} (built: {', '.join(self.targets)})"
        if self._info["neffs"][target][variant]["placeholder"]:
            return "the NEFFs are placeholders from nkibuild's toolchain double"
        if importlib.util.find_spec("spike") is None:
            return SPIKE_HELP
        return None

    def _announce(self, mode: str, reason: str) -> None:
        if self._announced != mode:
            self._announced = mode
            where = "on the CPU" if mode == "reference" else "on the Neuron device"
            logger.warning(
                "%s.%s runs in %s mode %s: %s", self.package, self.name, mode, where, reason
            )

    def _run_reference(self, arrays: Sequence[Any]) -> Any:
        reference = self._info["reference"]
        if reference is None:
            raise KernelError(
                f"{self.name}: no reference implementation was built into this bundle"
            )
        module = importlib.import_module(f"{self.package}.reference.{reference['module']}")
        constants = {name: value for name, value in self._info["constants"]}
        return getattr(module, reference["function"])(*arrays, **constants)

    def load(self, target: str | None = None, variant: str | None = None) -> Any:
        """The spike.SpikeModel for a (target, variant); loaded once and cached."""
        target = target or host_target()
        if target is None:
            raise KernelError(
                f"{self.name}: cannot tell the Trainium target of this host; set {TARGET_ENV}"
            )
        variant = variant or next(iter(self._info["variants"]))
        return _load_model(self.package, self.name, target, variant)

    def _run_neuron(self, arrays: Sequence[Any], variant: str) -> Any:
        target = host_target()
        if target is None or target not in self._info["neffs"]:
            raise KernelError(
                f"{self.name}: neuron mode needs a NEFF for this host's target ({target})"
            )
        neff = self._info["neffs"][target][variant]
        model = self.load(target, variant)
        import spike

        inputs = {
            name: spike.SpikeTensor.from_numpy(array, name)
            for name, array in zip(neff["input_names"], arrays, strict=True)
        }
        outputs = model(inputs=inputs, outputs=None)
        results = tuple(outputs[name].numpy() for name in neff["output_names"])
        return results[0] if len(results) == 1 else results


@cache
def _load_model(package: str, kernel: str, target: str, variant: str) -> Any:
    neff = build_info(package)["kernels"][kernel]["neffs"][target][variant]
    if neff["placeholder"]:
        raise KernelError(
            f"{package}.{kernel}: the NEFF for {target}/{variant} is a placeholder written by "
            "nkibuild's toolchain double, not a real compiled kernel; rebuild the bundle with "
            "`nkibuild build --toolchain neuron` on a host with neuronx-cc"
        )
    _check_lnc(package, kernel, neff["lnc"])
    try:
        import spike
    except ImportError as error:
        raise KernelError(f"{package}.{kernel}: {SPIKE_HELP} ({error})") from None
    from importlib import resources

    with resources.as_file(resources.files(package).joinpath(neff["path"])) as path:
        return spike.SpikeModel.load_from_neff(str(path))


def _check_lnc(package: str, kernel: str, lnc: int) -> None:
    configured = os.environ.get("NEURON_LOGICAL_NC_CONFIG")
    if configured is not None and configured.strip() != str(lnc):
        raise KernelError(
            f"{package}.{kernel}: this NEFF was compiled for lnc={lnc} but the Neuron runtime is "
            f"set to NEURON_LOGICAL_NC_CONFIG={configured}; set it to {lnc} or rebuild with lnc: "
            f"{configured} in nkibuild.yaml"
        )


def _shapes(shapes: Any) -> str:
    return "(" + ", ".join("[" + ",".join(map(str, s)) + "]" for s in shapes) + ")"
