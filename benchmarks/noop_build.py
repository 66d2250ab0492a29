"""No-op build of 1,000 build units: `nkibuild build` vs a hand-written dodo.py on plain doit.

Both sides declare the same tasks (500 extract, 1,000 compile, bundle, wheel) with
the same file_dep/targets/config_changed, are fully built once, and are then timed
doing nothing (everything up to date), as whole processes, median of several runs.
`--units 10000` runs the 10,000-unit scale. The peak RSS of nkibuild's no-op build
(the largest of its runs) is reported too (target <= 150 MiB at 10,000 units).
The last line is a JSON object; `ratio` = nkibuild / plain doit (target <= 1.0).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from installed_bytecode import compile_nkibuild

from nkibuild.graph.uptodate import STAMP_FILE

UNITS = 1000
TARGETS = ("trn1", "trn2")
RUNS = 7
HLO = Path(__file__).resolve().parents[1] / "examples" / "kernels" / "softmax.hlo.pb"

DODO = '''\
"""Hand-written dodo.py declaring the same tasks nkibuild generates."""
import json
import os

from doit.tools import config_changed

KERNELS = {kernels}
TARGETS = {targets}
SOURCES = {sources}
B = os.path.abspath("plain-build")


def touch(*paths):
    for path in paths:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as handle:
            handle.write(path)


def task_extract():
    for kernel, source in zip(KERNELS, SOURCES):
        out = f"{{B}}/extract/{{kernel}}/default"
        config = {{"frontend": "hlo", "source": source, "inputs": [[64, 1024]]}}
        yield {{
            "name": f"{{kernel}}/default",
            "actions": [(touch, (f"{{out}}/model.hlo_module.pb", f"{{out}}/artifact.json"))],
            "file_dep": [os.path.abspath(source)],
            "targets": [f"{{out}}/model.hlo_module.pb", f"{{out}}/artifact.json"],
            "uptodate": [config_changed(config)],
        }}


def task_compile():
    for kernel in KERNELS:
        for target in TARGETS:
            src = f"{{B}}/extract/{{kernel}}/default"
            out = f"{{B}}/compile/{{kernel}}/default/{{target}}"
            lnc = "1" if target == "trn1" else "2"
            args = ["--target", target, "--lnc", lnc, "--optlevel", "2", "--auto-cast", "none"]
            yield {{
                "name": f"{{kernel}}/default/{{target}}",
                "actions": [(touch, (f"{{out}}/model.neff", f"{{out}}/result.json"))],
                "file_dep": [f"{{src}}/model.hlo_module.pb", f"{{src}}/artifact.json"],
                "targets": [f"{{out}}/model.neff", f"{{out}}/result.json"],
                "uptodate": [config_changed({{"compile_args": args, "compiler_version": "x"}})],
            }}


def task_bundle():
    neffs = [
        f"{{B}}/compile/{{k}}/default/{{t}}/{{name}}"
        for k in KERNELS for t in TARGETS for name in ("model.neff", "result.json")
    ]
    return {{
        "actions": [(touch, (f"{{B}}/bundle/bundle.json",))],
        "file_dep": neffs,
        "targets": [f"{{B}}/bundle/bundle.json"],
        "uptodate": [config_changed({{"kernels": KERNELS}})],
    }}


def task_wheel():
    return {{
        "actions": [(touch, (f"{{B}}/dist/bench.whl",))],
        "file_dep": [f"{{B}}/bundle/bundle.json"],
        "targets": [f"{{B}}/dist/bench.whl"],
    }}
'''


def write_project(root: Path, units: int, *, own_sources: bool = False) -> list[str]:
    """The project (nkibuild.yaml and dodo.py side by side); returns the kernel sources.

    Every kernel reads one shared HLO file, or (`own_sources`) a file of its own with
    the same bytes (so the full build compiles once per target either way)."""
    kernels = [f"k{index:05d}" for index in range(units // len(TARGETS))]
    (root / "kernels").mkdir(parents=True)
    sources = [f"kernels/{k}.pb" if own_sources else "kernels/k.pb" for k in kernels]
    for source in set(sources):
        shutil.copyfile(HLO, root / source)
    lines = [
        "format-version: 1",
        "package: {name: bench-kernels, version: 1.0.0}",
        f"defaults: {{targets: [{', '.join(TARGETS)}]}}",
        "kernels:",
    ]
    for kernel, source in zip(kernels, sources, strict=True):
        lines += [
            f"  {kernel}:",
            "    frontend: hlo",
            f"    source: {source}",
            "    inputs: {logits: {shape: [64, 1024], dtype: float32}}",
        ]
    (root / "nkibuild.yaml").write_text("\n".join(lines) + "\n")
    dodo = DODO.format(kernels=kernels, targets=TARGETS, sources=sources)
    (root / "dodo.py").write_text(dodo)
    return sources


def timed(command: list[str], cwd: Path, env: dict[str, str]) -> float:
    return measured(command, cwd, env)[0]


def measured(command: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """Run `command` as a whole process: (seconds, peak RSS in MiB)."""
    with tempfile.TemporaryFile() as output:
        started = time.perf_counter()
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=output, stderr=output)
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            output.seek(0)
            log = output.read().decode(errors="replace")
            sys.exit(f"{' '.join(command)} failed ({proc.returncode}):\n{log}")
    return elapsed, usage.ru_maxrss / 1024  # Linux reports KiB


def interleaved_medians(
    commands: list[tuple[list[str], Callable[[], None]]],
    cwd: Path,
    env: dict[str, str],
    runs: int = RUNS,
) -> list[tuple[float, float]]:
    """Alternate the commands run by run, so background load hits every side alike;
    for each: (median seconds, largest peak RSS in MiB)."""
    samples: list[list[tuple[float, float]]] = [[] for _ in commands]
    for _ in range(runs):
        for (command, prepare), runs_of_command in zip(commands, samples, strict=True):
            prepare()
            runs_of_command.append(measured(command, cwd, env))
    return [
        (statistics.median(t for t, _ in results), max(rss for _, rss in results))
        for results in samples
    ]


def nothing() -> None:
    pass


def main() -> None:
    compile_nkibuild()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=UNITS, help=f"build units ({UNITS})")
    parser.add_argument("--runs", type=int, default=RUNS, help=f"timed runs ({RUNS})")
    args = parser.parse_args()
    # Figures are printed inside: removing the scratch dir of 10,000 units takes minutes.
    with tempfile.TemporaryDirectory(prefix="nkibuild-bench-") as scratch:
        root = Path(scratch) / "project"
        write_project(root, args.units)
        env = {**os.environ, "CI": "true", "NKIBUILD_CACHE_DIR": str(Path(scratch) / "cache")}
        nkibuild = [sys.executable, "-m", "nkibuild", "build", "--toolchain", "fake"]
        plain = [sys.executable, "-m", "doit", "-f", "dodo.py"]
        plain_sqlite = [*plain, "--backend", "sqlite3", "--db-file", ".doit-sqlite.db"]
        full_build = timed([*nkibuild, "-j", "2"], root, env)
        timed(plain, root, env)
        timed(plain_sqlite, root, env)
        stamp = root / "build" / "state" / STAMP_FILE

        def drop_proof() -> None:
            stamp.unlink(missing_ok=True)

        noop, doit_path, noop_plain, noop_plain_sqlite = interleaved_medians(
            [
                (nkibuild, nothing),
                (nkibuild, drop_proof),
                (plain, nothing),
                (plain_sqlite, nothing),
            ],
            root,
            env,
            args.runs,
        )
        units = args.units
        print(f"full build ({units:,} units, -j2, fake compiler + cache): {full_build:.2f} s")
        print(f"no-op nkibuild build:                 {noop[0]:.3f} s (median of {args.runs})")
        print(
            f"no-op nkibuild build, doit deciding:  {doit_path[0]:.3f} s (up-to-date proof removed)"
        )
        print(f"no-op plain doit (default backend):   {noop_plain[0]:.3f} s")
        print(f"no-op plain doit (sqlite3 backend):   {noop_plain_sqlite[0]:.3f} s")
        print(f"peak RSS: nkibuild {noop[1]:.0f} MiB, plain doit {noop_plain[1]:.0f} MiB")
        result = {
            "benchmark": "noop_build",
            "ratio": round(noop[0] / noop_plain[0], 3),
            "baseline": f"hand-written dodo.py, same {units + units // 2 + 2:,} tasks, "
            "plain doit (default backend)",
            "target": "<= 1.0",
            "units": units,
            "nkibuild_noop_s": round(noop[0], 3),
            "plain_doit_noop_s": round(noop_plain[0], 3),
            "ratio_vs_plain_doit_sqlite3": round(noop[0] / noop_plain_sqlite[0], 3),
            "ratio_without_uptodate_proof": round(doit_path[0] / noop_plain[0], 3),
            "peak_rss_mib": round(noop[1], 1),
            "peak_rss_mib_without_uptodate_proof": round(doit_path[1], 1),
            "plain_doit_peak_rss_mib": round(noop_plain[1], 1),
        }
        print(json.dumps(result))


if __name__ == "__main__":
    main()
