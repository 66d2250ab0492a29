"""Run a bundle's kernels on sample inputs, in the interpreter that has the bundle installed.

Executed as a script (`python runner.py REQUEST.json`), so it needs only NumPy and the
bundle, never nkibuild: what it measures is the bundle as users get it. Per kernel
and variant: the reference's outputs' signature, the error of the requested mode
against the reference, and timings.

A request that names a project's `kernels` (not a `package`) instead runs them from their
own source on the CPU (`sources.py`), on the same sample inputs, in the frontends'
interpreter (which has nkibuild: kernel files are imported as its workers import them).

Both write their answer to the request's `output` file, never to stdout (whatever
user code prints cannot garble it): one JSON object per line, flushed as it is
written: `{"running": WHAT}` before each reference or kernel call (so a run stopped
for its timeout says what hung), a record per variant, and `{"done": true, ...}` last.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import sys
import time
import timeit
from collections.abc import Callable, Iterator
from typing import IO, Any

import numpy as np

TIMING_CALLS = 3


def sample_inputs(kernel: str, variant: str, specs: list[dict[str, Any]]) -> list[np.ndarray]:
    """Deterministic inputs: the same kernel and variant get the same arrays anywhere."""
    seed = int.from_bytes(hashlib.sha256(f"{kernel}/{variant}".encode()).digest()[:8], "little")
    rng = np.random.default_rng(seed)
    return [_sample(rng, spec["dtype"], tuple(spec["shape"])) for spec in specs]


def _sample(rng: np.random.Generator, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.startswith(("int", "uint")):
        return rng.integers(0, 8, shape).astype(dtype)
    values = rng.uniform(-1.0, 1.0, shape).astype(np.float32)
    if dtype == "bfloat16":
        import ml_dtypes

        return values.astype(ml_dtypes.bfloat16)
    return values.astype(dtype)


def signature(arrays: tuple[np.ndarray, ...]) -> list[dict[str, Any]]:
    return [{"dtype": a.dtype.name, "shape": list(a.shape)} for a in arrays]


def errors(result: tuple[np.ndarray, ...], expected: tuple[np.ndarray, ...]) -> dict[str, float]:
    pairs = [output_errors(got, want) for got, want in zip(result, expected, strict=True)]
    return {
        "max_abs_error": max((abs_error for abs_error, _ in pairs), default=0.0),
        "max_rel_error": max((rel_error for _, rel_error in pairs), default=0.0),
    }


def _tolerance(expected: np.ndarray, given: dict[str, float | None]) -> dict[str, float]:
    """The manifest's tolerance, else a default by dtype (as documented in the schema)."""
    low_precision = expected.dtype.name in ("bfloat16", "float16")
    defaults = {"rtol": 1e-2, "atol": 1e-2} if low_precision else {"rtol": 1e-5, "atol": 1e-6}
    return {**defaults, **{key: value for key, value in given.items() if value is not None}}


def timed(call: Any) -> tuple[Any, float]:
    """The first call's result, and the best time of TIMING_CALLS calls."""
    started = time.perf_counter()
    result = call()
    first = time.perf_counter() - started
    return result, min(first, *timeit.repeat(call, repeat=TIMING_CALLS - 1, number=1))


Announce = Callable[[str], None]  # says what runs next, before it runs


def emit(out: IO[str], record: dict[str, Any]) -> None:
    out.write(json.dumps(record) + "\n")
    out.flush()  # on disk before the next call, which may hang or end the process


def check_variant(
    kernel: Any,
    name: str,
    variant: str,
    mode: str,
    tolerance: dict[str, float | None],
    announce: Announce,
) -> dict[str, Any]:
    shapes = kernel.variants[variant]
    specs = [{"dtype": dtype, "shape": shapes[arg]} for arg, dtype in kernel.signature]
    inputs = sample_inputs(name, variant, specs)
    announce(f"the reference of {name}/{variant}")
    expected, reference_s = timed(lambda: as_outputs(kernel(*inputs, mode="reference")))
    record: dict[str, Any] = {
        "kernel": name,
        "variant": variant,
        "reference_outputs": signature(expected),
        "reference_seconds": reference_s,
    }
    if mode == "reference" or (mode == "simulate" and kernel.frontend != "nki"):
        return record  # simulate applies to NKI kernels only: the others are checked as such
    announce(f"{name}/{variant} in {mode} mode")
    result, seconds = timed(lambda: as_outputs(kernel(*inputs, mode=mode)))
    resolved = kernel.kernel.last_mode
    if resolved == "reference":
        return {**record, "resolved_mode": resolved}  # nothing but the reference ran
    record.update(outputs=signature(result), seconds=seconds, **errors(result, expected))
    record["resolved_mode"] = resolved
    if record["outputs"] == record["reference_outputs"]:
        record["within_tolerance"] = all(
            np.allclose(
                got.astype(np.float64), want.astype(np.float64), **_tolerance(want, tolerance)
            )
            for got, want in zip(result, expected, strict=True)
        )
    if mode == "neuron" and not spike_core_is_double():
        benchmark = kernel.benchmark(*inputs)
        record["benchmark_mean_ms"] = float(benchmark.mean_ms)
    return record


def spike_core_is_double() -> bool:
    """Whether the spike that ran is on nkibuild's CPU core (the label is on the native
    core: spike's real Python layer on the double's core counts too)."""
    return bool(getattr(sys.modules.get("spike._spike"), "IS_TOOLCHAIN_DOUBLE", False))


def main(request_path: str) -> None:
    with open(request_path, encoding="utf-8") as handle:
        request = json.load(handle)
    with open(request["output"], "w", encoding="utf-8") as out:
        checked = source_records if "kernels" in request else bundle_records
        for record in checked(request, lambda what: emit(out, {"running": what})):
            emit(out, record)
        emit(out, {"done": True, "spike_double": spike_core_is_double()})


def bundle_records(request: dict[str, Any], announce: Announce) -> Iterator[dict[str, Any]]:
    package = importlib.import_module(request["package"])
    mode, tolerances = request["mode"], request["tolerances"]
    for name in (name for name in package.KERNELS if name in tolerances):  # those asked
        kernel = getattr(package, name)
        for variant in kernel.variants:
            try:
                record = check_variant(kernel, name, variant, mode, tolerances[name], announce)
            except Exception as error:  # reported per variant; the others still run
                record = {"kernel": name, "variant": variant, "error": _failure(error)}
            yield record


# What user code may raise and still fail only its own kernel (sys.exit included).
USER_ERRORS = (Exception, SystemExit)


def nki_simulate() -> tuple[Any, str | None]:
    """`nki.simulate`, or None and why it is not available in this interpreter."""
    try:
        nki = importlib.import_module("nki")
    except USER_ERRORS as error:
        return None, f"the `nki` package is not importable here ({type(error).__name__})"
    simulate = getattr(nki, "simulate", None)
    if simulate is None:
        return None, "this `nki` package has no nki.simulate"
    return simulate, None


def why_not_runnable(kernel: dict[str, Any]) -> str | None:
    """Why a kernel's source cannot be compared with its reference on the CPU, if so."""
    frontend = kernel["frontend"]
    if frontend == "hlo":
        return "not runnable on the CPU: an hlo kernel is a prebuilt module, not source code"
    if frontend == "nki":
        _, missing = nki_simulate()
        if missing:
            return f"not runnable on the CPU: an nki kernel needs nki.simulate, and {missing}"
    if kernel["reference"] is None:
        if frontend == "nkipy":
            return "no reference: an nkipy kernel without one is its own reference"
        return "no reference to compare with (the manifest sets no `reference:`)"
    return None


def kernel_call(frontend: str, function: Any, constants: dict[str, Any]) -> Any:
    """A callable running the kernel's own source on NumPy inputs, on the CPU."""
    if frontend == "jax":
        import jax

        # As the tracer lowers it: constants are static arguments.
        jitted = jax.jit(function, static_argnames=tuple(constants))
        return lambda arrays: jitted(*arrays, **constants)
    if frontend == "nki":
        simulate, _ = nki_simulate()
        return lambda arrays: simulate(function)(*arrays, **constants)
    return lambda arrays: function(*arrays, **constants)  # nkipy kernels are NumPy code


def as_outputs(result: Any) -> tuple[np.ndarray, ...]:
    """A kernel's result as a tuple of NumPy arrays (JAX may return a list)."""
    items = result if isinstance(result, (tuple, list)) else (result,)
    return tuple(np.asarray(item) for item in items)


def output_errors(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    """Largest absolute and relative difference of one output; a NaN on one side only
    counts as infinitely far."""
    got64, want64 = got.astype(np.float64), want.astype(np.float64)
    both_nan = np.isnan(got64) & np.isnan(want64)
    difference = np.where(both_nan, 0.0, np.abs(got64 - want64))
    difference = np.nan_to_num(difference, nan=np.inf, posinf=np.inf)
    relative = difference / np.maximum(np.abs(np.nan_to_num(want64)), np.finfo(np.float64).tiny)
    return float(difference.max(initial=0.0)), float(relative.max(initial=0.0))


def compare_outputs(
    result: tuple[np.ndarray, ...],
    expected: tuple[np.ndarray, ...],
    tolerance: dict[str, float | None],
) -> dict[str, Any]:
    """Per output: errors, the tolerance applied and whether it holds."""
    record: dict[str, Any] = {
        "kernel_outputs": signature(result),
        "reference_outputs": signature(expected),
    }
    if record["kernel_outputs"] != record["reference_outputs"]:
        return record  # nothing to compare element by element
    outputs = []
    for got, want in zip(result, expected, strict=True):
        limits = _tolerance(want, tolerance)
        abs_error, rel_error = output_errors(got, want)
        close = np.allclose(
            got.astype(np.float64), want.astype(np.float64), equal_nan=True, **limits
        )
        figures = {"max_abs_error": abs_error, "max_rel_error": rel_error}
        outputs.append({**figures, "within": bool(close), **limits})
    record.update(errors(result, expected), outputs=outputs)
    record["within_tolerance"] = all(o["within"] for o in outputs)
    return record


def _failure(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def check_source_variant(
    kernel: dict[str, Any],
    variant: dict[str, Any],
    call: Any,
    reference: Any,
    constants: dict[str, Any],
    announce: Announce,
) -> dict[str, Any]:
    name, specs = kernel["name"], variant["inputs"]
    record: dict[str, Any] = {"kernel": name, "variant": variant["name"]}
    # Fresh arrays for each call: a function that writes into its inputs must not
    # change what the other one sees.
    announce(f"the reference of {name}/{variant['name']} ({kernel['reference']['path']})")
    try:
        expected = as_outputs(reference(*sample_inputs(name, variant["name"], specs), **constants))
    except USER_ERRORS as error:
        return {**record, "error": f"the reference raised {_failure(error)}"}
    announce(f"the {kernel['frontend']} kernel {name}/{variant['name']} on the CPU")
    try:
        started = time.perf_counter()
        result = as_outputs(call(sample_inputs(name, variant["name"], specs)))
        record["seconds"] = time.perf_counter() - started
    except USER_ERRORS as error:
        return {**record, "error": f"the kernel raised {_failure(error)}"}
    return {**record, **compare_outputs(result, expected, kernel["tolerance"])}


def check_kernel_source(
    root: str, kernel: dict[str, Any], announce: Announce
) -> list[dict[str, Any]]:
    """One record per variant: compared, skipped (with the reason) or an error."""
    names = [variant["name"] for variant in kernel["variants"]]
    reason = why_not_runnable(kernel)
    if reason is not None:
        return [{"kernel": kernel["name"], "variant": v, "skipped": reason} for v in names]
    # Kernel files are imported as the frontend workers import them (the frontends'
    # interpreter runs this, and has nkibuild): each with its own directory and the
    # project root on sys.path, and no module of the project kept after it, so a kernel
    # in another folder importing its own `utils` gets its own.
    from nkibuild.toolchain.tracers import freeze, load_function, project_imports

    constants = {key: freeze(value) for key, value in kernel["constants"]}
    loaded: dict[str, Any] = {}
    for role in ("source", "reference"):
        path, function = kernel[role]["path"], kernel[role]["function"]
        announce(f"loading {path}")
        try:
            with project_imports(root, path):
                loaded[role] = load_function(root, path, function)
        except USER_ERRORS as error:
            what = "the kernel" if role == "source" else "the reference"
            problem = f"cannot load {what} {path}: {_failure(error)}"
            return [{"kernel": kernel["name"], "variant": v, "error": problem} for v in names]
    call = kernel_call(kernel["frontend"], loaded["source"], constants)
    return [
        check_source_variant(kernel, variant, call, loaded["reference"], constants, announce)
        for variant in kernel["variants"]
    ]


def source_records(request: dict[str, Any], announce: Announce) -> Iterator[dict[str, Any]]:
    for kernel in request["kernels"]:
        yield from check_kernel_source(request["root"], kernel, announce)


if __name__ == "__main__":
    main(sys.argv[1])
