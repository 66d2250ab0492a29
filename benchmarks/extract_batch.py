"""20 JAX kernels extracted by one batched worker vs one fresh Python process per kernel.

The fresh-process side is the seed's approach (a script run per kernel); it uses the
same worker code with a new process for every kernel, so the ratio isolates what
batching saves: interpreter start-up and importing jax once instead of 20 times.
The last line is a JSON object; `ratio` = fresh / batched (target >= 5).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from nkibuild.toolchain.worker_pool import WorkerKey, WorkerPool

KERNELS = 20
KEY = WorkerKey("project", sys.executable, "jax", None)


def write_kernels(root: Path) -> list[str]:
    names = [f"kernel_{index:02d}" for index in range(KERNELS)]
    body = ["import jax.numpy as jnp", ""]
    for index, name in enumerate(names):
        body += [f"def {name}(x, y):", f"    return jnp.tanh(x @ y) * {index + 1}", ""]
    (root / "kernels.py").write_text("\n".join(body))
    return names


def job(root: Path, name: str) -> dict:
    return {
        "frontend": "jax",
        "root": str(root),
        "path": "kernels.py",
        "function": name,
        "inputs": [
            {"name": "x", "shape": [128, 256], "dtype": "float32"},
            {"name": "y", "shape": [256, 128], "dtype": "float32"},
        ],
        "constants": [],
        "output": str(root / f"{name}.pb"),
    }


def batched(root: Path, names: list[str]) -> tuple[float, int]:
    started = time.perf_counter()
    pool = WorkerPool()
    try:
        results = [pool.run(KEY, job(root, name), timeout=600, unit=name) for name in names]
    finally:
        pool.close()
    assert all(result["ok"] for result in results)
    return time.perf_counter() - started, len({result["pid"] for result in results})


def fresh_process_each(root: Path, names: list[str]) -> float:
    started = time.perf_counter()
    for name in names:
        pool = WorkerPool()
        try:
            assert pool.run(KEY, job(root, name), timeout=600, unit=name)["ok"]
        finally:
            pool.close()
    return time.perf_counter() - started


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="nkibuild-extract-bench-") as scratch:
        root = Path(scratch)
        names = write_kernels(root)
        batched(root, names[:1])  # warm the OS file cache for both sides
        fresh = fresh_process_each(root, names)
        batch, processes = batched(root, names)
    print(f"{KERNELS} kernels, one fresh process each: {fresh:.2f} s")
    print(f"{KERNELS} kernels, batched worker ({processes} process): {batch:.2f} s")
    print(
        json.dumps(
            {
                "benchmark": "extract_batch",
                "ratio": round(fresh / batch, 2),
                "baseline": "one fresh Python process per kernel (the seed's approach)",
                "target": ">= 5.0",
                "kernels": KERNELS,
                "batched_s": round(batch, 3),
                "fresh_processes_s": round(fresh, 3),
                "worker_processes": processes,
            }
        )
    )


if __name__ == "__main__":
    main()
