"""One kernel edited in a big project: the rebuild vs the same build's up-to-date decision.

A project of N build units (hlo kernels, N/2 of them, each built for trn1 and trn2;
the toolchain double compiles) is fully built once (-j2). Then, timed as whole
`nkibuild build -j2` processes, interleaved, median of RUNS:

- `edit` (nkibuild's side): one kernel's prebuilt HLO module is replaced by a new one
  (a module of another name, so its HLO differs; each run a name not compiled before,
  so no cache serves it). The rebuild re-extracts that kernel, compiles its two units
  with the double's neuronx-cc, updates the bundle and the wheel.
- `decision` (the baseline of `ratio`): the same build with nothing changed. It does
  everything the edit's rebuild does to decide what to run (load the plan and the
  task graph, check the per-task up-to-date proof: every task's files) and runs
  nothing. The edit's rebuild decides in that time plus doit's look at the five tasks
  the edit invalidated; all the rest is the work the edit causes.
- informational, once per scale: `doit decides everything` (the up-to-date proof
  removed, so doit checks all tasks and finds them up to date).

Targets: the rebuild <= 1.5 x the decision at 10,000 units, and <= 3 s at 1,000.
`--units 1000 10000` runs both scales (the 10,000-unit full build takes several
minutes); the default is 1,000. The last line is a JSON object; `ratio` is that of
the largest scale run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from installed_bytecode import compile_nkibuild

from nkibuild.graph.uptodate import STAMP_FILE
from nkibuild.toolchain_double.hlo_writer import build_hlo_module

TARGETS = ("trn1", "trn2")
RUNS = 5
SHAPE = (64, 1024)
EDITED = "k00000"


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


def timed(command: list[str], cwd: Path, env: dict[str, str], stages: list | None = None) -> float:
    """Seconds the whole process took; with `stages`, append the bundle and wheel tasks'
    own seconds as the build reported them (`[9/9] done   wheel 0.6s`)."""
    started = time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    if stages is not None:
        reported = dict(re.findall(r" done +(bundle|wheel) ([0-9.]+)s", proc.stdout))
        stages.append(float(reported["bundle"]) + float(reported["wheel"]))
    return elapsed


def ran_tasks(root: Path) -> list[str]:
    """Tasks the last build ran (not up to date), from its record."""
    summary = json.loads((root / "build" / "state" / "last-run.json").read_text())
    return sorted(summary["executed"])


def wheel_members(root: Path) -> int:
    (wheel,) = (root / "dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return len(archive.namelist())


def measure(root: Path, units: int, runs: int) -> dict[str, float | int]:
    edited = write_project(root, units)
    env = {**os.environ, "CI": "true", "NKIBUILD_CACHE_DIR": str(root.parent / "cache")}
    build = [sys.executable, "-m", "nkibuild", "build", "--toolchain", "fake", "-j", "2"]
    full = timed(build, root, env)
    stamp = root / "build" / "state" / STAMP_FILE
    stamp.unlink(missing_ok=True)
    everything = timed(build, root, env)
    edits: list[float] = []
    decisions: list[float] = []
    stages: list[float] = []  # the edit's bundle + wheel tasks
    expected = {f"extract:{EDITED}/default", "bundle", "wheel"}
    expected |= {f"compile:{EDITED}/default/{target}" for target in TARGETS}
    for run in range(1, runs + 1):
        decisions.append(timed(build, root, env))
        if ran_tasks(root):
            sys.exit(f"the decision run ran tasks: {ran_tasks(root)}")
        edited.write_bytes(hlo(f"edited-{run}"))
        edits.append(timed(build, root, env, stages))
        if set(ran_tasks(root)) != expected:
            sys.exit(f"the edit's rebuild ran {ran_tasks(root)}, expected {sorted(expected)}")
    return {
        "units": units,
        "full_build_s": round(full, 1),
        "doit_decides_everything_s": round(everything, 3),
        "edit_rebuild_s": round(statistics.median(edits), 3),
        "decision_s": round(statistics.median(decisions), 3),
        "bundle_and_wheel_tasks_s": round(statistics.median(stages), 3),
        "wheel_members": wheel_members(root),
    }


def main() -> None:
    compile_nkibuild()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, nargs="+", default=[1000], help="scales (1000)")
    parser.add_argument("--runs", type=int, default=RUNS, help=f"timed runs (default {RUNS})")
    args = parser.parse_args()
    scales = []
    for units in sorted(args.units):
        with tempfile.TemporaryDirectory(prefix="nkibuild-bench-") as scratch:
            figures = measure(Path(scratch) / "project", units, args.runs)
        scales.append(figures)
        print(
            f"{units:,} units: full build {figures['full_build_s']} s; one kernel edited, "
            f"rebuild {figures['edit_rebuild_s']} s; nothing changed (the decision) "
            f"{figures['decision_s']} s; proof removed, doit decides everything "
            f"{figures['doit_decides_everything_s']} s; the edit's bundle and wheel tasks "
            f"{figures['bundle_and_wheel_tasks_s']} s (medians of {args.runs})"
        )
    largest = scales[-1]
    result: dict[str, object] = {
        "benchmark": "incremental_edit",
        "ratio": round(largest["edit_rebuild_s"] / largest["decision_s"], 3),
        "baseline": "the same build with nothing changed (loads the graph, checks the "
        "per-task up-to-date proof, runs nothing), whole process, interleaved",
        "target": "<= 1.5 at 10,000 units; rebuild <= 3 s at 1,000 units",
        "ratio_units": largest["units"],
    }
    for figures in scales:
        units = figures["units"]
        result[f"ratio_{units}"] = round(figures["edit_rebuild_s"] / figures["decision_s"], 3)
        result |= {f"{key}_{units}": value for key, value in figures.items() if key != "units"}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
