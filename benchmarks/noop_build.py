"""No-op build of 1,000 build units: `nkibuild build` vs a hand-written dodo.py on plain doit.

Both sides declare the same tasks (500 extract, 1,000 compile, bundle, wheel) with
the same file_dep/targets/config_changed, are fully built once, and are then timed
doing nothing (everything up to date), as whole processes, median of several runs.
The last line is a JSON object; `ratio` = nkibuild / plain doit (target <= 1.0).
"""

from __future__ import annotations

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

from nkibuild.graph.uptodate import STAMP_FILE

KERNELS = 500
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
B = os.path.abspath("plain-build")


def touch(*paths):
    for path in paths:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as handle:
            handle.write(path)


def task_extract():
    for kernel in KERNELS:
        out = f"{{B}}/extract/{{kernel}}/default"
        config = {{"frontend": "hlo", "source": "kernels/k.pb", "inputs": [[64, 1024]]}}
        yield {{
            "name": f"{{kernel}}/default",
            "actions": [(touch, (f"{{out}}/model.hlo_module.pb", f"{{out}}/artifact.json"))],
            "file_dep": [os.path.abspath("kernels/k.pb")],
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


def write_project(root: Path) -> list[str]:
    kernels = [f"k{index:04d}" for index in range(KERNELS)]
    (root / "kernels").mkdir(parents=True)
    shutil.copyfile(HLO, root / "kernels" / "k.pb")
    lines = [
        "format-version: 1",
        "package: {name: bench-kernels, version: 1.0.0}",
        f"defaults: {{targets: [{', '.join(TARGETS)}]}}",
        "kernels:",
    ]
    for kernel in kernels:
        lines += [
            f"  {kernel}:",
            "    frontend: hlo",
            "    source: kernels/k.pb",
            "    inputs: {logits: {shape: [64, 1024], dtype: float32}}",
        ]
    (root / "nkibuild.yaml").write_text("\n".join(lines) + "\n")
    (root / "dodo.py").write_text(DODO.format(kernels=kernels, targets=TARGETS))
    return kernels


def timed(command: list[str], cwd: Path, env: dict[str, str]) -> float:
    started = time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return elapsed


def interleaved_medians(
    commands: list[tuple[list[str], Callable[[], None]]], cwd: Path, env: dict[str, str]
) -> list[float]:
    """Alternate the commands run by run, so background load hits every side alike."""
    samples: list[list[float]] = [[] for _ in commands]
    for _ in range(RUNS):
        for (command, prepare), times in zip(commands, samples, strict=True):
            prepare()
            times.append(timed(command, cwd, env))
    return [statistics.median(times) for times in samples]


def nothing() -> None:
    pass


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="nkibuild-bench-") as scratch:
        root = Path(scratch) / "project"
        write_project(root)
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

        noop_nkibuild, noop_doit_path, noop_plain, noop_plain_sqlite = interleaved_medians(
            [
                (nkibuild, nothing),
                (nkibuild, drop_proof),
                (plain, nothing),
                (plain_sqlite, nothing),
            ],
            root,
            env,
        )
    print(f"full build (1,000 units, -j2, fake compiler + cache): {full_build:.2f} s")
    print(f"no-op nkibuild build:                 {noop_nkibuild:.3f} s (median of {RUNS})")
    print(
        f"no-op nkibuild build, doit deciding:  {noop_doit_path:.3f} s (up-to-date proof removed)"
    )
    print(f"no-op plain doit (default backend):   {noop_plain:.3f} s")
    print(f"no-op plain doit (sqlite3 backend):   {noop_plain_sqlite:.3f} s")
    result = {
        "benchmark": "noop_build",
        "ratio": round(noop_nkibuild / noop_plain, 3),
        "baseline": "hand-written dodo.py, same 1,502 tasks, plain doit (default backend)",
        "target": "<= 1.0",
        "units": KERNELS * len(TARGETS),
        "nkibuild_noop_s": round(noop_nkibuild, 3),
        "plain_doit_noop_s": round(noop_plain, 3),
        "ratio_vs_plain_doit_sqlite3": round(noop_nkibuild / noop_plain_sqlite, 3),
        "ratio_without_uptodate_proof": round(noop_doit_path / noop_plain, 3),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
