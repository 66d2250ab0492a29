"""A release of a synthetic monorepo: 50 projects x 3 targets x 2 variants = 300 units.

Every unit compiles on the double for COMPILE_SECONDS of CPU (NKIBUILD_FAKE_CC_CPU_SECONDS)
and no two units share a cache key (each project's HLO differs), so the release does
300 real compiles with -j JOBS.

The baseline is the same 300 compiles without nkibuild: the exact `neuronx-cc compile`
command lines nkibuild runs (cold_build.py's `baseline_commands`: each in its own work
dir, on the project's HLO file, which is prebuilt, so nothing is extracted) through
`xargs -P JOBS`, run before and after the release; their mean is the baseline.
nkibuild's own share is 1 - baseline / release wall time: its extraction, checks,
caches, bundles, wheels and scheduling. (The sum of the compiler processes' lives over
JOBS, the earlier baseline, is printed too.)
Sharding balance: the release's units split into 4 shards by the LPT assignment,
largest shard's estimated work over the mean (costs from the compile times just
recorded).
The last line is a JSON object; `ratio` = wall time / ideal (sum of compiles / JOBS),
`overhead_share` (target < 0.05) and `shard_balance` (target <= 1.15).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cold_build import baseline_commands, run_baseline
from installed_bytecode import compile_nkibuild

from nkibuild.toolchain_double.hlo_writer import build_hlo_module

PROJECTS = 50
TARGETS = ("trn1", "trn2", "trn3")
COMPILE_SECONDS = 1.0
JOBS = 2
SHARDS = 4


def write_monorepo(root: Path) -> None:
    for index in range(PROJECTS):
        project = root / "kernels" / f"p{index:02d}"
        (project / "kernels").mkdir(parents=True)
        # A distinct shape per project: distinct HLO, distinct cache keys, no sharing.
        width = 64 + index
        hlo = build_hlo_module(
            f"k{index}", [("x", "float32", (8, width))], [("float32", (8, width))]
        )
        (project / "kernels" / "k.pb").write_bytes(hlo)
        (project / "nkibuild.yaml").write_text(
            "format-version: 1\n"
            f"package: {{name: bench-p{index:02d}, version: 1.0.0}}\n"
            f"defaults: {{targets: [{', '.join(TARGETS)}]}}\n"
            "kernels:\n"
            "  k:\n"
            "    frontend: hlo\n"
            "    source: kernels/k.pb\n"
            f"    inputs: {{x: {{shape: [8, {width}], dtype: float32}}}}\n"
            "  k_again:\n"
            "    frontend: hlo\n"
            "    source: kernels/k.pb\n"
            f"    inputs: {{x: {{shape: [8, {width}], dtype: float32}}}}\n"
            "    optlevel: 1\n"
        )


def main() -> None:
    compile_nkibuild()
    with tempfile.TemporaryDirectory(prefix="nkibuild-bench-") as scratch:
        root = Path(scratch) / "repo"
        write_monorepo(root)
        times = Path(scratch) / "compile-times"
        env = {
            **os.environ,
            "CI": "true",
            "NKIBUILD_CACHE_DIR": str(Path(scratch) / "cache"),
            "NKIBUILD_FAKE_CC_CPU_SECONDS": str(COMPILE_SECONDS),
            "NKIBUILD_FAKE_CC_TIMES": str(times),
        }
        projects = sorted((root / "kernels").iterdir())
        lines = [line for p in projects for line in baseline_commands(p, Path(scratch))]
        plain = {k: v for k, v in env.items() if k != "NKIBUILD_FAKE_CC_TIMES"}  # spans: ours
        before = run_baseline(lines, Path(scratch), plain).wall
        command = [sys.executable, "-m", "nkibuild", "release", str(root), "--out"]
        command += [str(Path(scratch) / "dist"), "--toolchain", "fake", "-j", str(JOBS)]
        started = time.perf_counter()
        proc = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - started
        after = run_baseline(lines, Path(scratch), plain).wall
        if proc.returncode != 0:
            sys.exit(f"release failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        spans = [tuple(map(float, line.split())) for line in times.read_text().splitlines()]
        inside = sum(end - start for start, end in spans)
        report = json.loads((Path(scratch) / "dist" / "release-report.json").read_text())
        compiling = sum(u["compile_seconds"] for p in report["projects"] for u in p["units"])
        balance = shard_balance(report)
    baseline = (before + after) / 2
    units = len(lines)
    print(
        f"compiler processes, spawn to reap: {compiling:.1f} s; inside the double: {inside:.1f} s"
    )
    print(f"{PROJECTS} projects, {units} units compiled, -j{JOBS}, {COMPILE_SECONDS:g} s each")
    print(f"xargs -P{JOBS}, same commands: {before:.1f} s before, {after:.1f} s after the release")
    print(f"release wall time:   {wall:.1f} s")
    print(f"nkibuild's share:    {1 - baseline / wall:.1%}")
    print(f"(compiles' sum/{JOBS}:  {compiling / JOBS:.1f} s, the earlier baseline)")
    print(f"shard balance ({SHARDS} shards): {balance:.3f}")
    result = {
        "benchmark": "release_scale",
        "ratio": round(wall / baseline, 3),
        "baseline": f"the same compiler command lines through xargs -P{JOBS} (mean of 2 runs)",
        "target": "<= 1.053 (overhead_share < 0.05)",
        "overhead_share": round(1 - baseline / wall, 4),
        "overhead_share_target": "< 0.05",
        "ratio_vs_sum_of_compiles": round(wall / (compiling / JOBS), 3),
        "shard_balance": round(balance, 3),
        "shard_balance_target": "<= 1.15",
        "units": units,
        "wall_s": round(wall, 1),
        "baseline_s": round(baseline, 1),
    }
    print(json.dumps(result))


def shard_balance(report: dict) -> float:
    from nkibuild.release.shard import ShardUnit, assign, balance

    units = [
        ShardUnit(f"{p['name']}/compile:{u['unit']}", float(u["compile_seconds"] or 1.0))
        for p in report["projects"]
        for u in p["units"]
    ]
    return balance(assign(units, SHARDS))


if __name__ == "__main__":
    main()
