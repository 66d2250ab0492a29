"""The wheel writer on hand-made bundles: one layout whatever the host, RECORD a reader
can trust, SOURCE_DATE_EPOCH honoured, a bundle file changed after generation refused,
and the wheel in dist/ replaced only by a complete one."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from nkibuild.bundle import BundleProject
from nkibuild.bundle.wheel import build_wheel, source_epoch, wheel_file_name
from nkibuild.errors import BuildError, UsageError
from nkibuild.fsutil import LEFTOVER_PATTERNS, leftovers
from nkibuild.manifest.model import Package

PACKAGE = Package(name="upd-kernels", version="1.0.0", import_name="upd_kernels")
DIST_INFO = "upd_kernels-1.0.0.dist-info"
RECORD = f"{DIST_INFO}/RECORD"
NEFFS = [f"upd_kernels/neff/k{number:02d}/default.neff" for number in range(6)]
FILES = {
    "upd_kernels/__init__.py": b'"""Kernels."""\n' * 20,
    "upd_kernels/_build.json": b'{"kernels": {}}\n' * 50,
    "upd_kernels/odd, name.txt": b"a name RECORD must quote\n",
    **{name: name.encode() * 300 for name in NEFFS},
}


def project(directory: Path, files: dict[str, bytes] = FILES) -> BundleProject:
    """A bundle tree as the bundle stage leaves it; its files listed in the opposite
    order, as `load_bundle` need not sort them."""
    for name, data in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(data)
    recorded = tuple((n, hashlib.sha256(d).hexdigest()) for n, d in reversed(files.items()))
    return BundleProject(directory, PACKAGE, recorded, None, requirements=("numpy",))


def written(directory: Path, dist: Path, files: dict[str, bytes] = FILES) -> bytes:
    return build_wheel(project(directory, files), dist).read_bytes()


def test_members_are_sorted_dated_and_neffs_stored(tmp_path: Path) -> None:
    wheel = build_wheel(project(tmp_path / "bundle"), tmp_path / "dist")
    assert wheel == tmp_path / "dist" / wheel_file_name(PACKAGE)
    with zipfile.ZipFile(wheel) as archive:
        assert archive.testzip() is None
        infos = archive.infolist()
    names = [info.filename for info in infos]
    dist_info = [f"{DIST_INFO}/{n}" for n in ("METADATA", "WHEEL", "entry_points.txt")]
    assert names == [*sorted(FILES), *sorted(dist_info), RECORD]
    for info in infos:
        neff = info.filename.endswith(".neff")
        assert info.compress_type == (zipfile.ZIP_STORED if neff else zipfile.ZIP_DEFLATED)
        assert info.date_time == (1980, 1, 1, 0, 0, 0)
        assert (info.create_system, info.external_attr >> 16) == (3, 0o644)


def test_record_lists_every_member_with_its_sha256_and_size(tmp_path: Path) -> None:
    wheel = build_wheel(project(tmp_path / "bundle"), tmp_path / "dist")
    with zipfile.ZipFile(wheel) as archive:
        rows = list(csv.reader(io.StringIO(archive.read(RECORD).decode())))
        contents = {name: archive.read(name) for name in archive.namelist()}
    assert [row[0] for row in rows] == list(contents)  # a name with a comma stays one field
    assert rows[-1] == [RECORD, "", ""]
    for name, digest, size in rows[:-1]:
        expected = base64.urlsafe_b64encode(hashlib.sha256(contents[name]).digest())
        assert digest == f"sha256={expected.rstrip(b'=').decode()}"
        assert int(size) == len(contents[name])
    assert {name: contents[name] for name in FILES} == FILES


def test_equal_bundles_give_equal_bytes_whatever_the_host_and_file_stats(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another directory, other file modes and times, another time zone, a Windows host
    (zipfile's default creating system): the same wheel."""
    reference = written(tmp_path / "a", tmp_path / "dist-a")
    assert written(tmp_path / "a", tmp_path / "dist-a") == reference  # written again
    other = project(tmp_path / "b")
    for number, name in enumerate(FILES):
        os.chmod(other.directory / name, 0o600 if number % 2 else 0o755)
        os.utime(other.directory / name, (1_600_000_000 + number, 1_600_000_000 + number))
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    monkeypatch.setattr(sys, "platform", "win32")
    try:
        assert build_wheel(other, tmp_path / "dist-b").read_bytes() == reference
    finally:
        monkeypatch.undo()
        time.tzset()


def test_source_date_epoch_dates_every_member(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    default = written(tmp_path / "bundle", tmp_path / "default")
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")  # 2023-11-14 22:13:20 UTC
    dated = build_wheel(project(tmp_path / "bundle"), tmp_path / "dated")
    with zipfile.ZipFile(dated) as archive:
        assert {info.date_time for info in archive.infolist()} == {(2023, 11, 14, 22, 13, 20)}
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "86400")  # before 1980: a zip's first date
    assert written(tmp_path / "bundle", tmp_path / "early") == default


@pytest.mark.parametrize(
    ("value", "message"),
    [("yesterday", "is not a whole number"), ("1e9", "is not a whole number"), ("9" * 20, "2107")],
)
def test_a_bad_source_date_epoch_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, value: str, message: str
) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", value)
    with pytest.raises(UsageError, match=f"SOURCE_DATE_EPOCH=.*{message}"):
        source_epoch()


def refused_keeps_the_previous_wheel(bundle: BundleProject, dist: Path, match: str) -> None:
    wheel = dist / wheel_file_name(PACKAGE)
    before = wheel.read_bytes()
    with pytest.raises(BuildError, match=match):
        build_wheel(bundle, dist)
    assert wheel.read_bytes() == before
    assert [path.name for path in dist.iterdir()] == [wheel.name]  # no temp file left


def test_a_bundle_file_edited_after_generation_is_refused(tmp_path: Path) -> None:
    written(tmp_path / "before", tmp_path / "dist")
    bundle = project(tmp_path / "after", FILES | {NEFFS[3]: b"new kernel\n"})
    (bundle.directory / NEFFS[3]).write_bytes(b"edited by hand\n")
    match = r"k03/default\.neff changed after the bundle was generated"
    refused_keeps_the_previous_wheel(bundle, tmp_path / "dist", match)


def test_a_bundle_file_removed_after_generation_is_refused(tmp_path: Path) -> None:
    written(tmp_path / "before", tmp_path / "dist")
    bundle = project(tmp_path / "after")
    (bundle.directory / NEFFS[0]).unlink()
    match = r"k00/default\.neff was removed after the bundle was generated"
    refused_keeps_the_previous_wheel(bundle, tmp_path / "dist", match)


def test_a_recorded_sha256_that_is_no_digest_is_refused(tmp_path: Path) -> None:
    written(tmp_path / "before", tmp_path / "dist")
    bundle = project(tmp_path / "after")
    files = tuple((n, "" if n == NEFFS[1] else sha) for n, sha in bundle.files)
    bundle = BundleProject(bundle.directory, PACKAGE, files, None)
    refused_keeps_the_previous_wheel(bundle, tmp_path / "dist", r"k01/default\.neff changed")


KILLED_MID_WRITE = """\
import os, signal, sys, zipfile
from pathlib import Path
from nkibuild.bundle import BundleProject
from nkibuild.bundle.wheel import build_wheel
from nkibuild.manifest.model import Package

writestr = zipfile.ZipFile.writestr
def killed_at_the_third(archive, info, *args):
    if len(archive.infolist()) == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return writestr(archive, info, *args)

zipfile.ZipFile.writestr = killed_at_the_third
package = Package(name="upd-kernels", version="1.0.0", import_name="upd_kernels")
root = Path(sys.argv[1])
files = tuple(tuple(line.rsplit(" ", 1)) for line in sys.argv[2:])
build_wheel(BundleProject(root, package, files, None), root.parent / "dist")
"""


def test_a_write_killed_midway_leaves_the_previous_wheel(tmp_path: Path) -> None:
    """SIGKILL while the new wheel is half written: dist/ keeps the whole previous
    wheel under its name; what is left beside it is a temp file the next build sweeps."""
    wheel = tmp_path / "dist" / wheel_file_name(PACKAGE)
    before = written(tmp_path / "before", tmp_path / "dist")
    bundle = project(tmp_path / "bundle", FILES | {NEFFS[4]: b"new kernel\n"})
    listed = [f"{name} {sha}" for name, sha in bundle.files]
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_MID_WRITE, str(bundle.directory), *listed],
        capture_output=True,
        text=True,
        check=False,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert wheel.read_bytes() == before
    beside = sorted(set((tmp_path / "dist").iterdir()) - {wheel})
    assert len(beside) == 1 and beside == leftovers(tmp_path / "dist", LEFTOVER_PATTERNS)
    assert build_wheel(bundle, tmp_path / "dist").read_bytes() != before
