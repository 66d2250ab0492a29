"""20 JAX kernels extracted by nkibuild's frontend worker vs one plain Python script.

The baseline is what a competent user writes to do the same work by hand: one Python
process that imports jax once, lowers all 20 kernels with `jax.jit(f).lower(...)` and
writes each serialized HloModuleProto. nkibuild's side is a worker pool serving the same
20 jobs: its own process (started the same way), the same jax import, plus what
nkibuild does beyond the script (a clean environment, the project's module isolation,
portable source paths, the JSON protocol). Both are timed from process spawn to the
last file written, interleaved, median of RUNS. The last line is a JSON object;
`ratio` = nkibuild / plain script (target <= 1.1). `ratio_vs_fresh_process_each` keeps
the earlier figure: one fresh process per kernel (a script run per kernel) / nkibuild.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from installed_bytecode import compile_nkibuild

from nkibuild.toolchain.worker_pool import WorkerKey, WorkerPool

KERNELS = 20
RUNS = 5
SHAPES = {"x": [128, 256], "y": [256, 128]}

PLAIN_SCRIPT = """\
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, sys.argv[1])
import kernels

out = Path(sys.argv[2])
x = jax.ShapeDtypeStruct((128, 256), jnp.float32)
y = jax.ShapeDtypeStruct((256, 128), jnp.float32)
for name in sys.argv[3:]:
    lowered = jax.jit(getattr(kernels, name)).lower(x, y)
    proto = lowered.compiler_ir("hlo").as_serialized_hlo_module_proto()
    (out / f"{name}.pb").write_bytes(proto)
"""


def write_kernels(root: Path) -> list[str]:
    names = [f"kernel_{index:02d}" for index in range(KERNELS)]
    body = ["import jax.numpy as jnp", ""]
    for index, name in enumerate(names):
        body += [f"def {name}(x, y):", f"    return jnp.tanh(x @ y) * {index + 1}", ""]
    (root / "kernels.py").write_text("\n".join(body))
    return names


def job(root: Path, out: Path, name: str) -> dict:
    return {
        "frontend": "jax",
        "root": str(root),
        "path": "kernels.py",
        "function": name,
        "inputs": [{"name": n, "shape": s, "dtype": "float32"} for n, s in SHAPES.items()],
        "constants": [],
        "output": str(out / f"{name}.pb"),
    }


def nkibuild_worker(root: Path, out: Path, names: list[str]) -> tuple[float, int]:
    started = time.perf_counter()
    pool = WorkerPool()
    key = WorkerKey(str(root), sys.executable, "jax", None)
    try:
        results = [pool.run(key, job(root, out, n), timeout=600, unit=n) for n in names]
    finally:
        pool.close()
    assert all(result["ok"] for result in results), results
    return time.perf_counter() - started, len({result["pid"] for result in results})


def plain_script(root: Path, out: Path, names: list[str]) -> float:
    started = time.perf_counter()
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "2"}
    subprocess.run(
        [sys.executable, "-c", PLAIN_SCRIPT, str(root), str(out), *names], env=env, check=True
    )
    return time.perf_counter() - started


def fresh_process_each(root: Path, out: Path, names: list[str]) -> float:
    started = time.perf_counter()
    for name in names:
        nkibuild_worker(root, out, [name])
    return time.perf_counter() - started


def main() -> None:
    compile_nkibuild()
    with tempfile.TemporaryDirectory(prefix="nkibuild-extract-bench-") as scratch:
        root = Path(scratch)
        names = write_kernels(root)
        out = root / "out"
        out.mkdir()
        plain_script(root, out, names[:1])  # warm the OS file cache for both sides
        ours, plain, processes = [], [], 0
        for _ in range(RUNS):
            plain.append(plain_script(root, out, names))
            seconds, processes = nkibuild_worker(root, out, names)
            ours.append(seconds)
        fresh = fresh_process_each(root, out, names)
    nkibuild_s, plain_s = statistics.median(ours), statistics.median(plain)
    print(f"{KERNELS} kernels, plain script importing jax once: {plain_s:.2f} s (median)")
    print(f"{KERNELS} kernels, nkibuild worker ({processes} process): {nkibuild_s:.2f} s (median)")
    print(f"{KERNELS} kernels, one fresh worker process each: {fresh:.2f} s")
    print(
        json.dumps(
            {
                "benchmark": "extract_batch",
                "ratio": round(nkibuild_s / plain_s, 3),
                "baseline": "one plain Python process that imports jax once and lowers "
                "all 20 kernels itself (same spawn, same files), interleaved",
                "target": "<= 1.1",
                "kernels": KERNELS,
                "runs": RUNS,
                "nkibuild_s": round(nkibuild_s, 3),
                "plain_script_s": round(plain_s, 3),
                "worker_processes": processes,
                "ratio_vs_fresh_process_each": round(fresh / nkibuild_s, 2),
                "fresh_processes_s": round(fresh, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
