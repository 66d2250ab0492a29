"""Packing a bundle of 40 x 1 MB NEFFs: nkibuild's wheel writer vs plain `zipfile`.

The NEFFs are real containers from `nkibuild.toolchain_double.neff_writer.write_neff` (the writer of the
toolchain double): a 1 KB header, then a gzip'd tar whose one big member is 1 MB of
random bytes, standing in for compiled instructions and weights. Like a real NEFF, the
header compresses and the payload (almost all of the file) does not.

Timed, interleaved in one process, median of RUNS, on a bundle directory built by hand
(package code, `_build.json` and the NEFFs, with their sha256 as the bundle stage
records them):

- `nkibuild`: `nkibuild.bundle.wheel.build_wheel`, as the `wheel` task runs it: sorted
  entries, fixed timestamps, every file's sha256 checked against the bundle's record and
  written to RECORD, deflate only where a sample of the file shows it pays, then fsync
  and rename into place.
- `stored` (the baseline of `ratio`): the same wheel contents written with plain
  `zipfile`, as a minimal backend would: each file read whole, hashed for RECORD and
  written with `writestr`, ZIP_STORED; the same dist-info files; then one fsync, as
  durable as nkibuild's write (`ratio_without_fsync` compares the two without it). The
  benchmark checks that both archives hold the same bytes.
- `deflated`: the same with ZIP_DEFLATED at zlib's default level, as flit_core and
  hatchling write every file.
- informational: `nkibuild` with `os.fsync` stubbed out (the price of durability is
  the difference), and `zipfile.write`: `ZipFile.write(path)` of the files alone, the
  obvious call, which copies in 8 KiB chunks.

The last line is a JSON object; `ratio` = nkibuild / stored (target <= 1.2).
"""

from __future__ import annotations

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
from unittest import mock

from nkibuild.bundle import BundleProject
from nkibuild.bundle.buildinfo import BuildInfo
from nkibuild.bundle.wheel import build_wheel
from nkibuild.manifest.model import Package
from nkibuild.toolchain_double.neff_writer import NeffTensor, write_neff

NEFFS = 40
PAYLOAD_BYTES = 1 << 20
RUNS = 11
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


def write_neffs(package_dir: Path) -> list[Path]:
    inputs = [NeffTensor("x", "float32", (128, 512))]
    outputs = [NeffTensor("out", "float32", (128, 512))]
    paths = []
    for index in range(NEFFS):
        path = package_dir / "neff" / "trn2" / f"k{index:02d}" / "default.neff"
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


def make_bundle(root: Path) -> BundleProject:
    package_dir = root / PACKAGE.import_name
    package_dir.mkdir(parents=True)
    (package_dir / "__init__.py").write_text('"""Benchmark bundle."""\n')
    (package_dir / "_build.json").write_text(BUILD_INFO.to_text())
    paths = [package_dir / "__init__.py", package_dir / "_build.json", *write_neffs(package_dir)]
    # With their sha256, as the bundle stage records them: the writer checks each file.
    listed = tuple(
        sorted(
            (path.relative_to(root).as_posix(), hashlib.sha256(path.read_bytes()).hexdigest())
            for path in paths
        )
    )
    return BundleProject(root, PACKAGE, listed, BUILD_INFO, requirements=BUILD_INFO.requirements)


def dist_info(wheel: Path) -> tuple[str, dict[str, bytes]]:
    """The RECORD name and the other dist-info members of nkibuild's wheel, to write the
    same metadata from the baseline."""
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if ".dist-info/" in n]
        record = next(n for n in names if n.endswith("/RECORD"))
        return record, {n: archive.read(n) for n in names if n != record}


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def plain_wheel(
    bundle: BundleProject,
    metadata: tuple[str, dict[str, bytes]],
    target: Path,
    compression: int,
    durable: bool = True,
) -> None:
    record_name, generated = metadata
    record = []
    with zipfile.ZipFile(target, "w", compression=compression) as archive:
        for relative, _ in bundle.files:
            data = (bundle.directory / relative).read_bytes()
            archive.writestr(relative, data)
            record.append(record_line(relative, data))
        for name, data in generated.items():
            archive.writestr(name, data)
            record.append(record_line(name, data))
        archive.writestr(record_name, "\n".join([*record, f"{record_name},,"]) + "\n")
    if durable:
        with open(target, "rb+") as handle:
            os.fsync(handle.fileno())


def zipfile_write(bundle: BundleProject, target: Path) -> None:
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_STORED) as archive:
        for relative, _ in bundle.files:
            archive.write(bundle.directory / relative, relative)


def without_fsync(bundle: BundleProject, dist_dir: Path) -> None:
    with mock.patch("os.fsync"):
        build_wheel(bundle, dist_dir)


def same_contents(first: Path, second: Path) -> bool:
    with zipfile.ZipFile(first) as one, zipfile.ZipFile(second) as other:
        names = sorted(one.namelist())
        return names == sorted(other.namelist()) and all(
            one.read(n) == other.read(n) for n in names
        )


def median_times(runners: dict[str, Callable[[], object]]) -> dict[str, float]:
    samples: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(RUNS):
        for name, run in runners.items():  # interleaved: drifts hit every writer alike
            started = time.perf_counter()
            run()
            samples[name].append(time.perf_counter() - started)
    return {name: statistics.median(times) for name, times in samples.items()}


def measure(base: Path) -> tuple[dict[str, float], dict[str, float]]:
    """Median seconds and archive megabytes of each writer."""
    bundle = make_bundle(base / "bundle")
    out, quick = base / "out", base / "no-fsync"
    wheel = build_wheel(bundle, out)
    metadata = dist_info(wheel)
    archives = {"nkibuild": wheel, "nkibuild, no fsync": quick / wheel.name}
    names = ("stored", "stored, no fsync", "deflated", "zipfile.write")
    archives |= {name: out / f"{name}.zip" for name in names}
    times = median_times(
        {
            "nkibuild": lambda: build_wheel(bundle, out),
            "stored": lambda: plain_wheel(bundle, metadata, archives["stored"], zipfile.ZIP_STORED),
            "deflated": lambda: plain_wheel(
                bundle, metadata, archives["deflated"], zipfile.ZIP_DEFLATED
            ),
            "nkibuild, no fsync": lambda: without_fsync(bundle, quick),
            "stored, no fsync": lambda: plain_wheel(
                bundle, metadata, archives["stored, no fsync"], zipfile.ZIP_STORED, durable=False
            ),
            "zipfile.write": lambda: zipfile_write(bundle, archives["zipfile.write"]),
        }
    )
    if not same_contents(wheel, archives["stored"]):
        raise SystemExit("the baseline does not write the same wheel contents")
    return times, {name: path.stat().st_size / 1e6 for name, path in archives.items()}


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="nkibuild-bench-") as scratch:
        times, megabytes = measure(Path(scratch))
    for name, seconds in times.items():
        print(f"{name:18s} {seconds * 1000:7.1f} ms  {megabytes[name]:.2f} MB")
    result = {
        "benchmark": "wheel_pack",
        "ratio": round(times["nkibuild"] / times["stored"], 3),
        "baseline": "plain zipfile wheel (writestr, ZIP_STORED, RECORD hashed, fsync), "
        "same 40 x 1 MB NEFFs and metadata, same process",
        "target": "<= 1.2",
        "ratio_vs_deflate": round(times["nkibuild"] / times["deflated"], 3),
        "ratio_without_fsync": round(times["nkibuild, no fsync"] / times["stored, no fsync"], 3),
        "ratio_vs_zipfile_write": round(times["nkibuild"] / times["zipfile.write"], 3),
        "nkibuild_ms": round(times["nkibuild"] * 1000, 1),
        "stored_ms": round(times["stored"] * 1000, 1),
        "deflated_ms": round(times["deflated"] * 1000, 1),
        "wheel_mb": round(megabytes["nkibuild"], 2),
        "deflated_mb": round(megabytes["deflated"], 2),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
