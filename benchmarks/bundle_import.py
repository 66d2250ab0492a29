"""`import <bundle>` vs `import numpy`, each in a fresh interpreter.

A bundle of the examples' prebuilt-HLO kernel is built with the toolchain double;
then `python -c "import acme_bench"` and `python -c "import numpy"` are timed as
whole processes (interpreter start included on both sides), interleaved, median of
RUNS. Importing a bundle must load no kernel module, no NEFF, no runtime and not
even NumPy: the figure shows that promise holds.
The last line is a JSON object; `ratio` = bundle / numpy (target <= 1.1).
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
from pathlib import Path

RUNS = 21
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
MANIFEST = """\
format-version: 1
package: {name: acme-bench, version: 1.0.0}
defaults: {targets: [trn1, trn2]}
kernels:
  softmax:
    frontend: hlo
    source: kernels/softmax.hlo.pb
    reference: kernels/reference.py:softmax
    inputs: {logits: {shape: [64, 1024], dtype: float32}}
"""


def build_bundle(root: Path) -> Path:
    """The generated package directory, as `pip install` would lay it out."""
    (root / "kernels").mkdir(parents=True)
    for name in ("softmax.hlo.pb", "reference.py"):
        shutil.copyfile(EXAMPLES / "kernels" / name, root / "kernels" / name)
    (root / "nkibuild.yaml").write_text(MANIFEST)
    command = [sys.executable, "-m", "nkibuild", "build", "--toolchain", "fake", "--no-cache"]
    subprocess.run(command, cwd=root, check=True, capture_output=True, env=_env())
    return root / "build" / "bundle" / "acme-bench"


def _env(pythonpath: Path | None = None) -> dict[str, str]:
    env = {**os.environ, "CI": "true"}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return env


def timed_import(module: str, pythonpath: Path) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"import {module}"], check=True, env=_env(pythonpath))
    return time.perf_counter() - started


def loaded_by_import(pythonpath: Path) -> list[str]:
    script = (
        "import sys; before = set(sys.modules); import acme_bench; "
        "print(sorted(set(sys.modules) - before))"
    )
    output = subprocess.run(
        [sys.executable, "-c", script], check=True, env=_env(pythonpath), capture_output=True
    )
    return json.loads(output.stdout.decode().replace("'", '"'))


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="nkibuild-bench-") as scratch:
        bundle = build_bundle(Path(scratch) / "project")
        samples: dict[str, list[float]] = {"acme_bench": [], "numpy": []}
        for _ in range(RUNS):
            for module, times in samples.items():
                times.append(timed_import(module, bundle))
        bundle_s, numpy_s = (statistics.median(samples[m]) for m in ("acme_bench", "numpy"))
        modules = loaded_by_import(bundle)
    print(f"import acme_bench (fresh interpreter): {bundle_s * 1000:.1f} ms (median of {RUNS})")
    print(f"import numpy (fresh interpreter):      {numpy_s * 1000:.1f} ms")
    print(f"modules the bundle import loads: {', '.join(modules)}")
    result = {
        "benchmark": "bundle_import",
        "ratio": round(bundle_s / numpy_s, 3),
        "baseline": "python -c 'import numpy' in a fresh interpreter",
        "target": "<= 1.1",
        "bundle_import_ms": round(bundle_s * 1000, 1),
        "numpy_import_ms": round(numpy_s * 1000, 1),
        "imports_numpy": "numpy" in modules,
        "imports_spike": "spike" in modules,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
