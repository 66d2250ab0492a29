"""A release of a synthetic monorepo: 50 projects x 3 targets x 2 variants = 300 units.

Every unit compiles on the double for COMPILE_SECONDS of CPU (NKIBUILD_FAKE_CC_CPU_SECONDS)
and no two units share a cache key (each project's HLO differs), so the release does
300 real compiles with -j JOBS. nkibuild's own share of the wall time is what is
left after the compiles themselves: 1 - (sum of compile times / JOBS) / wall time,
where a compile's time is its compiler process's whole life, from spawn to reap (the
`compile_seconds` the release report carries; the double's own NKIBUILD_FAKE_CC_TIMES
spans, which miss interpreter teardown, are printed too).
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

from nkibuild.testing.hlo_writer import build_hlo_module

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
        command = [sys.executable, "-m", "nkibuild", "release", str(root), "--out"]
        command += [str(Path(scratch) / "dist"), "--toolchain", "fake", "-j", str(JOBS)]
        started = time.perf_counter()
        proc = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - started
        if proc.returncode != 0:
            sys.exit(f"release failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        spans = [tuple(map(float, line.split())) for line in times.read_text().splitlines()]
        inside = sum(end - start for start, end in spans)
        report = json.loads((Path(scratch) / "dist" / "release-report.json").read_text())
        compiling = sum(u["compile_seconds"] for p in report["projects"] for u in p["units"])
        balance = shard_balance(report)
    ideal = compiling / JOBS
    units = len(spans)
    print(
        f"compiler processes, spawn to reap: {compiling:.1f} s; inside the double: {inside:.1f} s"
    )
    print(f"{PROJECTS} projects, {units} units compiled, -j{JOBS}, {COMPILE_SECONDS:g} s each")
    print(f"release wall time:   {wall:.1f} s")
    print(f"compiling (sum/{JOBS}):  {ideal:.1f} s")
    print(f"nkibuild's share:    {1 - ideal / wall:.1%}")
    print(f"shard balance ({SHARDS} shards): {balance:.3f}")
    result = {
        "benchmark": "release_scale",
        "ratio": round(wall / ideal, 3),
        "baseline": f"the compiles alone: sum of compile times / {JOBS} jobs",
        "target": "<= 1.053 (overhead_share < 0.05)",
        "overhead_share": round(1 - ideal / wall, 4),
        "overhead_share_target": "< 0.05",
        "shard_balance": round(balance, 3),
        "shard_balance_target": "<= 1.15",
        "units": units,
        "wall_s": round(wall, 1),
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
