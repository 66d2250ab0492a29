"""One kernel edited in a project of 1,000 build units: the rebuild vs that kernel's compile time.

The project has `--units` build units (default 1,000: hlo kernels, half as many, each
for trn1 and trn2; the toolchain double compiles). It is fully built once (-j2). Then,
RUNS times, timed as whole `nkibuild build -j2` processes, alternately:

- `noop`: nothing changed; doit checks every task and runs none;
- `rebuild`: one kernel's HLO module is replaced by a new one (a module of another
  name each run, so no cache serves it). The rebuild re-extracts that kernel, compiles
  its two units, writes the bundle and the wheel again.

`compile_s` is that kernel's compile time: the compile seconds of its two units as the
rebuild reports them (`--report`), summed. Target: the rebuild takes at most 1.5 s
more than that; `ratio` = rebuild_s / (1.5 + compile_s), median over the runs (target
<= 1.0). The last line is a JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from installed_bytecode import compile_nkibuild
from noop_build import load

from nkibuild.toolchain_double.hlo_writer import build_hlo_module

UNITS = 1000
TARGETS = ("trn1", "trn2")
RUNS = 5
SHAPE = (64, 1024)
EDITED = "k00000"
ALLOWANCE_S = 1.5  # what the rebuild may take beyond the edited kernel's compiles


def hlo(name: str) -> bytes:
    return build_hlo_module(name, [("logits", "float32", SHAPE)], [("float32", SHAPE)])


def write_project(root: Path, units: int) -> Path:
    """The project; every kernel but the edited one shares one HLO file (so the full
    build compiles it once per target and takes the rest from the cache)."""
    kernels = [f"k{index:05d}" for index in range(units // len(TARGETS))]
    (root / "kernels").mkdir(parents=True)
    (root / "kernels" / "shared.pb").write_bytes(hlo("shared"))
    (root / "kernels" / "edited.pb").write_bytes(hlo("edited-0"))
    lines = [
        "format-version: 1",
        "package: {name: edit-bench, version: 1.0.0}",
        f"defaults: {{targets: [{', '.join(TARGETS)}]}}",
        "kernels:",
    ]
    for kernel in kernels:
        source = "edited" if kernel == EDITED else "shared"
        lines += [
            f"  {kernel}:",
            "    frontend: hlo",
            f"    source: kernels/{source}.pb",
            f"    inputs: {{logits: {{shape: [{SHAPE[0]}, {SHAPE[1]}], dtype: float32}}}}",
        ]
    (root / "nkibuild.yaml").write_text("\n".join(lines) + "\n")
    return root / "kernels" / "edited.pb"


def timed(command: list[str], cwd: Path, env: dict[str, str]) -> float:
    started = time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return elapsed


def main() -> None:
    compile_nkibuild()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=UNITS, help=f"build units ({UNITS})")
    parser.add_argument("--runs", type=int, default=RUNS, help=f"timed runs ({RUNS})")
    args = parser.parse_args()
    expected = {f"extract:{EDITED}/default", "bundle", "wheel"}
    expected |= {f"compile:{EDITED}/default/{target}" for target in TARGETS}
    noops: list[float] = []
    rebuilds: list[float] = []
    compiles: list[float] = []
    with tempfile.TemporaryDirectory(prefix="nkibuild-bench-") as scratch:
        root = Path(scratch) / "project"
        edited = write_project(root, args.units)
        report = Path(scratch) / "report.json"
        env = {**os.environ, "CI": "true", "NKIBUILD_CACHE_DIR": str(Path(scratch) / "cache")}
        build = [sys.executable, "-m", "nkibuild", "build", "--toolchain", "fake", "-j", "2"]
        full = timed(build, root, env)
        for run in range(1, args.runs + 1):
            noops.append(timed([*build, "--report", str(report)], root, env))
            if json.loads(report.read_text())["executed"]:
                sys.exit("the no-op build ran tasks")
            edited.write_bytes(hlo(f"edited-{run}"))
            rebuilds.append(timed([*build, "--report", str(report)], root, env))
            record = json.loads(report.read_text())
            if set(record["executed"]) != expected:
                sys.exit(f"the rebuild ran {sorted(record['executed'])}, not {sorted(expected)}")
            compiles.append(sum(unit["compile_seconds"] or 0.0 for unit in record["units"]))
    ratios = [r / (ALLOWANCE_S + c) for r, c in zip(rebuilds, compiles, strict=True)]
    rebuild_s, compile_s, noop_s = map(statistics.median, (rebuilds, compiles, noops))
    print(f"{args.units:,} units, medians of {args.runs} (load {load()}): full build {full:.1f} s")
    print(f"  one kernel edited, rebuild -j2: {rebuild_s:.3f} s (its compiles {compile_s:.3f} s)")
    print(f"  nothing changed, no-op -j2:     {noop_s:.3f} s")
    result = {
        "benchmark": "incremental_edit",
        "ratio": round(statistics.median(ratios), 3),
        "baseline": f"{ALLOWANCE_S} s plus the edited kernel's compile seconds (its two "
        "units', as the rebuild reports them), per run",
        "target": "<= 1.0",
        "units": args.units,
        "rebuild_s": round(rebuild_s, 3),
        "compile_s": round(compile_s, 3),
        "noop_s": round(noop_s, 3),
        "full_build_s": round(full, 1),
        "load": load(),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
