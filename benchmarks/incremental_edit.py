"""One kernel edited in a big project: the rebuild vs the same build's up-to-date decision.

A project of UNITS build units (hlo kernels, half as many kernels as units, each built
for trn1 and trn2; the toolchain double compiles) is fully built once. Then, timed as
whole `nkibuild build` processes, interleaved, median of RUNS:

- `edit` (nkibuild's side): one kernel's prebuilt HLO module is replaced by a new one
  (a module of another name, so its HLO differs and its two units recompile; each run
  a name not compiled before, so no cache serves it). The rebuild re-extracts that
  kernel, compiles its two units with the double's neuronx-cc, regenerates the bundle
  and repacks the wheel.
- `decision` (the baseline of `ratio`): the same project with nothing changed and the
  up-to-date proof (`build/state/up-to-date.json`) removed, so doit decides about every
  task, as it does in the edit's rebuild, and finds all of them up to date. This is the
  rebuild's up-to-date decision alone: the edit's rebuild cannot decide in less, and
  everything it takes beyond this is the work the edit causes.

The target: the edit's rebuild <= 1.5 x the decision, and <= 3 s at 1,000 units.
`--units 10000` runs the 10,000-unit scale (its first full build takes a few minutes);
the default is 1,000. The last line is a JSON object.
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
import zipfile
from pathlib import Path

from nkibuild.graph.uptodate import STAMP_FILE
from nkibuild.testing.hlo_writer import build_hlo_module

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


def timed(command: list[str], cwd: Path, env: dict[str, str]) -> float:
    started = time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return elapsed


def ran_tasks(root: Path) -> list[str]:
    """Tasks the last build ran (not up to date), from its record."""
    summary = json.loads((root / "build" / "state" / "last-run.json").read_text())
    return sorted(summary["executed"])


def wheel_members(root: Path) -> int:
    (wheel,) = (root / "dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return len(archive.namelist())


def measure(root: Path, units: int, runs: int) -> dict[str, object]:
    edited = write_project(root, units)
    env = {**os.environ, "CI": "true", "NKIBUILD_CACHE_DIR": str(root.parent / "cache")}
    build = [sys.executable, "-m", "nkibuild", "build", "--toolchain", "fake"]
    full = timed([*build, "-j", "2"], root, env)
    stamp = root / "build" / "state" / STAMP_FILE
    edits: list[float] = []
    decisions: list[float] = []
    for run in range(1, runs + 1):
        stamp.unlink(missing_ok=True)
        decisions.append(timed(build, root, env))
        if ran_tasks(root):
            sys.exit(f"the decision run ran tasks: {ran_tasks(root)}")
        edited.write_bytes(hlo(f"edited-{run}"))
        edits.append(timed(build, root, env))
        expected = {f"compile:{EDITED}/default/{t}" for t in TARGETS} | {
            f"extract:{EDITED}/default",
            "bundle",
            "wheel",
        }
        if set(ran_tasks(root)) != expected:
            sys.exit(f"the edit's rebuild ran {ran_tasks(root)}, expected {sorted(expected)}")
    return {
        "full": full,
        "edit": statistics.median(edits),
        "decision": statistics.median(decisions),
        "members": wheel_members(root),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=1000, help="build units (default 1000)")
    parser.add_argument("--runs", type=int, default=RUNS, help=f"timed runs (default {RUNS})")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="nkibuild-bench-") as scratch:
        figures = measure(Path(scratch) / "project", args.units, args.runs)
    edit, decision = figures["edit"], figures["decision"]
    print(f"full build ({args.units:,} units, -j2, fake compiler + cache): {figures['full']:.1f} s")
    print(f"one kernel edited, rebuild:            {edit:.2f} s (median of {args.runs})")
    print(f"nothing changed, doit decides (no proof): {decision:.2f} s")
    result = {
        "benchmark": "incremental_edit",
        "ratio": round(edit / decision, 3),
        "baseline": "the same project's up-to-date decision alone: nothing changed, "
        "up-to-date proof removed, doit checks every task (whole process, interleaved)",
        "target": "<= 1.5 (and <= 3 s at 1,000 units)",
        "units": args.units,
        "edit_rebuild_s": round(edit, 3),
        "decision_s": round(decision, 3),
        "full_build_s": round(figures["full"], 1),
        "wheel_members": figures["members"],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
