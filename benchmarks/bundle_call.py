"""Per-call overhead of a bundle's loader in reference mode vs calling the reference directly.

The same softmax bundle as benchmarks/bundle_import.py; in one process, `softmax(x,
mode="reference")` (argument binding, dtype and shape checks, variant selection,
dispatch) is timed against the reference function it ends up calling, on the
kernel's declared input (64 x 1024 float32), best of REPEATS rounds of CALLS calls.
The last line is a JSON object; `ratio` = loader / direct (target <= 1.1), with the
absolute overhead per call in microseconds.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile
import timeit
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bundle_import import build_bundle  # a sibling benchmark script

CALLS = 2000
REPEATS = 7


def main() -> None:
    os.environ["NKIBUILD_MODE"] = ""
    with tempfile.TemporaryDirectory(prefix="nkibuild-bench-") as scratch:
        bundle = build_bundle(Path(scratch) / "project")
        sys.path.insert(0, str(bundle))
        package = importlib.import_module("acme_bench")
        kernel = package.softmax
        reference = importlib.import_module("acme_bench.reference.kernels_reference").softmax
        x = np.random.default_rng(0).standard_normal((64, 1024)).astype(np.float32)
        np.testing.assert_array_equal(kernel(x, mode="reference"), reference(x))
        loader = min(
            timeit.repeat(lambda: kernel(x, mode="reference"), number=CALLS, repeat=REPEATS)
        )
        direct = min(timeit.repeat(lambda: reference(x), number=CALLS, repeat=REPEATS))
    loader_us, direct_us = loader / CALLS * 1e6, direct / CALLS * 1e6
    print(f"softmax(x, mode='reference') through the bundle: {loader_us:.1f} us per call")
    print(f"the reference function called directly:         {direct_us:.1f} us per call")
    result = {
        "benchmark": "bundle_call",
        "ratio": round(loader / direct, 3),
        "baseline": "the bundle's reference function called directly, same input",
        "target": "<= 1.1",
        "overhead_us_per_call": round(loader_us - direct_us, 2),
        "direct_us_per_call": round(direct_us, 1),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
