"""Packing a bundle of 40 x 1 MB NEFFs: nkibuild's wheel writer vs plain `zipfile`.

NEFF payloads are gzip archives, so their bytes do not compress further; here each
NEFF is 1 MB of random bytes (as incompressible as real payloads). nkibuild's writer
(`nkibuild.bundle.wheel.build_wheel`: sorted entries, fixed timestamps, every file's
sha256 checked against the bundle's record and written to RECORD, deflate only when it
pays) is timed against writing the same
files with `zipfile` and ZIP_STORED (the fastest possible archive of these bytes,
without RECORD), and against ZIP_DEFLATED (what flit_core and hatchling do for every
file). Interleaved runs in one process, median of RUNS.
The last line is a JSON object; `ratio` = nkibuild / plain stored zipfile (target <= 1.2).
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

from nkibuild.bundle import BundleProject
from nkibuild.bundle.wheel import build_wheel
from nkibuild.manifest.model import Package

NEFFS = 40
NEFF_BYTES = 1 << 20
RUNS = 7
PACKAGE = Package(name="pack-bench", version="1.0.0", import_name="pack_bench")


def make_bundle(root: Path) -> BundleProject:
    package_dir = root / PACKAGE.import_name
    files = {
        "__init__.py": b'"""Benchmark bundle."""\n',
        "_build.json": json.dumps({"requirements": ["numpy"], "kernels": {}}).encode(),
    }
    files.update({f"neff/trn2/k{i:02d}/default.neff": os.urandom(NEFF_BYTES) for i in range(NEFFS)})
    for relative, data in files.items():
        path = package_dir / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    # With their sha256, as the bundle stage records them: the writer checks each file.
    listed = tuple(
        sorted(
            (f"{PACKAGE.import_name}/{name}", hashlib.sha256(data).hexdigest())
            for name, data in files.items()
        )
    )
    return BundleProject(root, PACKAGE, listed, {"requirements": ["numpy"], "kernels": {}})


def plain_zip(bundle: BundleProject, target: Path, compression: int) -> None:
    with zipfile.ZipFile(target, "w", compression=compression) as archive:
        for relative, _ in bundle.files:
            archive.write(bundle.directory / relative, relative)


def median_times(runners: dict[str, Callable[[], None]]) -> dict[str, float]:
    samples: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(RUNS):
        for name, run in runners.items():
            started = time.perf_counter()
            run()
            samples[name].append(time.perf_counter() - started)
    return {name: statistics.median(times) for name, times in samples.items()}


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="nkibuild-bench-") as scratch:
        base = Path(scratch)
        bundle = make_bundle(base / "bundle")
        out = base / "out"
        out.mkdir()
        times = median_times(
            {
                "nkibuild": lambda: build_wheel(bundle, out),
                "stored": lambda: plain_zip(bundle, out / "stored.zip", zipfile.ZIP_STORED),
                "deflated": lambda: plain_zip(bundle, out / "deflated.zip", zipfile.ZIP_DEFLATED),
            }
        )
        sizes = {
            "nkibuild": (out / "pack_bench-1.0.0-py3-none-any.whl").stat().st_size,
            "stored": (out / "stored.zip").stat().st_size,
            "deflated": (out / "deflated.zip").stat().st_size,
        }
    megabytes = {name: size / 1e6 for name, size in sizes.items()}
    for name in times:
        print(f"{name:9s} {times[name] * 1000:7.1f} ms  {megabytes[name]:.2f} MB")
    result = {
        "benchmark": "wheel_pack",
        "ratio": round(times["nkibuild"] / times["stored"], 3),
        "baseline": "zipfile, ZIP_STORED, same 40 x 1 MB files, same process",
        "target": "<= 1.2",
        "ratio_vs_deflate": round(times["nkibuild"] / times["deflated"], 3),
        "deflate_vs_stored": round(times["deflated"] / times["stored"], 2),
        "wheel_mb": round(megabytes["nkibuild"], 2),
        "deflated_mb": round(megabytes["deflated"], 2),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
