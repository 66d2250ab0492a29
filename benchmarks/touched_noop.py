"""A touched but unchanged kernel source: `nkibuild build` vs a hand-written dodo.py on plain doit.

The project of benchmarks/noop_build.py, with one HLO source file per kernel (same
bytes), UNITS build units. Both sides are fully built once. Then, interleaved, each
run first touches one kernel's source (rewritten with the same bytes: new mtime and
ctime, same content) and is timed as a whole process:

- nkibuild: `nkibuild build` (its up-to-date proof compares the touched file's content
  and re-records its stat; nothing is rebuilt, doit is neither asked nor imported);
- the baseline: plain doit running the same tasks from a dodo.py with doit's `json`
  backend (`--backend json`), which finds the mtime changed, hashes the file and runs
  nothing.

Afterwards one kernel's source is edited (new content) and nkibuild's rebuild is run
once, reporting how long its up-to-date decision took (from build/state/last-run.json)
and how many tasks it handed to doit. `--units` sets the scale (default 1,000; the
issue's targets are at 1,000 and 10,000). The last line is a JSON object; `ratio` =
nkibuild / plain doit (target <= 1.0).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from installed_bytecode import compile_nkibuild
from noop_build import RUNS, interleaved_medians, measured, timed, write_project

from nkibuild.toolchain_double.hlo_writer import build_hlo_module

TOUCHED = 1  # which kernel's source is touched (not the edited one)


def touch(path: Path) -> None:
    path.write_bytes(path.read_bytes())


def edit_rebuild(root: Path, source: Path, env: dict[str, str]) -> dict[str, object]:
    """Give `source` new content, rebuild, and read back how the build decided."""
    source.write_bytes(
        build_hlo_module("edited", [("logits", "float32", (64, 1024))], [("float32", (64, 1024))])
    )
    command = [sys.executable, "-m", "nkibuild", "build", "--toolchain", "fake"]
    seconds, rss = measured(command, root, env)
    record = json.loads((root / "build" / "state" / "last-run.json").read_text())
    decision = record["up_to_date_decision"]
    return {
        "edit_rebuild_s": round(seconds, 3),
        "edit_decision_s": decision["seconds"],
        "edit_handed_to_doit": decision["handed_to_doit"],
        "edit_executed": sorted(record["executed"]),
        "edit_peak_rss_mib": round(rss, 1),
    }


def main() -> None:
    compile_nkibuild()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=1000, help="build units (default 1000)")
    parser.add_argument("--runs", type=int, default=RUNS, help=f"timed runs (default {RUNS})")
    args = parser.parse_args()
    # Figures are printed inside: removing the scratch dir of 10,000 units takes minutes.
    with tempfile.TemporaryDirectory(prefix="nkibuild-bench-") as scratch:
        root = Path(scratch) / "project"
        sources = write_project(root, args.units, own_sources=True)
        touched = root / sources[TOUCHED]
        env = {**os.environ, "CI": "true", "NKIBUILD_CACHE_DIR": str(Path(scratch) / "cache")}
        nkibuild = [sys.executable, "-m", "nkibuild", "build", "--toolchain", "fake"]
        plain = [sys.executable, "-m", "doit", "-f", "dodo.py", "--backend", "json"]
        plain += ["--db-file", ".doit.json"]
        full_build = timed([*nkibuild, "-j", "2"], root, env)
        timed(plain, root, env)

        def touch_source() -> None:
            touch(touched)

        (ours, ours_rss), (theirs, _) = interleaved_medians(
            [(nkibuild, touch_source), (plain, touch_source)], root, env, args.runs
        )
        edit = edit_rebuild(root, root / sources[0], env)
        print(f"full build ({args.units:,} units, -j2, fake compiler + cache): {full_build:.1f} s")
        print(f"one source touched, nkibuild build:        {ours:.3f} s (median of {args.runs})")
        print(f"one source touched, plain doit (json):     {theirs:.3f} s")
        print(
            f"one source edited, nkibuild's decision:    {edit['edit_decision_s']} s "
            f"({edit['edit_handed_to_doit']} tasks handed to doit; "
            f"rebuild {edit['edit_rebuild_s']} s)"
        )
        result = {
            "benchmark": "touched_noop",
            "ratio": round(ours / theirs, 3),
            "baseline": "hand-written dodo.py, same tasks, plain doit with its json backend, "
            "the same file touched before each run (interleaved)",
            "target": "<= 1.0",
            "units": args.units,
            "nkibuild_touched_s": round(ours, 3),
            "plain_doit_json_touched_s": round(theirs, 3),
            "nkibuild_peak_rss_mib": round(ours_rss, 1),
            **edit,
        }
        print(json.dumps(result))


if __name__ == "__main__":
    main()
