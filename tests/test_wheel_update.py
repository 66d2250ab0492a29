"""Updating a trusted wheel: runs of unchanged members are copied from the previous wheel
as byte ranges and only the rest is written, and the result is always byte for byte the
wheel a fresh write gives; a previous wheel that is damaged, truncated, from another date
or not trusted lends nothing (and never fails the write)."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import itertools
import os
import zipfile
import zlib
from pathlib import Path

import pytest
from helpers import build, counted_member_copies, module, prebuilt_project

from nkibuild import plaindata
from nkibuild.bundle import BundleProject
from nkibuild.bundle import wheel as wheel_module
from nkibuild.bundle.wheel import Directory, WheelIndex, build_wheel, wheel_file_name, write_wheel
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


def written_before(tmp_path: Path, files: dict[str, bytes]) -> tuple[Path, WheelIndex | None]:
    return write_wheel(project(tmp_path / "before", files), tmp_path / "dist")


def trusted(wheel: Path, index: WheelIndex | None) -> dict[str, WheelIndex]:
    """The index of `wheel` stamped with its stat as it is now: what `run` passes when it
    wrote it (none when the wheel has no index)."""
    stamp = stat_stamp(wheel)
    assert stamp is not None
    return {} if index is None else {wheel.name: dataclasses.replace(index, stamp=stamp)}


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
    wheel, index = written_before(tmp_path, contents("old"))
    files = contents("old") | {NAMES[5]: b"new content\n"}
    seen.written.clear()
    updated(tmp_path, files, trusted(wheel, index))
    assert seen.runs == [NAMES[:5], NAMES[6:]]
    assert seen.written == [NAMES[5], *DIST_INFO_FILES]


def test_member_names_with_commas_keep_their_own_record_lines(tmp_path: Path, seen: Seen) -> None:
    # RECORD is not quoted: a name holding what looks like another line's fields must not
    # take that line (keyed by what precedes the last two fields, never by the first).
    plain = "upd_kernels/data/x"
    data = b"x data\n"
    lookalike = f"{plain},sha256={wheel_module._record_hash(hashlib.sha256(data).digest())},7"
    files = {plain: data, lookalike: b"other\n"}
    wheel, index = written_before(tmp_path, files)
    added = "upd_kernels/data/z"  # members added: matched by that key, not one by one
    seen.written.clear()
    updated(tmp_path, files | {lookalike: b"changed\n", added: b"z\n"}, trusted(wheel, index))
    assert seen.runs == [[plain]]
    assert seen.written[:2] == [lookalike, added]


def test_first_and_last_member_changed(tmp_path: Path, seen: Seen) -> None:
    wheel, index = written_before(tmp_path, contents("old"))
    files = contents("old") | {NAMES[0]: b"first\n", NAMES[-1]: b"last\n"}
    seen.written.clear()
    updated(tmp_path, files, trusted(wheel, index))
    assert seen.runs == [NAMES[1:-1]]
    assert seen.written == [NAMES[0], NAMES[-1], *DIST_INFO_FILES]


def test_members_added_and_removed(tmp_path: Path, seen: Seen) -> None:
    wheel, index = written_before(tmp_path, contents("old"))
    added = "upd_kernels/neff/k03a/default.neff"  # sorts between k03 and k04
    files = {n: d for n, d in contents("old").items() if n not in (NAMES[7], NAMES[8])}
    files[added] = b"added\n"
    seen.written.clear()
    updated(tmp_path, files, trusted(wheel, index))
    assert seen.runs == [NAMES[:4], NAMES[4:7], NAMES[9:]]
    assert seen.written == [added, *DIST_INFO_FILES]
    with zipfile.ZipFile(tmp_path / "dist" / wheel.name) as archive:
        assert archive.testzip() is None
        assert NAMES[7] not in archive.namelist() and archive.read(added) == b"added\n"
        assert archive.read(NAMES[9]) == contents("old")[NAMES[9]]


def test_nothing_changed_copies_every_member_in_one_run(tmp_path: Path, seen: Seen) -> None:
    wheel, index = written_before(tmp_path, contents("old"))
    before = wheel.read_bytes()
    seen.written.clear()
    assert updated(tmp_path, contents("old"), trusted(wheel, index)) == before
    assert seen.runs == [NAMES]


@pytest.mark.parametrize(
    ("second", "reused"), [(1_700_000_101, True), (1_700_000_102, False), (1_800_000_000, False)]
)
def test_another_source_date_epoch_reuses_only_what_has_the_same_zip_date(
    tmp_path: Path, seen: Seen, monkeypatch: pytest.MonkeyPatch, second: int, reused: bool
) -> None:
    """A ZIP date counts in two-second steps: 1_700_000_100 and _101 give equal headers."""
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000100")
    wheel, index = written_before(tmp_path, contents("old"))
    monkeypatch.setenv("SOURCE_DATE_EPOCH", str(second))
    seen.written.clear()
    updated(tmp_path, contents("old") | {NAMES[5]: b"new\n"}, trusted(wheel, index))
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
    wheel, index = written_before(tmp_path, contents("old"))
    wheel.write_bytes(damage(wheel.read_bytes()))  # type: ignore[operator]
    updated(tmp_path, contents("old") | {NAMES[5]: b"new\n"}, trusted(wheel, index))
    assert seen.runs == []


def test_an_update_reads_no_record_of_the_previous_wheel(tmp_path: Path, seen: Seen) -> None:
    """RECORD's lines of the members copied come from the wheel's index: a RECORD
    damaged in the wheel (the stat recorded after the damage) is not read."""
    wheel, index = written_before(tmp_path, contents("old"))
    wheel.write_bytes(damage_record(wheel.read_bytes()))
    updated(tmp_path, contents("old") | {NAMES[5]: b"new\n"}, trusted(wheel, index))
    assert seen.runs == [NAMES[:5], NAMES[6:]]


def test_a_wheel_whose_stat_changed_is_not_updated_in_runs(tmp_path: Path, seen: Seen) -> None:
    wheel, index = written_before(tmp_path, contents("old"))
    reuse = trusted(wheel, index)
    wheel.write_bytes(wheel.read_bytes())  # same bytes, another stat
    updated(tmp_path, contents("old") | {NAMES[5]: b"new\n"}, reuse)
    assert seen.runs == []


def test_a_file_changed_after_the_bundle_leaves_the_previous_wheel(
    tmp_path: Path, seen: Seen
) -> None:
    wheel, index = written_before(tmp_path, contents("old"))
    before = wheel.read_bytes()
    after = project(tmp_path / "after", contents("old") | {NAMES[5]: b"new\n"})
    (after.directory / NAMES[5]).write_bytes(b"edited by hand\n")
    with pytest.raises(BuildError, match=r"k05/default.neff changed after the bundle"):
        build_wheel(after, tmp_path / "dist", reuse=trusted(wheel, index))
    assert wheel.read_bytes() == before
    assert [p.name for p in (tmp_path / "dist").iterdir()] == [wheel.name]


def test_a_big_member_changed_after_the_bundle_is_refused_though_hashed_aside(
    tmp_path: Path, seen: Seen
) -> None:
    """A member past BACKGROUND_HASH_BYTES is hashed in the worker while its chunks are
    deflated: its sha256 is still checked before anything is renamed."""
    files = contents("old") | {NAMES[0]: big_text("old")}
    wheel, index = written_before(tmp_path, files)
    before = wheel.read_bytes()
    after = project(tmp_path / "after", files | {NAMES[0]: big_text("new")})
    assert len(big_text("new")) >= wheel_module.BACKGROUND_HASH_BYTES
    (after.directory / NAMES[0]).write_bytes(big_text("by hand"))
    with pytest.raises(BuildError, match=r"k00/default.neff changed after the bundle"):
        build_wheel(after, tmp_path / "dist", reuse=trusted(wheel, index))
    assert seen.written == [NAMES[0]]  # refused in the update, not in a fresh write
    assert wheel.read_bytes() == before
    assert [p.name for p in (tmp_path / "dist").iterdir()] == [wheel.name]


@pytest.mark.parametrize("ahead_of", ["changed", "edited by hand", "removed"])
def test_a_member_read_ahead_is_taken_as_read_and_checked(
    tmp_path: Path, seen: Seen, monkeypatch: pytest.MonkeyPatch, ahead_of: str
) -> None:
    """A big member read and hashed in the worker before the update (what `run` does
    with `_build.json`) is taken from there, not read again, and checked as any; one
    that could not be read then is read in its turn."""
    files = contents("old") | {NAMES[0]: big_text("old")}
    wheel, index = written_before(tmp_path, files)
    before = wheel.read_bytes()
    after = project(tmp_path / "after", files | {NAMES[0]: big_text("new")})
    path = after.directory / NAMES[0]
    if ahead_of == "edited by hand":
        path.write_bytes(big_text("by hand"))
    if ahead_of == "removed":
        path.rename(path.with_name("elsewhere"))
    read_now: list[str] = []
    bundle_file = wheel_module._bundle_file

    def counted(root: Path, name: str) -> bytes:
        read_now.append(name)
        return bundle_file(root, name)

    monkeypatch.setattr(wheel_module, "_bundle_file", counted)
    with wheel_module._worker() as worker:
        ahead = {str(path): worker.submit(wheel_module.MemberData.read, path)}
        if ahead_of == "removed":
            ahead[str(path)].exception()  # read (and failed) before the file is back
            path.with_name("elsewhere").rename(path)
        reuse = trusted(wheel, index)
        if ahead_of == "edited by hand":
            with pytest.raises(BuildError, match=r"k00/default.neff changed after the bundle"):
                write_wheel(after, tmp_path / "dist", reuse=reuse, worker=worker, ahead=ahead)
            assert wheel.read_bytes() == before and read_now == []
            return
        new, _ = write_wheel(after, tmp_path / "dist", reuse=reuse, worker=worker, ahead=ahead)
    assert read_now == ([NAMES[0]] if ahead_of == "removed" else [])
    assert seen.runs == [NAMES[1:]] and seen.written[0] == NAMES[0]
    assert new.read_bytes() == build_wheel(after, tmp_path / "fresh").read_bytes()


def test_an_update_takes_the_dist_info_files_from_the_index_while_their_inputs_hold(
    tmp_path: Path, seen: Seen, monkeypatch: pytest.MonkeyPatch
) -> None:
    """METADATA, WHEEL and entry_points.txt of the same package are the index's (no
    specifier parsed again); another description makes them anew, in the fresh bytes."""
    made: list[str] = []
    dist_info_files = wheel_module.dist_info_files

    def counted(project: BundleProject, **kwargs: bool) -> tuple[str, dict[str, bytes]]:
        made.append(project.package.description)
        return dist_info_files(project, **kwargs)

    monkeypatch.setattr(wheel_module, "dist_info_files", counted)
    wheel, index = written_before(tmp_path, contents("old"))
    assert index is not None and made == [PACKAGE.description]
    made.clear()
    files = contents("old") | {NAMES[5]: b"new\n"}
    updated(tmp_path, files, trusted(wheel, index))
    assert made == [PACKAGE.description]  # by the fresh write `updated` compares with
    assert seen.written == [NAMES[5], *DIST_INFO_FILES]
    wheel, index = write_wheel(project(tmp_path / "again", files), tmp_path / "dist")
    made.clear()
    described = dataclasses.replace(PACKAGE, description="Kernels, described anew")
    after = dataclasses.replace(project(tmp_path / "after2", files), package=described)
    new = build_wheel(after, tmp_path / "dist", reuse=trusted(wheel, index))
    assert made == [described.description]
    assert new.read_bytes() == build_wheel(after, tmp_path / "fresh2").read_bytes()
    with zipfile.ZipFile(new) as archive:
        assert "Summary: Kernels, described anew" in archive.read(DIST_INFO_FILES[0]).decode()


def test_a_run_the_worker_fails_to_copy_leaves_the_wheel_to_a_fresh_write(
    tmp_path: Path, seen: Seen, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy fails in the worker (the previous wheel cut short under it) after later
    runs were handed over: every one of them ends before the fresh write starts."""
    wheel, index = written_before(tmp_path, contents("old"))
    copy_bytes = wheel_module._copy_bytes
    copies: list[int] = []

    def cut_short(source: int, target: int, first: int, at: int, length: int) -> None:
        copies.append(length)
        if len(copies) == 1:
            raise EOFError("the previous wheel ends 10 bytes early")
        copy_bytes(source, target, first, at, length)

    monkeypatch.setattr(wheel_module, "_copy_bytes", cut_short)
    data = updated(tmp_path, contents("old") | {NAMES[5]: b"new\n"}, trusted(wheel, index))
    assert seen.runs == [NAMES[:5], NAMES[6:]] and len(copies) == 2
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        assert archive.testzip() is None and archive.read(NAMES[5]) == b"new\n"


def test_the_replaced_wheel_is_freed_after_the_rename_and_leaves_no_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wheel replaced keeps a second name until the rename is done (the rename frees
    no blocks), removed by the worker; a rename that fails leaves neither that name
    nor a temp file, and the old wheel as it was."""
    wheel, index = written_before(tmp_path, contents("old"))
    links_at_rename: list[int] = []
    replace = os.replace

    def counted(source: str, destination: str) -> None:
        if Path(destination) == wheel:
            links_at_rename.append(os.stat(wheel).st_nlink)
        replace(source, destination)

    monkeypatch.setattr(os, "replace", counted)
    updated(tmp_path, contents("old") | {NAMES[5]: b"new\n"}, trusted(wheel, index))
    assert links_at_rename == [2]
    assert os.stat(wheel).st_nlink == 1
    before = wheel.read_bytes()

    def refused(source: str, destination: str) -> None:
        raise OSError(28, "No space left on device", destination)

    monkeypatch.setattr(os, "replace", refused)
    after = project(tmp_path / "again", contents("old") | {NAMES[6]: b"new\n"})
    with pytest.raises(OSError, match="No space left"):
        build_wheel(after, tmp_path / "dist", reuse={})
    assert [p.name for p in (tmp_path / "dist").iterdir()] == [wheel.name]
    assert wheel.read_bytes() == before and os.stat(wheel).st_nlink == 1


def test_zip64_end_records_past_the_member_count_limit(
    tmp_path: Path, seen: Seen, monkeypatch: pytest.MonkeyPatch
) -> None:
    """zipfile's limits made small: more members than an end record counts need ZIP64
    end records, read from the previous wheel and written as zipfile writes them."""
    monkeypatch.setattr(zipfile, "ZIP_FILECOUNT_LIMIT", 5)
    wheel, index = written_before(tmp_path, contents("old"))
    assert b"PK\x06\x06" in wheel.read_bytes()
    updated(tmp_path, contents("old") | {NAMES[5]: b"new\n"}, trusted(wheel, index))
    assert seen.runs == [NAMES[:5], NAMES[6:]]


def test_zip64_members_and_offsets_are_written_member_by_member(
    tmp_path: Path, seen: Seen, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past ZIP64_LIMIT, headers carry ZIP64 fields this update does not move: declined."""
    monkeypatch.setattr(zipfile, "ZIP64_LIMIT", 2000)
    files = contents("old") | {NAMES[2]: hashlib.sha512(b"x").digest() * 100}
    wheel, index = written_before(tmp_path, files)
    updated(tmp_path, files | {NAMES[5]: b"new\n"}, trusted(wheel, index))
    assert seen.runs == []


def test_a_wheel_growing_past_zip64_offsets_is_written_member_by_member(
    tmp_path: Path, seen: Seen, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The previous wheel fits the limit; the new one's later members do not."""
    wheel, index = written_before(tmp_path, contents("old"))
    monkeypatch.setattr(zipfile, "ZIP64_LIMIT", len(wheel.read_bytes()) - 200)
    bigger = {NAMES[0]: hashlib.sha512(b"x").digest() * 8}  # incompressible: moves the rest
    updated(tmp_path, contents("old") | bigger, trusted(wheel, index))  # as a fresh write
    assert seen.runs == [NAMES[1:]]  # tried, then declined: its offsets pass the limit


def test_names_that_are_not_ascii_are_updated_in_runs(tmp_path: Path, seen: Seen) -> None:
    """zipfile flags a non-ASCII name as UTF-8 and stores it so; the update reads it so."""
    names = sorted([*NAMES, "upd_kernels/neff/k03ü/default.neff", "upd_kernels/日本.txt"])
    wheel, index = written_before(tmp_path, contents("old", names))
    changed = "upd_kernels/neff/k03ü/default.neff"
    seen.written.clear()
    updated(tmp_path, contents("old", names) | {changed: b"new\n"}, trusted(wheel, index))
    at = names.index(changed)
    assert seen.runs == [names[:at], names[at + 1 :]]
    assert seen.written == [changed, *DIST_INFO_FILES]


@pytest.mark.parametrize("fails", ["missing", "refused"])
def test_runs_are_copied_through_memory_where_the_kernel_cannot(
    tmp_path: Path, seen: Seen, monkeypatch: pytest.MonkeyPatch, fails: str
) -> None:
    """No copy_file_range (not Linux), or one the file system refuses: the same wheel."""
    wheel, index = written_before(tmp_path, contents("old"))
    if fails == "missing":
        monkeypatch.delattr(wheel_module.os, "copy_file_range", raising=False)
    else:

        def refused(*args: object) -> int:
            raise OSError(18, "Invalid cross-device link")

        monkeypatch.setattr(wheel_module.os, "copy_file_range", refused, raising=False)
    updated(tmp_path, contents("old") | {NAMES[5]: b"new\n"}, trusted(wheel, index))
    assert seen.runs == [NAMES[:5], NAMES[6:]]


def test_a_bundle_record_that_is_no_sha256_is_refused_not_copied(tmp_path: Path) -> None:
    wheel, index = written_before(tmp_path, contents("old"))
    after = project(tmp_path / "after", contents("old"))
    files = dict(after.files) | {NAMES[3]: "not-a-digest"}
    after = BundleProject(after.directory, PACKAGE, tuple(sorted(files.items())), None)
    with pytest.raises(BuildError, match=r"k03/default.neff changed after the bundle"):
        build_wheel(after, tmp_path / "dist", reuse=trusted(wheel, index))


def big_text(tag: str, kernels: int = 40_000) -> bytes:
    """Compressible content past FAST_DEFLATE_BYTES, as `_build.json` is for many kernels."""
    return b"".join(
        b'{"kernel": "k%05d", "tag": "%s"},\n' % (n, tag.encode()) for n in range(kernels)
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


def chunks_of(data: bytes) -> list[bytes]:
    ends = wheel_module._chunk_ends(data)
    return [data[start:end] for start, end in itertools.pairwise([0, *ends])]


def deflated_in_chunks(data: bytes, level: int) -> bytes:
    """`data` deflated as this writer deflates a big file: chunks, each by its own
    compressor ended by a full flush, then an empty final block."""
    pieces = []
    for chunk in chunks_of(data):
        compressor = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)
        pieces.append(compressor.compress(chunk) + compressor.flush(zlib.Z_FULL_FLUSH))
    return b"".join(pieces) + b"\x03\x00"


def test_chunks_end_at_a_line_or_json_object_past_the_chunk_size() -> None:
    size = wheel_module.DEFLATE_CHUNK_BYTES
    line = 23  # bytes of each line below
    lines = b"".join(b"kernel k%05d, tag old\n" % number for number in range(11 * size // 46))
    chunks = chunks_of(lines)
    assert b"".join(chunks) == lines and len(chunks) == 6 and len(chunks[-1]) <= size
    assert all(size < len(chunk) <= size + line and chunk.endswith(b"\n") for chunk in chunks[:-1])
    json_text = b'{"k":' + b'{"a":1},' * (size // 4) + b"{}}"
    assert all(chunk.endswith(b"},") for chunk in chunks_of(json_text)[:-1])
    assert list(map(len, chunks_of(bytes(3 * size + 1)))) == [size, size, size, 1]
    near_the_end = bytes(2 * size - 2) + b"\n" + bytes(10)  # the first chunk ends at it
    assert list(map(len, chunks_of(near_the_end))) == [2 * size - 1, 10]
    past_it = bytes(2 * size) + b"\n" + bytes(5)  # too far: the first chunk is cut at size
    assert list(map(len, chunks_of(past_it))) == [size, size + 1, 5]


def test_a_big_file_is_deflated_in_chunks_at_the_fastest_level_and_a_small_one_whole(
    tmp_path: Path,
) -> None:
    big = big_text("old")
    assert len(big) >= wheel_module.FAST_DEFLATE_BYTES
    wheel, _ = written_before(tmp_path, contents("old") | {NAMES[0]: big})
    stream = stored_bytes(wheel, NAMES[0])
    assert stream == deflated_in_chunks(big, 1) != deflated(big, 1)
    assert zlib.decompress(stream, -zlib.MAX_WBITS) == big  # one valid deflate stream
    assert stored_bytes(wheel, NAMES[1]) == deflated(contents("old")[NAMES[1]], 6)
    with zipfile.ZipFile(wheel) as archive:
        assert archive.testzip() is None and archive.read(NAMES[0]) == big  # CRC checked


def test_an_untrusted_wheel_lends_no_big_deflated_member(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wheel of another writer that deflated a big file at zlib's default level: its
    stream unpacks to the right content but is not the one this writer writes."""
    files = contents("old") | {NAMES[0]: big_text("old")}
    with monkeypatch.context() as other_writer:
        other_writer.setattr(wheel_module, "FAST_DEFLATE_LEVEL", 6)
        wheel, _ = written_before(tmp_path, files)
    assert stored_bytes(wheel, NAMES[0]) == deflated_in_chunks(files[NAMES[0]], 6)
    copied = counted_member_copies(monkeypatch)
    updated(tmp_path, files | {NAMES[5]: b"new\n"}, {})  # no stat recorded: untrusted
    assert copied == [n for n in NAMES if n not in (NAMES[0], NAMES[5])]


@pytest.fixture
def deflated_chunks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the chunks the writer deflates (by compressors at its fast level;
    zipfile's own, for small files, are at zlib's default)."""
    sizes: list[int] = []
    compressobj = zlib.compressobj

    class Counted:
        def __init__(self, level: int, *args: int) -> None:
            self.compressor = compressobj(level, *args)
            self.fast = level == wheel_module.FAST_DEFLATE_LEVEL

        def compress(self, data: bytes) -> bytes:
            if self.fast:
                sizes.append(len(data))
            return self.compressor.compress(data)

        def flush(self, *mode: int) -> bytes:
            return self.compressor.flush(*mode)

    monkeypatch.setattr(wheel_module.zlib, "compressobj", Counted)
    return sizes


def test_an_update_deflates_only_the_changed_chunks_of_a_big_member(
    tmp_path: Path, seen: Seen, deflated_chunks: list[int]
) -> None:
    size = wheel_module.DEFLATE_CHUNK_BYTES
    big = big_text("old", 120_000)  # 16 chunks; RECORD is small
    wheel, index = written_before(tmp_path, contents("old") | {NAMES[0]: big})
    chunks = chunks_of(big)
    assert index is not None and deflated_chunks == list(map(len, chunks))
    deflated_chunks.clear()
    edited = bytearray(big)
    edited[size + size // 2 : size + size // 2 + 5] = b"EDIT!"  # inside the second chunk
    edited[-3:] = b"}!\n"  # the last one
    edited_chunks = chunks_of(bytes(edited))
    assert list(map(len, edited_chunks)) == list(map(len, chunks))
    files = contents("old") | {NAMES[0]: bytes(edited)}
    after = project(tmp_path / "after", files)
    new = build_wheel(after, tmp_path / "dist", reuse=trusted(wheel, index))
    assert deflated_chunks == [len(chunks[1]), len(chunks[-1])]
    assert seen.runs == [NAMES[1:]] and seen.written[0] == NAMES[0]
    assert new.read_bytes() == build_wheel(after, tmp_path / "fresh").read_bytes()
    with zipfile.ZipFile(new) as archive:
        assert archive.testzip() is None and archive.read(NAMES[0]) == bytes(edited)


def test_a_big_member_that_got_longer_deflates_again_only_around_the_change(
    tmp_path: Path, deflated_chunks: list[int]
) -> None:
    """Chunks end at a line's or an object's end: those after a longer line start
    later, with the content they had."""
    size = wheel_module.DEFLATE_CHUNK_BYTES
    big = big_text("old", 120_000)
    wheel, index = written_before(tmp_path, contents("old") | {NAMES[0]: big})
    deflated_chunks.clear()
    edited = big[: size + size // 2] + b"longer " + big[size + size // 2 :]
    after = project(tmp_path / "after", contents("old") | {NAMES[0]: edited})
    new = build_wheel(after, tmp_path / "dist", reuse=trusted(wheel, index))
    old_chunks = set(chunks_of(big))
    assert deflated_chunks == [len(c) for c in chunks_of(edited) if c not in old_chunks]
    assert len(deflated_chunks) == 1
    assert new.read_bytes() == build_wheel(after, tmp_path / "fresh").read_bytes()


def test_a_big_record_is_deflated_again_only_where_its_lines_changed(
    tmp_path: Path, seen: Seen, deflated_chunks: list[int]
) -> None:
    """RECORD of thousands of members passes FAST_DEFLATE_BYTES too: its lines come
    from the index, and only the chunks around a changed member's line are deflated."""
    names = [f"upd_kernels/neff/k{number:05d}/{'x' * 40}.neff" for number in range(9_000)]
    files = {name: name.encode() for name in names}
    wheel, index = written_before(tmp_path, files)
    assert index is not None and f"{DIST_INFO}/RECORD" in index.chunks
    deflated_chunks.clear()
    after = project(tmp_path / "after", files | {names[4_000]: b"new\n"})
    new = build_wheel(after, tmp_path / "dist", reuse=trusted(wheel, index))
    with zipfile.ZipFile(new) as archive:
        record = archive.read(f"{DIST_INFO}/RECORD")
    changed_at = record.index(names[4_000].encode())
    (chunk,) = [
        c
        for c in chunks_of(record)
        if changed_at in range(record.index(c), record.index(c) + len(c))
    ]
    assert deflated_chunks == [len(chunk)]  # a line a byte shorter: the next chunks as they were
    assert seen.runs == [names[:4_000], names[4_001:]]
    assert new.read_bytes() == build_wheel(after, tmp_path / "fresh").read_bytes()


def test_a_damaged_chunk_of_a_trusted_wheel_is_not_copied(tmp_path: Path) -> None:
    """Chunks are taken from a stream only after its sha256 is checked: a damaged
    stream (the stat recorded after the damage) lends none, the wheel is still right."""
    size = wheel_module.DEFLATE_CHUNK_BYTES
    big = big_text("old", 120_000)
    wheel, index = written_before(tmp_path, contents("old") | {NAMES[0]: big})
    damaged = bytearray(wheel.read_bytes())
    stream_at = damaged.index(stored_bytes(wheel, NAMES[0]))
    damaged[stream_at + 5 * size // 100] ^= 0x01  # inside the first chunk's deflated bytes
    wheel.write_bytes(bytes(damaged))
    edited = big[:-3] + b"}!\n"  # the last chunk changed: the others would be taken
    updated(tmp_path, contents("old") | {NAMES[0]: edited}, trusted(wheel, index))


def test_an_index_of_another_wheel_lends_no_run(tmp_path: Path, seen: Seen) -> None:
    """An index is used only for the wheel whose central directory and end records it
    describes (checked by their sha256), whatever stat it was stamped with."""
    _, other = write_wheel(project(tmp_path / "other", contents("other")), tmp_path / "o")
    wheel, _ = written_before(tmp_path, contents("old"))
    updated(tmp_path, contents("old") | {NAMES[5]: b"new\n"}, trusted(wheel, other))
    assert seen.runs == []


def test_the_index_file_is_read_only_when_whole(
    tmp_path: Path,
) -> None:
    wheel, index = written_before(tmp_path, contents("old"))
    assert index is not None
    stamp = stat_stamp(wheel)
    assert stamp is not None
    plain = dataclasses.replace(index, stamp=stamp).plain()
    index_file = tmp_path / wheel_module.INDEX_FILE
    index_file.write_bytes(plaindata.dumps({wheel.name: plain}))
    assert wheel_module._indexes(index_file) == {
        wheel.name: dataclasses.replace(index, stamp=stamp)
    }
    index_file.write_bytes(plaindata.dumps({wheel.name: plain})[:-20])  # cut short
    assert wheel_module._indexes(index_file) == {}
    short_shas = (plain[0], plain[1], plain[2][:-64], *plain[3:])  # a member fewer than names
    wrong_type = (plain[0], plain[1].decode(), *plain[2:])  # type: ignore[attr-defined]
    sizes = plain[5]  # each entry's length: a flipped bit would copy the wrong bytes
    assert isinstance(sizes, bytes)
    flipped = (*plain[:5], bytes([sizes[0] ^ 1]) + sizes[1:], *plain[6:])
    text_metadata = (*plain[:-2], ("key", {f"{DIST_INFO}/METADATA": "not bytes"}), plain[-1])
    for damaged in (short_shas, wrong_type, flipped, text_metadata, plain[:-1], [*plain]):
        index_file.write_bytes(plaindata.dumps({wheel.name: damaged}))
        assert wheel_module._indexes(index_file) == {}


def test_each_update_indexes_its_wheel_for_the_next_one(
    tmp_path: Path, seen: Seen, deflated_chunks: list[int]
) -> None:
    """A chain of updates, each from the index the one before returned: members
    changed, added and removed, a big member edited in place and made longer, RECORD
    past FAST_DEFLATE_BYTES; every wheel is the fresh one, the runs keep coming and
    but for a RECORD line added or removed only a few chunks are deflated."""
    names = [f"upd_kernels/neff/k{number:05d}/{'x' * 40}.neff" for number in range(9_000)]
    files = {name: name.encode() for name in names} | {NAMES[0]: big_text("old", 60_000)}
    wheel, index = written_before(tmp_path, files)
    big = bytearray(files[NAMES[0]])
    edits = [
        {names[10]: b"changed\n"},
        {names[20]: b"changed too\n", "upd_kernels/added.txt": b"added\n"},
        {NAMES[0]: bytes(big[:70_000]) + b"EDIT" + bytes(big[70_004:])},
        {NAMES[0]: bytes(big[:200_000]) + b"longer " + bytes(big[200_000:])},
    ]
    for step, edit in enumerate(edits):
        files = files | edit
        if step == 1:
            del files[names[30]]
        after = project(tmp_path / f"after{step}", files)
        seen.runs.clear()
        deflated_chunks.clear()
        wheel, index = write_wheel(after, tmp_path / "dist", reuse=trusted(wheel, index))
        if step != 1:  # a line added or removed: RECORD's chunks after it all move
            assert sum(deflated_chunks) < len(files[NAMES[0]]) // 4  # a few chunks, not all
        assert wheel.read_bytes() == build_wheel(after, tmp_path / f"fresh{step}").read_bytes()
        assert index is not None and len(seen.runs) >= 2
        with zipfile.ZipFile(wheel) as archive:
            assert archive.testzip() is None and archive.read(NAMES[0]) == files[NAMES[0]]


def test_a_build_sets_the_replaced_wheel_and_index_aside_until_the_next_one(
    tmp_path: Path, seen: Seen
) -> None:
    """The wheel stage's replaced wheel and index keep a hidden second name in the state
    dir (their renames free no blocks), removed when the next wheel stage starts; dist/
    holds the wheel alone, which is the fresh one, updated from its index."""
    from nkibuild.bundle import load_bundle

    root = prebuilt_project(tmp_path / "p", kernels=3)
    state, dist = root / "build" / "state", root / "dist"
    assert build(root).ok
    (wheel,) = dist.iterdir()
    first_wheel, first_index = os.stat(wheel).st_ino, os.stat(state / wheel_module.INDEX_FILE)

    def set_aside() -> dict[str, int]:
        found = [(p.name.split(".old-")[0], p.stat().st_ino) for p in state.glob(".*.old-*")]
        assert len(found) == 2, found  # the replaced wheel and index, and nothing more
        return dict(found)

    for step, name in enumerate(("k0_edited", "k0_edited_again")):
        (root / "kernels" / "k0.pb").write_bytes(module(name, 8))  # k0's shape: [4, 8]
        seen.runs.clear()
        assert build(root).ok
        assert [p.name for p in dist.iterdir()] == [wheel.name]
        assert len(seen.runs) == 3  # updated: the runs around _build.json and k0's NEFF
        fresh = build_wheel(load_bundle(root / "build" / "bundle" / "ahead"), tmp_path / f"f{step}")
        assert wheel.read_bytes() == fresh.read_bytes()
        if step == 0:
            assert set_aside() == {
                f".{wheel.name}": first_wheel,
                f".{wheel_module.INDEX_FILE}": first_index.st_ino,
            }
            second = {f".{wheel.name}": os.stat(wheel).st_ino}
        else:  # the first ones removed, the second build's set aside
            assert set_aside()[f".{wheel.name}"] == second[f".{wheel.name}"]
            assert first_wheel not in set_aside().values()
