"""Parallel compiles: a full build with `-j2` vs the same build with `-j1`, on 2 cores.

The fake neuronx-cc burns CPU for COMPILE_SECONDS per unit (NKIBUILD_FAKE_CC_CPU_SECONDS),
so the build is compile-bound as real ones are. Caches are off, so every unit compiles.
A third build runs `-j2` under a memory budget that fits only one compile at a time,
to show the budget, not `-j`, decides when compiles would not fit.
The last line is a JSON object; `ratio` = time(-j2) / time(-j1) (target <= 0.53, i.e. a
speed-up >= 1.9x, reported as `speedup`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KERNELS = 4
TARGETS = ("trn1", "trn2")
COMPILE_SECONDS = 2.0
HLO = Path(__file__).resolve().parents[1] / "examples" / "kernels" / "softmax.hlo.pb"


def write_project(root: Path) -> None:
    (root / "kernels").mkdir(parents=True)
    shutil.copyfile(HLO, root / "kernels" / "k.pb")
    lines = [
        "format-version: 1",
        "package: {name: parallel-bench, version: 1.0.0}",
        f"defaults: {{targets: [{', '.join(TARGETS)}], compile-memory: 1G}}",
        "kernels:",
    ]
    for index in range(KERNELS):
        lines += [
            f"  k{index}:",
            "    frontend: hlo",
            "    source: kernels/k.pb",
            "    inputs: {logits: {shape: [64, 1024], dtype: float32}}",
        ]
    (root / "nkibuild.yaml").write_text("\n".join(lines) + "\n")


def full_build(root: Path, env: dict[str, str], *flags: str) -> float:
    shutil.rmtree(root / "build", ignore_errors=True)
    shutil.rmtree(root / "dist", ignore_errors=True)
    command = [sys.executable, "-m", "nkibuild", "build", "--toolchain", "fake", "--no-cache"]
    started = time.perf_counter()
    proc = subprocess.run(
        [*command, *flags], cwd=root, env=env, capture_output=True, text=True, check=False
    )
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"build {flags} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return elapsed


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="nkibuild-bench-") as scratch:
        root = Path(scratch) / "project"
        write_project(root)
        env = {**os.environ, "CI": "true", "NKIBUILD_FAKE_CC_CPU_SECONDS": str(COMPILE_SECONDS)}
        full_build(root, env, "-j", "2")  # warm-up: imports, bytecode, page cache
        serial = full_build(root, env, "-j", "1")
        parallel = full_build(root, env, "-j", "2")
        budgeted = full_build(root, env, "-j", "2", "--max-compile-memory", "1G")
    units = KERNELS * len(TARGETS)
    print(f"{units} units, {COMPILE_SECONDS:g} s of CPU each, {os.cpu_count()} CPUs")
    print(f"-j1:                               {serial:.2f} s")
    print(f"-j2:                               {parallel:.2f} s")
    print(f"-j2 --max-compile-memory 1G (1 fits): {budgeted:.2f} s")
    result = {
        "benchmark": "parallel_compile",
        "ratio": round(parallel / serial, 3),
        "baseline": "the same full build with -j1",
        "target": "<= 0.53",
        "speedup": round(serial / parallel, 3),
        "speedup_target": ">= 1.9",
        "units": units,
        "compile_seconds_per_unit": COMPILE_SECONDS,
        "serial_s": round(serial, 2),
        "parallel_s": round(parallel, 2),
        "budget_one_at_a_time_s": round(budgeted, 2),
        "cpus": os.cpu_count(),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
