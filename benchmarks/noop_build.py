"""No-op build: `nkibuild build` vs the same tasks in a hand-written dodo.py on plain doit.

The project has `--units` build units (default 1,000: half as many hlo kernels, each
for trn1 and trn2). Its tasks are declared twice: by nkibuild from nkibuild.yaml, and
by a hand-written dodo.py with the same names, file_dep, targets and config_changed
values (its actions only write their targets). Each side is fully built once, plain
doit once with each of its backends (dbm, its default; json; sqlite3), each in a
state file of its own. Then every side is timed doing nothing (everything up to
date) as a whole process, interleaved run by run so that background load hits each
alike; medians.

`ratio` = nkibuild / the fastest plain doit backend (target <= 1.25 up to 1,000
units). The dodo.py has no check that a task's outputs are intact (plain doit has
none): nkibuild's, which stats every output, is part of what the ratio measures. At
10,000 units there is no ratio target: the figures and nkibuild's peak RSS (the
largest of its runs; target <= 300 MiB) are reported. The last line is a JSON object.
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

UNITS = 1000
TARGETS = ("trn1", "trn2")
RUNS = 7
RATIO_TARGET = 1.25
RATIO_MAX_UNITS = 1000  # the ratio target's scale; above it, figures and RSS only
RSS_TARGET_MIB = 300
HLO = Path(__file__).resolve().parents[1] / "examples" / "kernels" / "softmax.hlo.pb"
BACKENDS = {"dbm": ".doit-dbm.db", "json": ".doit.json", "sqlite3": ".doit-sqlite3.db"}

DODO = '''\
"""Hand-written dodo.py declaring the tasks nkibuild generates for nkibuild.yaml."""
import os

from doit import get_var
from doit.tools import config_changed

KERNELS = {kernels}
TARGETS = {targets}
SOURCES = {sources}
B = os.path.abspath(get_var("build", "plain-build"))  # one per backend


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
    records = [f"{{B}}/compile/{{k}}/default/{{t}}/result.json" for k in KERNELS for t in TARGETS]
    return {{
        "actions": [(touch, (f"{{B}}/bundle/bundle.json",))],
        "file_dep": [*records, os.path.abspath("nkibuild.yaml")],
        "targets": [f"{{B}}/bundle/bundle.json"],
        "uptodate": [config_changed({{"kernels": KERNELS}})],
    }}


def task_wheel():
    return {{
        "actions": [(touch, (f"{{B}}/dist/bench.whl",))],
        "file_dep": [f"{{B}}/bundle/bundle.json"],
        "targets": [f"{{B}}/dist/bench.whl"],
        "uptodate": [config_changed("")],
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


def nkibuild_command() -> list[str]:
    return [sys.executable, "-m", "nkibuild", "build", "--toolchain", "fake"]


def plain_doit_commands() -> dict[str, list[str]]:
    """Plain doit on the dodo.py, per backend, each with a state file and a build dir of
    its own: files one backend's build rewrote would have other times than another's
    state records, and doit would hash them all on every run."""
    plain = [sys.executable, "-m", "doit", "-f", "dodo.py"]
    return {
        backend: [*plain, "--backend", backend, "--db-file", db_file, f"build=plain-{backend}"]
        for backend, db_file in BACKENDS.items()
    }


def load() -> str:
    """The load averages (1, 5, 15 min): the figures' context on a shared machine."""
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def timed(command: list[str], cwd: Path, env: dict[str, str]) -> float:
    return measured(command, cwd, env)[0]


def measured(command: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float, float]:
    """Run `command` as a whole process: (seconds, peak RSS in MiB, CPU seconds)."""
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
    # Linux reports KiB. CPU (user + system) is steadier than wall time on a loaded machine.
    return elapsed, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime


def interleaved_medians(
    commands: list[tuple[list[str], Callable[[], None]]],
    cwd: Path,
    env: dict[str, str],
    runs: int = RUNS,
) -> list[tuple[float, float, float]]:
    """Alternate the commands run by run (each after its `prepare`), so background
    load hits every side alike; for each: (median seconds, largest peak RSS in MiB,
    median CPU seconds)."""
    samples: list[list[tuple[float, float, float]]] = [[] for _ in commands]
    for _ in range(runs):
        for (command, prepare), runs_of_command in zip(commands, samples, strict=True):
            prepare()
            runs_of_command.append(measured(command, cwd, env))
    return [
        (
            statistics.median(t for t, _, _ in results),
            max(rss for _, rss, _ in results),
            statistics.median(cpu for _, _, cpu in results),
        )
        for results in samples
    ]


def against_plain_doit(
    root: Path, env: dict[str, str], runs: int, prepare: Callable[[], None]
) -> tuple[tuple[float, float, float], dict[str, tuple[float, float, float]]]:
    """Build every side once, then time them interleaved, each run after `prepare`:
    (nkibuild's figures, plain doit's per backend), each (median s, peak RSS MiB,
    median CPU s)."""
    plain = plain_doit_commands()
    timed([*nkibuild_command(), "-j", "2"], root, env)
    for command in plain.values():
        timed(command, root, env)
    sides = [nkibuild_command(), *plain.values()]
    ours, *theirs = interleaved_medians([(side, prepare) for side in sides], root, env, runs)
    return ours, dict(zip(plain, theirs, strict=True))


def nothing() -> None:
    pass


def main() -> None:
    compile_nkibuild()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=UNITS, help=f"build units ({UNITS})")
    parser.add_argument("--runs", type=int, default=RUNS, help=f"timed runs ({RUNS})")
    args = parser.parse_args()
    units = args.units
    # Figures are printed inside: removing the scratch dir of 10,000 units takes minutes.
    with tempfile.TemporaryDirectory(prefix="nkibuild-bench-") as scratch:
        root = Path(scratch) / "project"
        write_project(root, units)
        env = {**os.environ, "CI": "true", "NKIBUILD_CACHE_DIR": str(Path(scratch) / "cache")}
        (ours, rss, cpu), plain = against_plain_doit(root, env, args.runs, nothing)
        fastest = min(plain, key=lambda backend: plain[backend][0])
        print(f"no-op build, {units:,} units, medians of {args.runs} (load {load()}):")
        print(f"  nkibuild build --toolchain fake: {ours:.3f} s ({cpu:.3f} s CPU), {rss:.0f} MiB")
        for backend, (seconds, peak, used) in plain.items():
            print(
                f"  plain doit, {backend:8} backend: {seconds:.3f} s ({used:.3f} s CPU), "
                f"{peak:.0f} MiB"
            )
        result: dict[str, object] = {
            "benchmark": "noop_build",
            "ratio": round(ours / plain[fastest][0], 3),
            "baseline": f"hand-written dodo.py, same {units + units // 2 + 2:,} tasks, plain "
            f"doit with its fastest backend here ({fastest}), interleaved",
            "target": f"<= {RATIO_TARGET}"
            if units <= RATIO_MAX_UNITS
            else f"none at this scale; peak RSS <= {RSS_TARGET_MIB} MiB",
            "units": units,
            "nkibuild_noop_s": round(ours, 3),
            **{f"plain_doit_{backend}_s": round(s, 3) for backend, (s, _, _) in plain.items()},
            "cpu_ratio": round(cpu / min(used for _, _, used in plain.values()), 3),
            "nkibuild_noop_cpu_s": round(cpu, 3),
            **{f"plain_doit_{b}_cpu_s": round(c, 3) for b, (_, _, c) in plain.items()},
            "peak_rss_mib": round(rss, 1),
            **{f"plain_doit_{b}_peak_rss_mib": round(r, 1) for b, (_, r, _) in plain.items()},
            "load": load(),
        }
        print(json.dumps(result))


if __name__ == "__main__":
    main()
