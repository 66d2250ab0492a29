"""A touched but unchanged kernel source: `nkibuild build` vs a hand-written dodo.py on plain doit.

The project of benchmarks/noop_build.py with one HLO source file per kernel (same
bytes), `--units` build units (default 1,000). Every side (nkibuild, and plain doit
with each of its backends: dbm, json, sqlite3) is fully built once. Then, interleaved,
each run first touches one kernel's source (rewritten with the same bytes: new mtime
and ctime, same content) and is timed as a whole process: each side finds the file's
time changed, hashes it, finds the content unchanged and runs nothing.

`ratio` = nkibuild / the fastest plain doit backend (target <= 1.25). The last line is
a JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from installed_bytecode import compile_nkibuild
from noop_build import RATIO_TARGET, RUNS, against_plain_doit, load, write_project

UNITS = 1000
TOUCHED = 1  # which kernel's source is touched


def main() -> None:
    compile_nkibuild()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=UNITS, help=f"build units ({UNITS})")
    parser.add_argument("--runs", type=int, default=RUNS, help=f"timed runs ({RUNS})")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="nkibuild-bench-") as scratch:
        root = Path(scratch) / "project"
        touched = root / write_project(root, args.units, own_sources=True)[TOUCHED]
        env = {**os.environ, "CI": "true", "NKIBUILD_CACHE_DIR": str(Path(scratch) / "cache")}

        def touch() -> None:
            touched.write_bytes(touched.read_bytes())

        (ours, rss, cpu), plain = against_plain_doit(root, env, args.runs, touch)
    fastest = min(plain, key=lambda backend: plain[backend][0])
    print(f"one source touched, {args.units:,} units, medians of {args.runs} (load {load()}):")
    print(f"  nkibuild build --toolchain fake: {ours:.3f} s ({cpu:.3f} s CPU), {rss:.0f} MiB")
    for backend, (seconds, _, used) in plain.items():
        print(f"  plain doit, {backend:8} backend: {seconds:.3f} s ({used:.3f} s CPU)")
    result = {
        "benchmark": "touched_noop",
        "ratio": round(ours / plain[fastest][0], 3),
        "baseline": f"hand-written dodo.py, same tasks, plain doit with its fastest backend "
        f"here ({fastest}), the same file touched before each run, interleaved",
        "target": f"<= {RATIO_TARGET}",
        "units": args.units,
        "nkibuild_touched_s": round(ours, 3),
        **{f"plain_doit_{backend}_s": round(s, 3) for backend, (s, _, _) in plain.items()},
        "cpu_ratio": round(cpu / min(used for _, _, used in plain.values()), 3),
        "nkibuild_touched_cpu_s": round(cpu, 3),
        "peak_rss_mib": round(rss, 1),
        "load": load(),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
