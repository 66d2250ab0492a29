"""Updating a trusted wheel: runs of unchanged members are copied from the previous wheel
as byte ranges and only the rest is written, and the result is always byte for byte the
wheel a fresh write gives; a previous wheel that is damaged, truncated, from another date
or not trusted lends nothing (and never fails the write)."""

from __future__ import annotations

import hashlib
import zipfile
import zlib
from pathlib import Path

import pytest
from helpers import counted_member_copies

from nkibuild.bundle import BundleProject
from nkibuild.bundle import wheel as wheel_module
from nkibuild.bundle.wheel import Directory, build_wheel, wheel_file_name
from nkibuild.errors import BuildError
from nkibuild.fsutil import stat_stamp
from nkibuild.manifest.model import Package

PACKAGE = Package(name="upd-kernels", version="1.0.0", import_name="upd_kernels")
DIST_INFO = "upd_kernels-1.0.0.dist-info"
NAMES = [f"upd_kernels/neff/k{number:02d}/default.neff" for number in range(12)]


def contents(tag: str, names: list[str] = NAMES) -> dict[str, bytes]:
    return {name: f"{name} {tag}\n".encode() * 40 for name in names}


def project(directory: Path, files: dict[str, bytes]) -> BundleProject:
    for name, data in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(data)
    recorded = tuple(sorted((n, hashlib.sha256(d).hexdigest()) for n, d in files.items()))
    return BundleProject(directory, PACKAGE, recorded, None)


class Seen:
    """What an update did: the runs it copied (member names) and the members it wrote."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.runs: list[list[str]] = []
        self.written: list[str] = []
        copy_run, write_new = wheel_module._copy_run, wheel_module._write_new

        def counted_run(directory: Directory, run: range, *args: object) -> None:
            self.runs.append(directory.names[run.start : run.stop])
            copy_run(directory, run, *args)  # type: ignore[arg-type]

        def counted_write(output: object, name: str, *args: object) -> None:
            self.written.append(name)
            write_new(output, name, *args)  # type: ignore[arg-type]

        monkeypatch.setattr(wheel_module, "_copy_run", counted_run)
        monkeypatch.setattr(wheel_module, "_write_new", counted_write)


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> Seen:
    return Seen(monkeypatch)


def written_before(tmp_path: Path, files: dict[str, bytes]) -> Path:
    return build_wheel(project(tmp_path / "before", files), tmp_path / "dist")


def trusted(wheel: Path) -> dict[str, str]:
    """The writer's record for `wheel` as it is now: what `run` passes when it wrote it."""
    stamp = stat_stamp(wheel)
    assert stamp is not None
    return {wheel.name: stamp}


def updated(tmp_path: Path, files: dict[str, bytes], reuse: dict[str, str]) -> bytes:
    """The wheel written over the previous one with `reuse`; checked to be the fresh one."""
    after = project(tmp_path / "after", files)
    wheel = build_wheel(after, tmp_path / "dist", reuse=reuse).read_bytes()
    assert wheel == build_wheel(after, tmp_path / "fresh").read_bytes()
    assert [p.name for p in (tmp_path / "dist").iterdir()] == [wheel_file_name(PACKAGE)]
    return wheel


DIST_INFO_FILES = [f"{DIST_INFO}/{n}" for n in ("METADATA", "WHEEL", "entry_points.txt", "RECORD")]


def test_a_member_changed_in_the_middle_splits_the_copy_in_two_runs(
    tmp_path: Path, seen: Seen
) -> None:
    wheel = written_before(tmp_path, contents("old"))
    files = contents("old") | {NAMES[5]: b"new content\n"}
    seen.written.clear()
    updated(tmp_path, files, trusted(wheel))
    assert seen.runs == [NAMES[:5], NAMES[6:]]
    assert seen.written == [NAMES[5], *DIST_INFO_FILES]


def test_member_names_with_commas_keep_their_own_record_lines(tmp_path: Path, seen: Seen) -> None:
    # RECORD is not quoted: a name holding what looks like another line's fields must not
    # take that line (keyed by what precedes the last two fields, never by the first).
    plain = "upd_kernels/data/x"
    data = b"x data\n"
    lookalike = f"{plain},sha256={wheel_module._record_hash(hashlib.sha256(data).digest())},7"
    files = {plain: data, lookalike: b"other\n"}
    wheel = written_before(tmp_path, files)
    added = "upd_kernels/data/z"  # members added: matched by that key, not one by one
    seen.written.clear()
    updated(tmp_path, files | {lookalike: b"changed\n", added: b"z\n"}, trusted(wheel))
    assert seen.runs == [[plain]]
    assert seen.written[:2] == [lookalike, added]


def test_first_and_last_member_changed(tmp_path: Path, seen: Seen) -> None:
    wheel = written_before(tmp_path, contents("old"))
    files = contents("old") | {NAMES[0]: b"first\n", NAMES[-1]: b"last\n"}
    seen.written.clear()
    updated(tmp_path, files, trusted(wheel))
    assert seen.runs == [NAMES[1:-1]]
    assert seen.written == [NAMES[0], NAMES[-1], *DIST_INFO_FILES]


def test_members_added_and_removed(tmp_path: Path, seen: Seen) -> None:
    wheel = written_before(tmp_path, contents("old"))
    added = "upd_kernels/neff/k03a/default.neff"  # sorts between k03 and k04
    files = {n: d for n, d in contents("old").items() if n not in (NAMES[7], NAMES[8])}
    files[added] = b"added\n"
    seen.written.clear()
    updated(tmp_path, files, trusted(wheel))
    assert seen.runs == [NAMES[:4], NAMES[4:7], NAMES[9:]]
    assert seen.written == [added, *DIST_INFO_FILES]
    with zipfile.ZipFile(tmp_path / "dist" / wheel.name) as archive:
        assert archive.testzip() is None
        assert NAMES[7] not in archive.namelist() and archive.read(added) == b"added\n"
        assert archive.read(NAMES[9]) == contents("old")[NAMES[9]]


def test_nothing_changed_copies_every_member_in_one_run(tmp_path: Path, seen: Seen) -> None:
    wheel = written_before(tmp_path, contents("old"))
    before = wheel.read_bytes()
    seen.written.clear()
    assert updated(tmp_path, contents("old"), trusted(wheel)) == before
    assert seen.runs == [NAMES]


@pytest.mark.parametrize(
    ("second", "reused"), [(1_700_000_101, True), (1_700_000_102, False), (1_800_000_000, False)]
)
def test_another_source_date_epoch_reuses_only_what_has_the_same_zip_date(
    tmp_path: Path, seen: Seen, monkeypatch: pytest.MonkeyPatch, second: int, reused: bool
) -> None:
    """A ZIP date counts in two-second steps: 1_700_000_100 and _101 give equal headers."""
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000100")
    wheel = written_before(tmp_path, contents("old"))
    monkeypatch.setenv("SOURCE_DATE_EPOCH", str(second))
    seen.written.clear()
    updated(tmp_path, contents("old") | {NAMES[5]: b"new\n"}, trusted(wheel))
    assert seen.runs == ([NAMES[:5], NAMES[6:]] if reused else [])


def damage_truncated(data: bytes) -> bytes:
    return data[:-10]


def damage_directory_offset(data: bytes) -> bytes:
    damaged = bytearray(data)
    first = damaged.index(b"PK\x01\x02")  # the first central header's local offset: 42
    damaged[first + 42 : first + 46] = (len(data) - 10).to_bytes(4, "little")
    return bytes(damaged)


def damage_record(data: bytes) -> bytes:
    damaged = bytearray(data)
    record = damaged.rindex(f"{DIST_INFO}/RECORD".encode(), 0, damaged.index(b"PK\x01\x02"))
    damaged[record + 40] ^= 0xFF  # inside the RECORD's deflated bytes: CRC no longer matches
    return bytes(damaged)


def damage_end_record(data: bytes) -> bytes:
    return data[:-22] + b"PK\x05\x06" + b"\xff" * 18


def damage_central_name(data: bytes) -> bytes:
    """A name in the central directory no longer the one RECORD lists (same length)."""
    damaged = bytearray(data)
    first = damaged.index(b"PK\x01\x02")
    damaged[first + 46 + NAMES[0].index("k00")] = ord("x")
    return bytes(damaged)


def damage_name_flag(data: bytes) -> bytes:
    """An ASCII name flagged as UTF-8: a header this writer would not write."""
    damaged = bytearray(data)
    first = damaged.index(b"PK\x01\x02")
    damaged[first + 9] |= 0x08  # the high byte of the flags: 0x800
    return bytes(damaged)


def damage_not_a_zip(data: bytes) -> bytes:
    return b"PK\x03\x04 not a zip archive"


def damage_empty(data: bytes) -> bytes:
    return b""


@pytest.mark.parametrize(
    "damage",
    [
        damage_truncated,
        damage_directory_offset,
        damage_record,
        damage_end_record,
        damage_central_name,
        damage_name_flag,
        damage_not_a_zip,
        damage_empty,
    ],
)
def test_a_damaged_trusted_wheel_lends_no_run_and_the_wheel_is_still_right(
    tmp_path: Path, seen: Seen, damage: object
) -> None:
    """Even when its stat is the one recorded (a rewrite that kept it, a stale record)."""
    wheel = written_before(tmp_path, contents("old"))
    wheel.write_bytes(damage(wheel.read_bytes()))  # type: ignore[operator]
    updated(tmp_path, contents("old") | {NAMES[5]: b"new\n"}, trusted(wheel))
    assert seen.runs == []


def test_a_wheel_whose_stat_changed_is_not_updated_in_runs(tmp_path: Path, seen: Seen) -> None:
    wheel = written_before(tmp_path, contents("old"))
    reuse = trusted(wheel)
    wheel.write_bytes(wheel.read_bytes())  # same bytes, another stat
    updated(tmp_path, contents("old") | {NAMES[5]: b"new\n"}, reuse)
    assert seen.runs == []


def test_a_file_changed_after_the_bundle_leaves_the_previous_wheel(
    tmp_path: Path, seen: Seen
) -> None:
    wheel = written_before(tmp_path, contents("old"))
    before = wheel.read_bytes()
    after = project(tmp_path / "after", contents("old") | {NAMES[5]: b"new\n"})
    (after.directory / NAMES[5]).write_bytes(b"edited by hand\n")
    with pytest.raises(BuildError, match=r"k05/default.neff changed after the bundle"):
        build_wheel(after, tmp_path / "dist", reuse=trusted(wheel))
    assert wheel.read_bytes() == before
    assert [p.name for p in (tmp_path / "dist").iterdir()] == [wheel.name]


def test_zip64_end_records_past_the_member_count_limit(
    tmp_path: Path, seen: Seen, monkeypatch: pytest.MonkeyPatch
) -> None:
    """zipfile's limits made small: more members than an end record counts need ZIP64
    end records, read from the previous wheel and written as zipfile writes them."""
    monkeypatch.setattr(zipfile, "ZIP_FILECOUNT_LIMIT", 5)
    wheel = written_before(tmp_path, contents("old"))
    assert b"PK\x06\x06" in wheel.read_bytes()
    updated(tmp_path, contents("old") | {NAMES[5]: b"new\n"}, trusted(wheel))
    assert seen.runs == [NAMES[:5], NAMES[6:]]


def test_zip64_members_and_offsets_are_written_member_by_member(
    tmp_path: Path, seen: Seen, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past ZIP64_LIMIT, headers carry ZIP64 fields this update does not move: declined."""
    monkeypatch.setattr(zipfile, "ZIP64_LIMIT", 2000)
    files = contents("old") | {NAMES[2]: hashlib.sha512(b"x").digest() * 100}
    wheel = written_before(tmp_path, files)
    updated(tmp_path, files | {NAMES[5]: b"new\n"}, trusted(wheel))
    assert seen.runs == []


def test_a_wheel_growing_past_zip64_offsets_is_written_member_by_member(
    tmp_path: Path, seen: Seen, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The previous wheel fits the limit; the new one's later members do not."""
    wheel = written_before(tmp_path, contents("old"))
    monkeypatch.setattr(zipfile, "ZIP64_LIMIT", len(wheel.read_bytes()) - 200)
    bigger = {NAMES[0]: hashlib.sha512(b"x").digest() * 8}  # incompressible: moves the rest
    updated(tmp_path, contents("old") | bigger, trusted(wheel))  # as a fresh write
    assert seen.runs == [NAMES[1:]]  # tried, then declined: its offsets pass the limit


def test_names_that_are_not_ascii_are_updated_in_runs(tmp_path: Path, seen: Seen) -> None:
    """zipfile flags a non-ASCII name as UTF-8 and stores it so; the update reads it so."""
    names = sorted([*NAMES, "upd_kernels/neff/k03ü/default.neff", "upd_kernels/日本.txt"])
    wheel = written_before(tmp_path, contents("old", names))
    changed = "upd_kernels/neff/k03ü/default.neff"
    seen.written.clear()
    updated(tmp_path, contents("old", names) | {changed: b"new\n"}, trusted(wheel))
    at = names.index(changed)
    assert seen.runs == [names[:at], names[at + 1 :]]
    assert seen.written == [changed, *DIST_INFO_FILES]


@pytest.mark.parametrize("fails", ["missing", "refused"])
def test_runs_are_copied_through_memory_where_the_kernel_cannot(
    tmp_path: Path, seen: Seen, monkeypatch: pytest.MonkeyPatch, fails: str
) -> None:
    """No copy_file_range (not Linux), or one the file system refuses: the same wheel."""
    wheel = written_before(tmp_path, contents("old"))
    if fails == "missing":
        monkeypatch.delattr(wheel_module.os, "copy_file_range", raising=False)
    else:

        def refused(*args: object) -> int:
            raise OSError(18, "Invalid cross-device link")

        monkeypatch.setattr(wheel_module.os, "copy_file_range", refused, raising=False)
    updated(tmp_path, contents("old") | {NAMES[5]: b"new\n"}, trusted(wheel))
    assert seen.runs == [NAMES[:5], NAMES[6:]]


def test_record_hashes_of_many_digests_are_each_one_encoded_alone() -> None:
    digests = [hashlib.sha256(str(number).encode()).digest() for number in range(300)]
    hexdigests = [digest.hex() for digest in digests]
    expected = [wheel_module._record_hash(digest) for digest in digests]
    assert wheel_module._record_hashes(hexdigests) == expected
    # A value that is no sha256 in hex gets a hash no RECORD line holds; the rest theirs.
    odd = [hexdigests[0], "", "zz" * 32, hexdigests[1][:-2], " " + hexdigests[2][1:], hexdigests[3]]
    hashes = wheel_module._record_hashes(odd)
    assert [hashes[0], hashes[-1]] == [expected[0], expected[3]]
    assert all("," in h for h in hashes[1:-1])
    # One digest a byte long and the next a byte short: as many bytes, none shifted.
    shifted = [hexdigests[0] + "ab", hexdigests[1], hexdigests[2][:-2], hexdigests[3]]
    hashes = wheel_module._record_hashes(shifted)
    assert hashes[1] == expected[1] and hashes[3] == expected[3]
    assert "," in hashes[0] and "," in hashes[2]


def test_a_bundle_record_that_is_no_sha256_is_refused_not_copied(tmp_path: Path) -> None:
    wheel = written_before(tmp_path, contents("old"))
    after = project(tmp_path / "after", contents("old"))
    files = dict(after.files) | {NAMES[3]: "not-a-digest"}
    after = BundleProject(after.directory, PACKAGE, tuple(sorted(files.items())), None)
    with pytest.raises(BuildError, match=r"k03/default.neff changed after the bundle"):
        build_wheel(after, tmp_path / "dist", reuse=trusted(wheel))


def big_text(tag: str) -> bytes:
    """Compressible content past FAST_DEFLATE_BYTES, as `_build.json` is for many kernels."""
    return b"".join(
        b'{"kernel": "k%05d", "tag": "%s"},\n' % (n, tag.encode()) for n in range(40_000)
    )


def stored_bytes(wheel: Path, name: str) -> bytes:
    with zipfile.ZipFile(wheel) as archive:
        info = archive.getinfo(name)
    data = wheel.read_bytes()
    start = info.header_offset + 30 + len(info.filename.encode())
    return data[start : start + info.compress_size]


def deflated(data: bytes, level: int) -> bytes:
    compressor = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


def test_a_big_file_is_deflated_at_the_fastest_level_and_a_small_one_at_the_default(
    tmp_path: Path,
) -> None:
    big = big_text("old")
    assert len(big) >= wheel_module.FAST_DEFLATE_BYTES
    wheel = written_before(tmp_path, contents("old") | {NAMES[0]: big})
    assert stored_bytes(wheel, NAMES[0]) == deflated(big, 1) != deflated(big, 6)
    assert stored_bytes(wheel, NAMES[1]) == deflated(contents("old")[NAMES[1]], 6)


def test_an_untrusted_wheel_lends_no_big_deflated_member(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wheel of another writer that deflated a big file at zlib's default level: its
    stream unpacks to the right content but is not the one this writer writes."""
    files = contents("old") | {NAMES[0]: big_text("old")}
    with monkeypatch.context() as other_writer:
        other_writer.setattr(wheel_module, "FAST_DEFLATE_LEVEL", 6)
        wheel = written_before(tmp_path, files)
    assert stored_bytes(wheel, NAMES[0]) == deflated(files[NAMES[0]], 6)
    copied = counted_member_copies(monkeypatch)
    updated(tmp_path, files | {NAMES[5]: b"new\n"}, {})  # no stat recorded: untrusted
    assert copied == [n for n in NAMES if n not in (NAMES[0], NAMES[5])]
