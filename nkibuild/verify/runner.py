"""Run a bundle's kernels on sample inputs, in the interpreter that has the bundle installed.

Executed as a script (`python runner.py REQUEST.json`), so it needs only NumPy and the
bundle, never nkibuild: what it measures is the bundle as users get it. Prints one
JSON document: per kernel and variant, the reference's outputs' signature, the error
of the requested mode against the reference, and timings.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import sys
import time
from typing import Any

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


def as_tuple(result: Any) -> tuple[np.ndarray, ...]:
    return (
        tuple(np.asarray(r) for r in result) if isinstance(result, tuple) else (np.asarray(result),)
    )


def signature(arrays: tuple[np.ndarray, ...]) -> list[dict[str, Any]]:
    return [{"dtype": a.dtype.name, "shape": list(a.shape)} for a in arrays]


def errors(result: tuple[np.ndarray, ...], expected: tuple[np.ndarray, ...]) -> dict[str, float]:
    """Largest absolute and relative differences over all outputs (in float64)."""
    worst_abs, worst_rel = 0.0, 0.0
    for got, want in zip(result, expected, strict=True):
        got64, want64 = got.astype(np.float64), want.astype(np.float64)
        difference = np.abs(got64 - want64)
        worst_abs = max(worst_abs, float(difference.max(initial=0.0)))
        relative = difference / np.maximum(np.abs(want64), np.finfo(np.float64).tiny)
        worst_rel = max(worst_rel, float(relative.max(initial=0.0)))
    return {"max_abs_error": worst_abs, "max_rel_error": worst_rel}


def _tolerance(expected: np.ndarray, given: dict[str, float | None]) -> dict[str, float]:
    """The manifest's tolerance, else a default by dtype (as documented in the schema)."""
    low_precision = expected.dtype.name in ("bfloat16", "float16")
    rtol = given.get("rtol")
    atol = given.get("atol")
    return {
        "rtol": rtol if rtol is not None else (1e-2 if low_precision else 1e-5),
        "atol": atol if atol is not None else (1e-2 if low_precision else 1e-6),
    }


def timed(call: Any) -> tuple[Any, float]:
    started = time.perf_counter()
    result = call()
    best = time.perf_counter() - started
    for _ in range(TIMING_CALLS - 1):
        started = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - started)
    return result, best


def check_variant(
    kernel: Any, name: str, variant: str, mode: str, tolerance: dict[str, float | None]
) -> dict[str, Any]:
    shapes = kernel.variants[variant]
    specs = [{"dtype": dtype, "shape": shapes[arg]} for arg, dtype in kernel.signature]
    inputs = sample_inputs(name, variant, specs)
    expected, reference_s = timed(lambda: as_tuple(kernel(*inputs, mode="reference")))
    record: dict[str, Any] = {
        "kernel": name,
        "variant": variant,
        "reference_outputs": signature(expected),
        "reference_seconds": reference_s,
    }
    if mode == "reference" or (mode == "simulate" and kernel.frontend != "nki"):
        return record  # simulate applies to NKI kernels only: the others are checked as such
    result, seconds = timed(lambda: as_tuple(kernel(*inputs, mode=mode)))
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
    if mode == "neuron" and not getattr(sys.modules.get("spike"), "IS_TOOLCHAIN_DOUBLE", False):
        benchmark = kernel.benchmark(*inputs)
        record["benchmark_mean_ms"] = float(benchmark.mean_ms)
    return record


def main(request_path: str) -> None:
    with open(request_path, encoding="utf-8") as handle:
        request = json.load(handle)
    package = importlib.import_module(request["package"])
    tolerances = request["tolerances"]
    results = []
    for name in package.KERNELS:
        kernel = getattr(package, name)
        for variant in kernel.variants:
            try:
                results.append(
                    check_variant(kernel, name, variant, request["mode"], tolerances[name])
                )
            except Exception as error:  # reported per variant; the others still run
                results.append(
                    {
                        "kernel": name,
                        "variant": variant,
                        "error": f"{type(error).__name__}: {error}",
                    }
                )
    spike = sys.modules.get("spike")
    print(
        json.dumps(
            {"results": results, "spike_double": bool(getattr(spike, "IS_TOOLCHAIN_DOUBLE", False))}
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
