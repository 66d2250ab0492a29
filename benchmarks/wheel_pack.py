"""Packing a bundle of 40 x 1 MB NEFFs: nkibuild's wheel writer vs a plain `zipfile` one.

The NEFFs are real containers from `nkibuild.toolchain_double.neff_writer.write_neff`: a
1 KB header, then a gzip'd tar whose one big member is 1 MB of random bytes, standing in
for compiled instructions and weights (like a real NEFF's payload, it does not compress).

Timed, interleaved in one process, median of RUNS, on a bundle directory built by hand
(package code, `_build.json` and the NEFFs, listed with their sha256 as the bundle stage
records them):

- `nkibuild`: `nkibuild.bundle.wheel.build_wheel`, as the `wheel` task runs it: every
  file read and checked against its recorded sha256, sorted members with fixed dates,
  NEFFs stored and the rest deflated, RECORD, then fsync and rename into place.
- `plain` (the baseline of `ratio`): what a competent user writes with `zipfile` for the
  same wheel: each file read whole, hashed for RECORD and added with `writestr` (NEFFs
  ZIP_STORED, the rest ZIP_DEFLATED), the same dist-info files, into a temp file that is
  fsynced and renamed over the wheel: as durable and atomic as nkibuild's write. The
  benchmark checks that both archives hold the same contents.

`units` is the number of NEFFs. The last line is a JSON object; `ratio` = nkibuild /
plain (target <= 1.2).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import statistics
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

from installed_bytecode import compile_nkibuild

from nkibuild.bundle import BundleProject
from nkibuild.bundle.buildinfo import BuildInfo
from nkibuild.bundle.wheel import build_wheel, dist_info_files
from nkibuild.manifest.model import Package
from nkibuild.toolchain_double.neff_writer import NeffTensor, write_neff

PAYLOAD_BYTES = 1 << 20
PACKAGE = Package(name="pack-bench", version="1.0.0", import_name="pack_bench")
BUILD_INFO = BuildInfo(
    package=PACKAGE.name,
    version=PACKAGE.version,
    nkibuild_version="bench",
    compiler_versions=(),
    placeholder=False,
    neuron_sdk=None,
    requirements=("numpy",),
    split_targets=(),
    kernels={},
)


def write_neffs(package_dir: Path, count: int) -> list[Path]:
    inputs = [NeffTensor("x", "float32", (128, 512))]
    outputs = [NeffTensor("out", "float32", (128, 512))]
    paths = []
    for index in range(count):
        path = package_dir / "neff" / "trn2" / f"k{index:03d}" / "default.neff"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_neff(
            path,
            compiler_version="2.23.0.0",
            inputs=inputs,
            outputs=outputs,
            num_tpb=2,
            placeholder=False,
            extra_members={"sg00/instructions.bin": os.urandom(PAYLOAD_BYTES)},
        )
        paths.append(path)
    return paths


def make_bundle(root: Path, neffs: int) -> BundleProject:
    package_dir = root / PACKAGE.import_name
    package_dir.mkdir(parents=True)
    (package_dir / "__init__.py").write_text('"""Benchmark bundle."""\n')
    (package_dir / "_build.json").write_text(BUILD_INFO.to_text())
    paths = [package_dir / "__init__.py", package_dir / "_build.json"]
    paths += write_neffs(package_dir, neffs)
    listed = tuple(
        sorted(
            (path.relative_to(root).as_posix(), hashlib.sha256(path.read_bytes()).hexdigest())
            for path in paths
        )
    )
    return BundleProject(root, PACKAGE, listed, BUILD_INFO, requirements=BUILD_INFO.requirements)


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def plain_wheel(bundle: BundleProject, wheel: Path) -> None:
    """The baseline writer."""
    dist_info, generated = dist_info_files(bundle)
    record_name = f"{dist_info}/RECORD"
    record = []
    temp = wheel.with_name(f".{wheel.name}.tmp")
    with zipfile.ZipFile(temp, "w") as archive:
        members = [(name, (bundle.directory / name).read_bytes()) for name, _ in bundle.files]
        for name, data in [*members, *sorted(generated.items())]:
            stored = name.endswith(".neff")
            archive.writestr(name, data, zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED)
            record.append(record_line(name, data))
        archive.writestr(record_name, "\n".join([*record, f"{record_name},,"]) + "\n")
    with open(temp, "rb+") as handle:
        os.fsync(handle.fileno())
    os.replace(temp, wheel)


def same_contents(first: Path, second: Path) -> bool:
    with zipfile.ZipFile(first) as one, zipfile.ZipFile(second) as other:
        names = one.namelist()
        return names == other.namelist() and all(one.read(n) == other.read(n) for n in names)


def median_times(runners: dict[str, Callable[[], object]], runs: int) -> dict[str, float]:
    samples: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(runs):
        for name, run in runners.items():  # interleaved: drifts hit every writer alike
            started = time.perf_counter()
            run()
            samples[name].append(time.perf_counter() - started)
    return {name: statistics.median(times) for name, times in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=40, help="NEFFs of 1 MB [default: 40]")
    parser.add_argument("--runs", type=int, default=11, help="timed runs of each [default: 11]")
    args = parser.parse_args()
    compile_nkibuild()
    with tempfile.TemporaryDirectory(prefix="nkibuild-bench-") as scratch:
        base = Path(scratch)
        bundle = make_bundle(base / "bundle", args.units)
        wheel = build_wheel(bundle, base / "dist")
        baseline = base / "plain" / wheel.name
        baseline.parent.mkdir()
        times = median_times(
            {
                "nkibuild": lambda: build_wheel(bundle, base / "dist"),
                "plain": lambda: plain_wheel(bundle, baseline),
            },
            args.runs,
        )
        if not same_contents(wheel, baseline):
            raise SystemExit("the baseline does not write the same wheel contents")
        megabytes = wheel.stat().st_size / 1e6
    for name, seconds in times.items():
        print(f"{name:9s} {seconds * 1000:7.1f} ms")
    result = {
        "benchmark": "wheel_pack",
        "ratio": round(times["nkibuild"] / times["plain"], 3),
        "baseline": "plain zipfile wheel (writestr, NEFFs stored, the rest deflated, RECORD "
        "hashed, fsync and rename), same members, same process, interleaved",
        "target": "<= 1.2",
        "units": args.units,
        "nkibuild_ms": round(times["nkibuild"] * 1000, 1),
        "plain_ms": round(times["plain"] * 1000, 1),
        "wheel_mb": round(megabytes, 2),
        "runs": args.runs,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
