"""A cold build of 100 distinct units with `-j2` vs the same compiler commands run by `xargs -P2`.

The project: 50 prebuilt-HLO kernels (a distinct shape each, so no two units share a
cache key) x 2 targets = 100 units, compiled by the toolchain double as it is (no extra
CPU burnt: each compile is the double's interpreter start, HLO read and NEFF write,
about 0.1-0.2 s), so nkibuild's own per-unit work weighs as much as it can.

nkibuild's side: `nkibuild build -j2 --toolchain fake 'compile:*'` in a fresh build
directory with an empty local NEFF cache (so every NEFF is also published to it), timed
as a whole process. The bundle and wheel are not built: the baseline makes no wheel.

The baseline is what a competent user with the same HLO files writes: the exact
`neuronx-cc compile ...` command lines nkibuild runs (taken from nkibuild's adapter,
so flags and order are identical), each in its own work directory (neuronx-cc uses its
cwd as its work dir), one line per unit, through `xargs -P2`, each started by `setsid`:
nkibuild starts every compiler in a session of its own, and with the kernel's
autogrouping (sched_autogroup_enabled=1, the default of most distributions) each
session is scheduled as a group, so on a machine loaded by other work compilers in
their own sessions get more CPU than compilers sharing xargs's. Both sides are
arranged alike; on an idle machine it makes no difference.

Extraction: the kernels are prebuilt HLO, so the baseline has nothing to extract and
compiles the user's `.pb` files directly. nkibuild's extraction of them (validate, hash,
copy into the build dir) is IN its timed side: that is the stricter comparison and the
`ratio`. `ratio_extraction_done` times a second nkibuild build whose extraction already
ran (extraction out of both sides).

Runs are interleaved (baseline, nkibuild, nkibuild with extraction done) ROUNDS times;
`ratio` is the median of each round's nkibuild / baseline (a round's two runs see about
the same machine load). The CPU time of each side's whole process tree is reported too
(`cpu_ratio`): the compilers' share is the same on both, so the difference is nkibuild's
own work, which on 2 busy cores is taken from the compilers. The last line is a JSON
object (target: `ratio` <= 1.1). `own_cpu_ms_per_unit` is the CPU time of the nkibuild
process itself (without its children), per unit, startup included.
"""

from __future__ import annotations

import json
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from installed_bytecode import compile_nkibuild

from nkibuild.toolchain_double.hlo_writer import build_hlo_module

KERNELS = 50
TARGETS = ("trn1", "trn2")
JOBS = 2
ROUNDS = 5
TASKS = "compile:*"


def write_project(root: Path) -> None:
    (root / "kernels").mkdir(parents=True)
    lines = [
        "format-version: 1",
        "package: {name: cold-bench, version: 1.0.0}",
        f"defaults: {{targets: [{', '.join(TARGETS)}]}}",
        "kernels:",
    ]
    for index in range(KERNELS):
        width = 64 + index  # a distinct shape: distinct HLO, distinct cache keys
        hlo = build_hlo_module(
            f"k{index}", [("x", "float32", (8, width))], [("float32", (8, width))]
        )
        (root / "kernels" / f"k{index}.pb").write_bytes(hlo)
        lines += [
            f"  k{index}:",
            "    frontend: hlo",
            f"    source: kernels/k{index}.pb",
            f"    inputs: {{x: {{shape: [8, {width}], dtype: float32}}}}",
        ]
    (root / "nkibuild.yaml").write_text("\n".join(lines) + "\n")


def baseline_commands(root: Path, scratch: Path) -> list[str]:
    """One shell line per unit of the project at `root`: its own work dir under
    `scratch/xargs`, then nkibuild's exact compiler command on the project's HLO file."""
    from nkibuild.compiler import compiler_command
    from nkibuild.context import load_context
    from nkibuild.settings import BuildOptions

    plan = scratch / "plans" / root.name
    context = load_context(root / "nkibuild.yaml", plan, plan / "dist", BuildOptions("fake"))
    lines = []
    for unit in context.units:
        work = scratch / "xargs" / root.name / unit.name.replace("/", "-")
        hlo = root / unit.extract.source.path
        command = compiler_command(
            unit, context.toolchain, hlo, Path("model.neff"), Path("compile.log")
        )
        lines.append(f"mkdir -p {shlex.quote(str(work))} && cd {shlex.quote(str(work))} && "
                     f"exec {shlex.join(command)}")  # fmt: skip
    return lines


class Timed:
    """Wall time and the CPU time of the children that ended meanwhile."""

    own = 0.0  # CPU time of the timed process itself, where it reports it

    def __enter__(self) -> Timed:
        self.cpu = -_children_cpu()
        self.wall = -time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall += time.perf_counter()
        self.cpu += _children_cpu()


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_baseline(
    lines: list[str], scratch: Path, env: dict[str, str] | None = None, jobs: int = JOBS
) -> Timed:
    """The command lines through `xargs -P jobs`, timed."""
    shutil.rmtree(scratch / "xargs", ignore_errors=True)
    script = scratch / "commands.txt"
    script.write_text("\n".join(lines) + "\n")
    with open(script, "rb") as commands, Timed() as timed:
        proc = subprocess.run(
            ["xargs", "-d", "\n", "-n", "1", "-P", str(jobs), "setsid", "-w", "sh", "-c"],
            stdin=commands,
            capture_output=True,
            env=env,
            check=False,
        )
    if proc.returncode != 0:
        sys.exit(f"xargs failed ({proc.returncode}):\n{proc.stderr.decode()[-3000:]}")
    neffs = list((scratch / "xargs").glob("*/*/model.neff"))
    if len(neffs) != len(lines):
        sys.exit(f"the baseline wrote {len(neffs)} NEFFs for {len(lines)} units")
    return timed


# `python -m nkibuild ARGS` that also writes its own CPU time (not its children's) to
# the file named by its first argument.
WITH_OWN_CPU = """
import atexit, resource, runpy, sys
out = sys.argv.pop(1)
def report():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    with open(out, "w") as handle:
        handle.write(str(usage.ru_utime + usage.ru_stime))
atexit.register(report)
runpy.run_module("nkibuild", run_name="__main__", alter_sys=True)
"""


def nkibuild_build(root: Path, scratch: Path, *, extracted: bool) -> Timed:
    """A cold compile of every unit; `extracted`: the extraction ran beforehand, untimed."""
    shutil.rmtree(root / "build", ignore_errors=True)
    shutil.rmtree(scratch / "cache", ignore_errors=True)
    env = {**os.environ, "CI": "true", "NKIBUILD_CACHE_DIR": str(scratch / "cache")}
    command = [sys.executable, "-m", "nkibuild", "build", "--toolchain", "fake"]
    command += ["-j", str(JOBS)]
    if extracted:
        _run([*command, "extract:*"], root, env)
    own = scratch / "own-cpu"
    measured = [sys.executable, "-c", WITH_OWN_CPU, str(own), *command[3:]]
    with Timed() as timed:
        _run([*measured, TASKS], root, env)
    timed.own = float(own.read_text())
    neffs = list((root / "build").glob("compile/**/model.neff"))
    if len(neffs) != KERNELS * len(TARGETS):
        sys.exit(f"nkibuild wrote {len(neffs)} NEFFs for {KERNELS * len(TARGETS)} units")
    return timed


def _run(command: list[str], root: Path, env: dict[str, str]) -> None:
    proc = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"{shlex.join(command)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")


def main() -> None:
    compile_nkibuild()
    with tempfile.TemporaryDirectory(prefix="nkibuild-bench-") as name:
        scratch = Path(name)
        root = scratch / "project"
        write_project(root)
        lines = baseline_commands(root, scratch)
        nkibuild_build(root, scratch, extracted=False)  # warm-up: bytecode, page cache
        baseline: list[Timed] = []
        full: list[Timed] = []
        done: list[Timed] = []
        for _ in range(ROUNDS):
            baseline.append(run_baseline(lines, scratch))
            full.append(nkibuild_build(root, scratch, extracted=False))
            done.append(nkibuild_build(root, scratch, extracted=True))
    units = len(lines)
    base, ours, ours_done = (
        statistics.median(t.wall for t in runs) for runs in (baseline, full, done)
    )
    ratio = _paired(full, baseline, "wall")
    cpu = {name: statistics.median(t.cpu for t in runs) for name, runs in
           (("baseline", baseline), ("nkibuild", full), ("done", done))}  # fmt: skip
    print(f"{units} distinct units, -j{JOBS}, {os.cpu_count()} CPUs, {ROUNDS} rounds (median)")
    print(f"xargs -P{JOBS}, same compiler commands:  {base:6.2f} s  CPU {cpu['baseline']:6.2f} s"
          f"  {_all(baseline)}")  # fmt: skip
    print(f"nkibuild build 'compile:*' (cold):    {ours:6.2f} s  CPU {cpu['nkibuild']:6.2f} s"
          f"  {_all(full)}")  # fmt: skip
    print(f"  the same, extraction already done:  {ours_done:6.2f} s  CPU {cpu['done']:6.2f} s"
          f"  {_all(done)}")  # fmt: skip
    own_cpu = statistics.median(t.own for t in full) / units * 1000
    print(
        f"nkibuild's own CPU per unit: {own_cpu:.1f} ms; ratio per round: "
        + ", ".join(f"{a.wall / b.wall:.3f}" for a, b in zip(full, baseline, strict=True))
    )
    result = {
        "benchmark": "cold_build",
        "ratio": ratio,
        "baseline": f"the same neuronx-cc command lines (double) through xargs -P{JOBS}",
        "target": "<= 1.1",
        "ratio_extraction_done": _paired(done, baseline, "wall"),
        "cpu_ratio": _paired(full, baseline, "cpu"),
        "units": units,
        "jobs": JOBS,
        "baseline_s": round(base, 2),
        "nkibuild_s": round(ours, 2),
        "nkibuild_extraction_done_s": round(ours_done, 2),
        "own_cpu_ms_per_unit": round(own_cpu, 1),
        "cpus": os.cpu_count(),
        "load_avg_1min": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(result))


def _paired(ours: list[Timed], baseline: list[Timed], what: str) -> float:
    """The median over rounds of nkibuild's figure over the same round's baseline."""
    ratios = [getattr(a, what) / getattr(b, what) for a, b in zip(ours, baseline, strict=True)]
    return round(statistics.median(ratios), 3)


def _all(runs: list[Timed]) -> str:
    return "(" + ", ".join(f"{t.wall:.2f}" for t in runs) + ")"


if __name__ == "__main__":
    main()
