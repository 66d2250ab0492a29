"""Validate a 10,000-unit manifest, and the CLI's start-up.

`nkibuild validate` of 1,000 JAX kernels (5 shape variants x 2 targets each: 10,000
build units), cold (no plan cache: the manifest was just edited) and with the plan
cached, is timed against what a competent user would write to check the same file:
a fresh Python process that loads it with yaml.CSafeLoader and validates it with
jsonschema against nkibuild's own schema. That baseline checks less (no positions, no
source files, no function lookups, no semantic checks) and is the floor a complete
check can approach. `nkibuild --help` is timed against `python -c "import doit"`.
Runs alternate between the sides so background load hits each alike; medians.
The peak RSS of the validate runs is reported (target <= 300 MiB). The last line
is a JSON object: `ratio` = cold nkibuild validate / the baseline.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from installed_bytecode import compile_nkibuild
from noop_build import RSS_TARGET_MIB, interleaved_medians, load, nothing

KERNELS = 1_000
VARIANTS = 5
TARGETS = ("trn1", "trn2")
FILES = 10  # kernel modules (and as many reference modules), 100 functions each
RUNS = 5
VALIDATE_TARGET_S = 1.5
STARTUP_TARGET_RATIO = 2.0
SCHEMA = Path(__file__).resolve().parents[1] / "nkibuild" / "manifest" / "nkibuild.schema.json"

BASELINE = """\
import json, sys
import jsonschema, yaml
with open(sys.argv[1], "rb") as manifest:
    data = yaml.load(manifest, Loader=yaml.CSafeLoader)
with open(sys.argv[2]) as schema:
    jsonschema.Draft202012Validator(json.load(schema)).validate(data)
"""


def write_project(root: Path) -> int:
    """A manifest of KERNELS kernels and their sources; returns its build units."""
    kernels = root / "kernels"
    kernels.mkdir(parents=True)
    for index in range(FILES):
        functions = [f"k{n:04d}" for n in range(index, KERNELS, FILES)]
        body = "".join(
            f"\n\ndef {name}(x, y, alpha):\n    return alpha * x + y\n" for name in functions
        )
        (kernels / f"jax{index}.py").write_text('"""Kernels."""' + body)
        (kernels / f"ref{index}.py").write_text('"""References."""' + body)
    lines = [
        "format-version: 1",
        "package: {name: bench-kernels, version: 1.0.0}",
        f"defaults: {{targets: [{', '.join(TARGETS)}], optlevel: 2}}",
        "kernels:",
    ]
    variants = ", ".join(f"v{v}: {{x: [{128 * (v + 1)}, 512]}}" for v in range(VARIANTS))
    for n in range(KERNELS):
        lines += [
            f"  k{n:04d}:",
            "    frontend: jax",
            f"    source: kernels/jax{n % FILES}.py:k{n:04d}",
            f"    reference: kernels/ref{n % FILES}.py:k{n:04d}",
            "    inputs: {x: {shape: [128, 512], dtype: float32}, "
            "y: {shape: [128, 512], dtype: float32}}",
            "    constants: {alpha: 0.5}",
            f"    variants: {{{variants}}}",
        ]
    (root / "nkibuild.yaml").write_text("\n".join(lines) + "\n")
    return KERNELS * VARIANTS * len(TARGETS)


def timed(command: list[str], cwd: Path) -> tuple[float, str]:
    started = time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return elapsed, proc.stdout


def main() -> None:
    compile_nkibuild()
    python = sys.executable
    with tempfile.TemporaryDirectory(prefix="nkibuild-bench-") as scratch:
        root = Path(scratch)
        units = write_project(root)
        cold_build = root / "cold-build"

        def forget_the_plan() -> None:
            shutil.rmtree(cold_build, ignore_errors=True)

        # cold: a manifest validate has not seen (just edited, or a fresh CI checkout);
        # warm: unchanged since the last validate, plan or build (the plan cache).
        cold = [python, "-m", "nkibuild", "validate", "--build-dir", os.fspath(cold_build)]
        warm = [python, "-m", "nkibuild", "validate"]
        for command in (cold, warm):  # also warms the OS file cache
            _, output = timed(command, root)
            if f"{units} build units" not in output:
                sys.exit(f"validate did not see {units} units: {output}")
        baseline = [python, "-c", BASELINE, "nkibuild.yaml", os.fspath(SCHEMA)]
        help_command = [python, "-m", "nkibuild", "--help"]
        import_doit = [python, "-c", "import doit"]
        figures = interleaved_medians(
            [
                (cold, forget_the_plan),
                (warm, nothing),
                (baseline, nothing),
                (help_command, nothing),
                (import_doit, nothing),
            ],
            root,
            dict(os.environ),
            RUNS,
        )
        (cold_s, cold_rss, _), (warm_s, warm_rss, _) = figures[:2]
        baseline_s, help_s, doit_s = (seconds for seconds, _, _ in figures[2:])
    print(f"nkibuild validate, {units:,} units, medians of {RUNS} (load {load()}):")
    print(f"nkibuild validate, cold:               {cold_s:.3f} s, peak RSS {cold_rss:.0f} MiB")
    print(f"nkibuild validate, plan cached:        {warm_s:.3f} s, peak RSS {warm_rss:.0f} MiB")
    print(f"CSafeLoader + jsonschema (baseline):   {baseline_s:.3f} s")
    print(f"nkibuild --help:                       {help_s:.3f} s")
    print(f'python -c "import doit":               {doit_s:.3f} s')
    result = {
        "benchmark": "validate_scale",
        "ratio": round(cold_s / baseline_s, 3),
        "baseline": "fresh python: yaml.CSafeLoader + jsonschema against nkibuild's schema",
        "target": f"validate_seconds <= {VALIDATE_TARGET_S}, "
        f"help_startup_ratio <= {STARTUP_TARGET_RATIO}, peak RSS <= {RSS_TARGET_MIB} MiB",
        "units": units,
        "validate_seconds": round(cold_s, 3),
        "validate_cached_seconds": round(warm_s, 3),
        "baseline_seconds": round(baseline_s, 3),
        "help_seconds": round(help_s, 3),
        "import_doit_seconds": round(doit_s, 3),
        "help_startup_ratio": round(help_s / doit_s, 3),
        "peak_rss_mib": round(cold_rss, 1),
        "peak_rss_mib_plan_cached": round(warm_rss, 1),
        "load": load(),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
