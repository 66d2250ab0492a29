"""A small, reproducible wheel writer for generated bundles.

Standard backends always deflate, which costs time and gains nothing on
NEFFs (their payload is already gzip); they also need SOURCE_DATE_EPOCH or VCS
tweaks to be reproducible. This writer stores a file when deflating does not
pay, deflates big files at zlib's fastest level, sorts entries, and fixes every
timestamp, so equal inputs give a byte-identical wheel. Names, versions and tags
come from `packaging`.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import io
import json
import os
import struct
import zipfile
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate, compress, count, pairwise, repeat
from operator import add, itemgetter, ne, not_
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from packaging.tags import Tag
from packaging.utils import canonicalize_name
from packaging.version import Version

from nkibuild import __version__
from nkibuild.bundle import BundleProject
from nkibuild.errors import BuildError, UsageError
from nkibuild.fsutil import atomic_output, atomic_write_text, stat_stamp
from nkibuild.manifest.model import Package
from nkibuild.text import printable

TAG = Tag("py3", "none", "any")
WRITER_FILE = "wheel-writer.json"  # in the state dir: which writer made the wheels in dist/
DEFAULT_EPOCH = 315532800  # 1980-01-01, the earliest time a zip entry can carry
ENTRY_POINT_GROUP = "nkibuild.bundles"
# Deflate a file only if a sample from its middle shrinks at least this much. The middle:
# a NEFF's 1 KB header compresses well, its gzip payload (most of the file) does not.
MIN_DEFLATE_GAIN = 0.05
SAMPLE_BYTES = 1 << 14
# A file this big is deflated at zlib's fastest level: at the default level, the 6 MB
# `_build.json` of 5,000 kernels and the RECORD of their 15,000 members took 50 ms of
# every rebuild's wheel; level 1 makes that wheel 0.14% bigger.
FAST_DEFLATE_BYTES = 1 << 20
FAST_DEFLATE_LEVEL = 1

if TYPE_CHECKING:
    from nkibuild.context import BuildContext


def wheel_file_name(package: Package) -> str:
    distribution = canonicalize_name(package.name).replace("-", "_")
    return f"{distribution}-{Version(package.version)}-{TAG}.whl"


def run(context: BuildContext) -> list[Path]:
    """The wheel stage of a build: the generated bundle project -> its wheels in dist/.

    A wheel it replaces lends its unchanged members (see `Previous`) when the same
    writer made it, and is trusted without unpacking them while it has the stat it had
    when written: the state dir records both (`WRITER_FILE`)."""
    from nkibuild.bundle import load_bundle

    bundle_dir = context.layout.bundle_dir(context.manifest)
    writer_file = context.layout.state_dir / WRITER_FILE
    written = _written_by_this_writer(writer_file)
    writer_file.unlink(missing_ok=True)  # until the new wheels are in place
    project = load_bundle(bundle_dir, build_info=False)
    wheels = build_wheels(project, context.layout.dist_dir, reuse=written)
    stats = {wheel.name: stat_stamp(wheel) for wheel in wheels}
    record = {"writer": writer_identity(), "wheels": stats}
    atomic_write_text(writer_file, json.dumps(record), durable=False)
    return wheels


def build_wheels(
    project: BundleProject, dist_dir: Path, *, reuse: Mapping[str, str] | None = None
) -> list[Path]:
    """The bundle's wheel, and one per target when its NEFFs are split out."""
    return [build_wheel(each, dist_dir, reuse=reuse) for each in (project, *project.parts)]


def _written_by_this_writer(writer_file: Path) -> dict[str, str] | None:
    """The stats of the wheels this writer last wrote (file name -> stat), or None if
    another writer (or none known) made what dist/ holds."""
    try:
        record = json.loads(writer_file.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("writer") != writer_identity():
        return None
    stats = record.get("wheels")
    if not isinstance(stats, dict):
        return {}
    return {name: stat for name, stat in stats.items() if isinstance(stat, str)}


def writer_identity() -> dict[str, str]:
    """What decides a wheel's bytes besides its contents: this writer's code (all of the
    bundle package's), zlib's deflate output and zipfile's headers."""
    import platform

    from nkibuild.bundle import generator_digest

    return {
        "writer": generator_digest(),
        "zlib": zlib.ZLIB_RUNTIME_VERSION,
        "python": platform.python_version(),
    }


def build_wheel(
    project: BundleProject, dist_dir: Path, *, reuse: Mapping[str, str] | None = None
) -> Path:
    """Write the distribution's wheel. With `reuse` (the stats of the wheels this writer
    wrote, see `run`), the members of the wheel already at the destination whose content
    is unchanged are copied over as they are stored, not read and compressed again;
    checked first unless the wheel still has the stat it was written with, in which
    case they are copied in runs of consecutive members (`_update_zip`)."""
    package = project.package
    package_prefix = f"{package.import_name}/"
    members = [member for member in project.files if member[0].startswith(package_prefix)]
    dist_info, generated = dist_info_files(project)
    destination = dist_dir / wheel_file_name(package)
    previous = destination if reuse is not None else None
    stamp = stat_stamp(destination)
    trusted = reuse is not None and stamp is not None and reuse.get(destination.name) == stamp
    record_name = f"{dist_info}/RECORD"
    with atomic_output(destination) as tmp:
        root = project.directory
        if trusted and _update_zip(tmp, destination, root, members, generated, record_name):
            return destination
        with Previous.of(previous, trusted=trusted) as old:
            _write_zip(tmp, root, members, generated, record_name, old)
    return destination


def build_editable_wheel(project: BundleProject, wheel_dir: Path) -> Path:
    """A PEP 660 editable wheel of the bundle: its metadata and a `.pth` file that puts
    the bundle's directory (and each target part's) on `sys.path`, so the installed
    package is the one in the build dir and every build updates it. The target parts
    are on that path, not requirements: there is no separate install of them."""
    dist_info, generated = dist_info_files(project, editable=True)
    directories = [project.directory, *(part.directory for part in project.parts)]
    paths = "".join(f"{directory.resolve()}\n" for directory in directories)
    generated[f"__editable__.{dist_info.removesuffix('.dist-info')}.pth"] = paths.encode()
    destination = wheel_dir / wheel_file_name(project.package)
    with atomic_output(destination) as tmp:
        _write_zip(tmp, project.directory, [], generated, f"{dist_info}/RECORD")
    return destination


def dist_info_files(
    project: BundleProject, *, editable: bool = False
) -> tuple[str, dict[str, bytes]]:
    """The `.dist-info` directory's name and its files besides RECORD. An editable
    wheel's metadata requires no target parts: its `.pth` file puts them on the path."""
    if editable:
        project = dataclasses.replace(project, parts=())
    package = project.package
    dist_info = wheel_file_name(package).rsplit("-", 3)[0] + ".dist-info"
    generated = {
        f"{dist_info}/METADATA": metadata(project).encode(),
        f"{dist_info}/WHEEL": _wheel_file().encode(),
    }
    if project.target is None:  # tools discover bundles, not their NEFF parts
        generated[f"{dist_info}/entry_points.txt"] = _entry_points(package.import_name).encode()
    return dist_info, generated


def core_metadata(package: Package) -> list[str]:
    """The fields every distribution of the package carries (wheel METADATA, sdist PKG-INFO)."""
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {package.name}",
        f"Version: {Version(package.version)}",
        f"Summary: {_one_line(package.description)}",
        f"Requires-Python: {specifier(package.requires_python)}",
    ]
    if package.license:
        lines.append(f"License: {_one_line(package.license)}")
    return lines


def metadata(project: BundleProject) -> str:
    package = project.package
    lines = [
        *core_metadata(package),
        *(f"Requires-Dist: {requirement}" for requirement in project.requirements),
    ]
    for part in project.parts:
        target = part.target
        pin = f"{part.package.name}=={Version(part.package.version)}"
        lines += [
            f'Requires-Dist: {pin}; extra == "{target}"',
            f'Requires-Dist: {pin}; extra == "all"',
        ]
    lines += [f"Provides-Extra: {extra}" for extra in _extras(project)]
    if package.neuron_sdk:
        lines.append(f"Requires-External: neuron-sdk ({specifier(package.neuron_sdk)})")
    targets = project.targets
    lines += [
        f"Keywords: neuron,nki,trainium,{','.join(targets)}",
        f"Platform: {', '.join(targets)}",
    ]
    return "\n".join(lines) + "\n"


def _extras(project: BundleProject) -> list[str]:
    targets = [part.target for part in project.parts if part.target]
    return [*targets, "all"] if targets else []


def _one_line(text: str) -> str:
    """A header value: whitespace runs (line breaks too) become one space, and control
    characters are escaped, so a value can neither end the headers nor add one."""
    return printable(" ".join(text.split()))


def specifier(text: str) -> str:
    """A version specifier set as packaging writes it: no spaces, no line breaks (the
    manifest's `>=3.10\\n` would otherwise end METADATA's headers). Text packaging
    cannot parse (the manifest check refuses it) is still kept on one line."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        return str(SpecifierSet(text))
    except InvalidSpecifier:
        return _one_line(text)


def _wheel_file() -> str:
    return (
        "Wheel-Version: 1.0\n"
        f"Generator: nkibuild {__version__}\n"
        "Root-Is-Purelib: true\n"
        f"Tag: {TAG}\n"
    )


def _entry_points(import_name: str) -> str:
    return f"[{ENTRY_POINT_GROUP}]\n{import_name} = {import_name}\n"


# The last second a ZIP member's date can hold (2107-12-31 23:59:58 UTC).
LAST_ZIP_EPOCH = 4354819198


def source_epoch() -> int:
    """The timestamp of every archived file: SOURCE_DATE_EPOCH, never before 1980.

    The reproducible-builds spec makes it a decimal count of seconds; anything else
    (`1e9`, `yesterday`, 400 digits, a date past what a ZIP can hold) is an error
    naming the variable, not a traceback or a silently different archive."""
    text = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if not text:  # unset or empty: unset, as in other tools
        return DEFAULT_EPOCH
    if not (text.isascii() and text.isdigit()):
        raise UsageError(
            f"SOURCE_DATE_EPOCH={text[:40]!r} is not a whole number of seconds "
            "since 1970 (e.g. SOURCE_DATE_EPOCH=$(git log -1 --format=%ct))"
        )
    if len(text) > 12 or int(text) > LAST_ZIP_EPOCH:
        raise UsageError(
            f"SOURCE_DATE_EPOCH={text[:40]} is after 2107, the last year a ZIP archive can record"
        )
    return max(int(text), DEFAULT_EPOCH)


def _date_time() -> tuple[int, int, int, int, int, int]:
    import time

    return time.gmtime(source_epoch())[:6]


def _write_zip(
    target: Path,
    root: Path,
    members: Iterable[tuple[str, str]],
    generated: dict[str, bytes],
    record_name: str,
    previous: Previous | None = None,
) -> None:
    """Members (path, sha256 recorded by the bundle stage) one at a time, then metadata,
    then RECORD. A member whose bytes no longer match its recorded sha256 was changed
    after the bundle was generated: refuse to package it. A member the previous wheel
    holds with that sha256 is copied from it as stored."""
    stamp = _date_time()
    record = []
    with zipfile.ZipFile(target, "w") as archive:
        for name, recorded in sorted(members):
            stored = previous.stored(name, recorded) if previous else None
            if stored is not None:
                record.append(_copy_member(archive, name, stamp, stored))
                continue
            data, digest = _read_member(root, name, recorded)
            record.append(_write_member(archive, name, data, stamp, digest))
        for name, data in sorted(generated.items()):
            record.append(_write_member(archive, name, data, stamp, hashlib.sha256(data).digest()))
        record.append(f"{record_name},,")
        listing = ("\n".join(record) + "\n").encode()
        _write_member(archive, record_name, listing, stamp, None)


def _read_member(root: Path, name: str, recorded: str) -> tuple[bytes, bytes]:
    """A bundle file's bytes and sha256, refused if they are no longer what the bundle
    stage recorded: it was changed after the bundle was generated."""
    data = (root / name).read_bytes()
    digest = hashlib.sha256(data).digest()
    if recorded and digest.hex() != recorded:
        raise BuildError(
            f"{root / name} changed after the bundle was generated (sha256 differs "
            "from bundle.json); rebuild the bundle instead of editing its files"
        )
    return data, digest


def _write_member(
    archive: zipfile.ZipFile, name: str, data: bytes, stamp: tuple[int, ...], digest: bytes | None
) -> str:
    """Write one entry with fixed metadata; return its RECORD line (RECORD has no hash)."""
    info = zipfile.ZipInfo(name, date_time=stamp)  # type: ignore[arg-type]
    info.external_attr = 0o644 << 16
    info.compress_type = _compression(data)
    archive.writestr(info, data, compresslevel=_deflate_level(data))
    if digest is None:
        return ""
    return f"{name},sha256={_record_hash(digest)},{len(data)}"


def _record_hash(digest: bytes) -> str:
    """A sha256 as RECORD writes it: urlsafe base64 without padding (PEP 376/427)."""
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _deflate_level(data: bytes) -> int | None:
    """The zlib level this writer deflates `data` at (None: zlib's default)."""
    return FAST_DEFLATE_LEVEL if len(data) >= FAST_DEFLATE_BYTES else None


def _compression(data: bytes) -> int:
    if len(data) < 2 * SAMPLE_BYTES:
        return zipfile.ZIP_DEFLATED  # small files: deflating them costs nothing worth saving
    middle = len(data) // 2
    sample = data[middle : middle + SAMPLE_BYTES]
    gained = 1 - len(zlib.compress(sample, 1)) / len(sample)
    return zipfile.ZIP_DEFLATED if gained >= MIN_DEFLATE_GAIN else zipfile.ZIP_STORED


@dataclass(frozen=True)
class StoredMember:
    """A member as a wheel stores it: its compression, CRC, size and stored bytes."""

    compress_type: int
    crc: int
    size: int
    stored: bytes
    digest: bytes


class Previous:
    """The wheel being replaced, read for members whose content did not change.

    A member is taken only if the wheel's RECORD lists it with the sha256 the bundle
    records now, its stored bytes unpack to exactly that content (CRC and sha256
    checked), and this writer would store that content the same way (a deflate stream
    does not say its level: none deflated at `FAST_DEFLATE_LEVEL` is taken); so the new
    wheel is byte for byte the one a fresh write gives. Anything unreadable: no reuse.
    A `trusted` wheel (this writer's, with the stat it was written with: its members
    are what this writer stored for those sha256s) skips unpacking them, which for
    thousands of NEFFs of many MB each is most of the stage's time."""

    def __init__(self, path: Path, *, trusted: bool = False) -> None:
        self.trusted = trusted
        with contextlib.ExitStack() as opened:  # a wheel that fails to open is closed again
            self.handle = opened.enter_context(open(path, "rb"))
            self.archive = opened.enter_context(zipfile.ZipFile(self.handle))
            self.recorded = self._record()
            self.opened = opened.pop_all()  # closed by `of`

    @classmethod
    @contextlib.contextmanager
    def of(cls, path: Path | None, *, trusted: bool = False) -> Iterator[Previous | None]:
        previous = None
        if path is not None and path.is_file():
            with contextlib.suppress(*UNREADABLE):
                previous = cls(path, trusted=trusted)
        try:
            yield previous
        finally:
            if previous is not None:
                previous.opened.close()

    def _record(self) -> dict[str, str]:
        """name -> sha256 (hex) from the wheel's RECORD."""
        (name,) = [n for n in self.archive.namelist() if n.endswith(".dist-info/RECORD")]
        listed = {}
        for line in self.archive.read(name).decode().splitlines():
            # The last two fields (hash, size) hold no comma; a member's name may.
            path, hashed, _ = line.rsplit(",", 2)
            algorithm, _, encoded = hashed.partition("=")
            if algorithm == "sha256":
                listed[path] = base64.urlsafe_b64decode(encoded + "==").hex()
        return listed

    def stored(self, name: str, sha256: str) -> StoredMember | None:
        if not sha256 or self.recorded.get(name) != sha256:
            return None
        try:
            return self._checked(self.archive.getinfo(name), sha256)
        except UNREADABLE:
            return None

    def _checked(self, info: zipfile.ZipInfo, sha256: str) -> StoredMember | None:
        self.handle.seek(info.header_offset)
        header = self.handle.read(LOCAL_HEADER.size)
        fields = LOCAL_HEADER.unpack(header)
        if fields[0] != LOCAL_SIGNATURE:
            return None
        self.handle.seek(info.header_offset + LOCAL_HEADER.size + fields[-2] + fields[-1])
        stored = self.handle.read(info.compress_size)
        if self.trusted and len(stored) == info.compress_size:
            digest = bytes.fromhex(sha256)
            return StoredMember(info.compress_type, info.CRC, info.file_size, stored, digest)
        if info.compress_type == zipfile.ZIP_DEFLATED:
            data = zlib.decompress(stored, -zlib.MAX_WBITS)
        elif info.compress_type == zipfile.ZIP_STORED:
            data = stored
        else:
            return None
        digest = hashlib.sha256(data).digest()
        if digest.hex() != sha256 or zlib.crc32(data) != info.CRC:
            return None
        if _compression(data) != info.compress_type:
            return None  # this writer would store it otherwise
        if info.compress_type == zipfile.ZIP_DEFLATED and _deflate_level(data) is not None:
            return None  # a deflate stream does not say its level: maybe not this writer's
        return StoredMember(info.compress_type, info.CRC, len(data), stored, digest)


LOCAL_HEADER = struct.Struct(zipfile.structFileHeader)
LOCAL_SIGNATURE = zipfile.stringFileHeader
# Whatever reading a damaged wheel raises (RuntimeError: an encrypted member;
# NotImplementedError, a RuntimeError: an unknown compression; struct.error: a
# header cut short) means no reuse, never a failed stage.
UNREADABLE = (
    OSError,
    ValueError,
    KeyError,
    RuntimeError,
    struct.error,
    zipfile.BadZipFile,
    zlib.error,
    EOFError,
)


def _copy_member(
    archive: zipfile.ZipFile, name: str, stamp: tuple[int, ...], member: StoredMember
) -> str:
    """Append a member's stored bytes with the header `_write_member` would write.

    zipfile has no call for writing already-compressed data; this does what its
    writestr does (header at the end of the archive, entry listed for the central
    directory), minus the compression."""
    info = zipfile.ZipInfo(name, date_time=stamp)  # type: ignore[arg-type]
    info.external_attr = 0o644 << 16
    info.compress_type = member.compress_type
    info.CRC, info.file_size, info.compress_size = member.crc, member.size, len(member.stored)
    zip64 = member.size * 1.05 > zipfile.ZIP64_LIMIT  # writestr's rule
    archive.fp.seek(archive.start_dir)  # type: ignore[union-attr]
    info.header_offset = archive.start_dir
    archive.fp.write(info.FileHeader(zip64))  # type: ignore[union-attr]
    archive.fp.write(member.stored)  # type: ignore[union-attr]
    archive.start_dir = archive.fp.tell()  # type: ignore[union-attr]
    archive.filelist.append(info)
    archive.NameToInfo[name] = info
    archive._didModify = True  # else close() would not write the central directory
    return f"{name},sha256={_record_hash(member.digest)},{member.size}"


# Updating a trusted wheel (`_update_zip`) reads and writes zipfile's own records
# (its layouts and signatures) directly, and handles its thousands of members as
# columns (one `map` or slice per column, not a Python call per member): per-member
# work is most of an update's time when only a few of 15,000 members changed.
CENTRAL_HEADER = struct.Struct(zipfile.structCentralDir)
# Where a central header holds the fields an update reads (after its signature).
FLAGS_AT = 8
DATE_TIME_AT = 12
STORED_SIZE_AT = 20
SIZE_AT = 24
NAME_LENGTH_AT = 28
EXTRA_COMMENT_LENGTHS_AT = 30  # the extra field's length, then the comment's
CENTRAL_OFFSET_AT = CENTRAL_HEADER.size - 4  # its last field: the local header's offset
OFFSET_FIELD = struct.Struct("<L")
END_RECORD = struct.Struct(zipfile.structEndArchive)
END_RECORD64 = struct.Struct(zipfile.structEndArchive64)
END_LOCATOR64 = struct.Struct(zipfile.structEndArchive64Locator)
UTF8_NAME = 0x800  # the flag zipfile sets on a member whose name is not ASCII
COPY_CHUNK = 1 << 20
# A bundle member the previous wheel does not store with its content. Not -1: a
# member stored at index 0 must not continue from it (`_segments`).
NOT_STORED = -2


class Declined(Exception):
    """The previous wheel is not laid out as this writer lays out a plain wheel (members
    back to back, no ZIP64 member, the same date): update it member by member."""


@dataclass(frozen=True)
class Directory:
    """A previous wheel's central directory as stored, one list entry per member.

    A member's local entry (header and stored bytes) runs from its offset to the next
    member's; the last one's up to the central directory (`offsets` ends with its
    offset). `starts` says where each member's central header starts in `headers`
    (and ends with its length); `lines` are the wheel's RECORD lines, in member order."""

    names: list[str]
    offsets: list[int]
    starts: list[int]
    headers: bytes
    lines: list[str]

    def stored_indexes(self, members: Sequence[tuple[str, str]]) -> list[int]:
        """For each member (name, sha256 as hex), the index of the member stored under
        that name with that content, or NOT_STORED: RECORD's `name,sha256=<hash>,`
        looked up for all members at once. When the wheel holds the same members first
        (none added or removed), each is compared with its own line, no lookup built."""
        if not members:
            return []
        names, hexdigests = zip(*members, strict=True)
        keys = list(map(add, map(add, names, repeat(",sha256=")), _record_hashes(hexdigests)))
        if self.names[: len(names)] == list(names):
            found = list(range(len(names)))
            prefixes = map(add, keys, repeat(","))
            for index in compress(count(), map(not_, map(str.startswith, self.lines, prefixes))):
                found[index] = NOT_STORED
            return found
        stored = dict(
            zip(map(itemgetter(0), map(str.rpartition, self.lines, repeat(","))), count())
        )
        return list(map(stored.get, keys, repeat(NOT_STORED)))


def _record_hashes(hexdigests: Sequence[str]) -> list[str]:
    """RECORD's form of each sha256 (`_record_hash`), all in one encoding: each digest
    followed by a zero byte is 33 bytes, 44 base64 characters of which the first 43
    are the digest's unpadded encoding. A value that is not a sha256 in hex (none that
    the bundle stage writes) gets one no RECORD line has."""
    try:
        joined = bytes.fromhex("00".join(hexdigests) + "00")
    except ValueError:
        joined = b""
    # Each of 64 characters and 33 bytes in all: each was 32 bytes (fromhex skips spaces).
    if len(joined) != 33 * len(hexdigests) or set(map(len, hexdigests)) != {64}:
        return [_record_hash_of(hexdigest) for hexdigest in hexdigests]
    text = base64.urlsafe_b64encode(joined).decode()
    return [text[at : at + 43] for at in range(0, len(text), 44)]


def _record_hash_of(hexdigest: str) -> str:
    with contextlib.suppress(ValueError):
        digest = bytes.fromhex(hexdigest)
        if len(digest) == hashlib.sha256().digest_size:
            return _record_hash(digest)
    return ",not a sha256"  # a comma: never inside a RECORD hash


@dataclass
class Output:
    """The wheel being written: its file, its central directory and RECORD lines so far."""

    handle: BinaryIO
    central: bytearray = dataclasses.field(default_factory=bytearray)
    record: list[str] = dataclasses.field(default_factory=list)
    count: int = 0


def _update_zip(
    target: Path,
    previous: Path,
    root: Path,
    members: Iterable[tuple[str, str]],
    generated: dict[str, bytes],
    record_name: str,
) -> bool:
    """Write the wheel as `_write_zip` would, from a trusted previous wheel (this
    writer's, as it wrote it), in time that grows with the changed members.

    Each run of members stored there one after another with the content they have now
    is copied as one byte range: a local header depends on the name, content,
    compression and date only, all the same. Their central headers are taken as stored
    with offsets moved; only the other members are read and compressed. False (and
    nothing reused) when the previous wheel is unreadable or not in this writer's
    plain layout; the caller then writes member by member."""
    stamp = _date_time()
    try:
        with open(previous, "rb") as source, open(target, "wb") as handle:
            directory = _read_directory(source, stamp)
            output = Output(handle)
            _write_update(output, directory, source, root, members, stamp)
            for name, data in sorted(generated.items()):
                _write_new(output, name, data, hashlib.sha256(data).digest(), stamp)
            output.record.append(f"{record_name},,")
            listing = ("\n".join(output.record) + "\n").encode()
            _write_new(output, record_name, listing, None, stamp)
            _write_central_directory(output)
    except (Declined, *UNREADABLE):
        return False
    return True


def _write_update(
    output: Output,
    directory: Directory,
    source: BinaryIO,
    root: Path,
    members: Iterable[tuple[str, str]],
    stamp: tuple[int, ...],
) -> None:
    """The bundle's members in order: unchanged ones in runs from `source`."""
    members = sorted(members)
    found = directory.stored_indexes(members)
    for start, end in _segments(found):
        if found[start] == NOT_STORED:
            name, recorded = members[start]
            data, digest = _read_member(root, name, recorded)
            _write_new(output, name, data, digest, stamp)
        else:
            _copy_run(directory, range(found[start], found[start] + end - start), source, output)


def _segments(found: list[int]) -> list[tuple[int, int]]:
    """The (start, end) of each run of `found` that counts up by one (members stored
    one after another) and of each NOT_STORED entry, in order."""
    if not found:
        return []
    breaks = compress(count(1), map(ne, found[1:], map(add, found, repeat(1))))
    edges = [0, *breaks, len(found)]
    return list(pairwise(edges))


def _read_directory(handle: BinaryIO, stamp: tuple[int, ...]) -> Directory:
    """The central directory of the wheel `handle` reads, and its RECORD, whose lines
    name its members in order: their lengths place the central headers."""
    offset, size, count = _end_of(handle)
    handle.seek(offset)
    headers = handle.read(size)
    lines = _record_lines(handle, headers)
    if len(lines) != count:
        raise Declined
    names = [line.rsplit(",", 2)[0] for line in lines]
    joined = "".join(names)
    if joined.isascii():
        lengths, flags = list(map(len, names)), [0] * count
    else:
        lengths = [len(name.encode()) for name in names]
        flags = [0 if name.isascii() else UTF8_NAME for name in names]
    starts = list(accumulate(map(add, lengths, repeat(CENTRAL_HEADER.size)), initial=0))
    if starts[-1] != len(headers):
        raise Declined
    name_starts = list(map(add, starts, repeat(CENTRAL_HEADER.size)))
    fixed = FixedParts(b"".join(map(headers.__getitem__, map(slice, starts[:-1], name_starts))))
    stored_names = b"".join(map(headers.__getitem__, map(slice, name_starts, starts[1:])))
    name_lengths, stored_sizes = fixed.field(NAME_LENGTH_AT, 2), fixed.field(STORED_SIZE_AT, 4)
    offsets = [*fixed.field(CENTRAL_OFFSET_AT, 4), offset]
    # This writer's plain members: names as zipfile encodes them, no extra field or
    # comment, the date a header of `stamp` has, no ZIP64 local header (writestr's rule).
    if (
        name_lengths != lengths
        or stored_names != joined.encode()
        or fixed.field(FLAGS_AT, 2) != flags
        or not fixed.everywhere(0, zipfile.stringCentralDir)
        or not fixed.everywhere(DATE_TIME_AT, _dos_date_time(stamp))
        or not fixed.everywhere(EXTRA_COMMENT_LENGTHS_AT, bytes(4))
        or max(fixed.field(SIZE_AT, 4)) * 1.05 > zipfile.ZIP64_LIMIT
    ):
        raise Declined
    local_sizes = map(add, map(add, name_lengths, stored_sizes), repeat(LOCAL_HEADER.size))
    if list(accumulate(local_sizes, initial=0)) != offsets:
        raise Declined  # members not back to back: a range copy would take other bytes
    return Directory(names, offsets, starts, headers, lines)


@dataclass(frozen=True)
class FixedParts:
    """Central headers without their names, back to back: as each is as long, a field
    of all of them is a few slices with a step (one per byte), not a call per header."""

    data: bytes

    def field(self, at: int, size: int) -> list[int]:
        """The little-endian field of `size` bytes (2 or 4) at `at` of every header."""
        count = len(self.data) // CENTRAL_HEADER.size
        gathered = bytearray(size * count)
        for byte in range(size):
            gathered[byte::size] = self.data[at + byte :: CENTRAL_HEADER.size]
        return list(struct.unpack(f"<{count}{'H' if size == 2 else 'L'}", gathered))

    def everywhere(self, at: int, value: bytes) -> bool:
        """Whether every header holds `value` at `at`."""
        count = len(self.data) // CENTRAL_HEADER.size
        columns = (self.data[at + byte :: CENTRAL_HEADER.size] for byte in range(len(value)))
        return all(
            column == bytes([expected]) * count
            for column, expected in zip(columns, value, strict=True)
        )


def _dos_date_time(stamp: tuple[int, ...]) -> bytes:
    """The time and date fields of a header written with `stamp`, as zipfile encodes them."""
    info = zipfile.ZipInfo("-", date_time=stamp)  # type: ignore[arg-type]
    info.CRC = 0
    fields = LOCAL_HEADER.unpack_from(info.FileHeader())
    return struct.pack("<HH", fields[5], fields[6])


def _end_of(handle: BinaryIO) -> tuple[int, int, int]:
    """The central directory's offset, size and entry count, from the end records
    (ZIP64 ones when present), as zipfile writes them: no archive comment."""
    end = handle.seek(-END_RECORD.size, os.SEEK_END)
    signature, _, _, _, count, size, offset, comment = END_RECORD.unpack(
        handle.read(END_RECORD.size)
    )
    if signature != zipfile.stringEndArchive or comment:
        raise Declined
    if end >= END_LOCATOR64.size:
        handle.seek(end - END_LOCATOR64.size)
        locator = END_LOCATOR64.unpack(handle.read(END_LOCATOR64.size))
        if locator[0] == zipfile.stringEndArchive64Locator:
            end = locator[2]
            handle.seek(end)
            fields = END_RECORD64.unpack(handle.read(END_RECORD64.size))
            if fields[0] != zipfile.stringEndArchive64:
                raise Declined
            count, size, offset = fields[7], fields[8], fields[9]
    if offset + size != end:
        raise Declined
    return offset, size, count


def _record_lines(handle: BinaryIO, headers: bytes) -> list[str]:
    """The lines of the RECORD member, the last one, whose central header ends `headers`."""
    at = headers.rfind(zipfile.stringCentralDir)
    if at < 0:
        raise Declined
    fields = CENTRAL_HEADER.unpack_from(headers, at)
    name = headers[at + CENTRAL_HEADER.size :]
    if len(name) != fields[12] or not name.endswith(b".dist-info/RECORD"):
        raise Declined
    handle.seek(fields[18] + LOCAL_HEADER.size + fields[12])
    stored = handle.read(fields[10])
    if fields[6] == zipfile.ZIP_DEFLATED:
        listing = zlib.decompress(stored, -zlib.MAX_WBITS)
    elif fields[6] == zipfile.ZIP_STORED:
        listing = stored
    else:
        raise Declined
    if zlib.crc32(listing) != fields[9] or not listing.endswith(b"\n"):
        raise Declined
    return listing[:-1].decode().split("\n")


def _copy_run(directory: Directory, run: range, source: BinaryIO, output: Output) -> None:
    """Copy the members `run` indexes, stored one after another, as one byte range."""
    first, end = directory.offsets[run.start], directory.offsets[run.stop]
    moved = output.handle.tell() - first
    if directory.offsets[run.stop - 1] + moved > zipfile.ZIP64_LIMIT:
        raise Declined  # its central header would need a ZIP64 offset
    _copy_bytes(source, output.handle, first, end - first)
    start, stop = directory.starts[run.start], directory.starts[run.stop]
    at = len(output.central)
    output.central += directory.headers[start:stop]
    if moved:
        fields = map(
            add, directory.starts[run.start : run.stop], repeat(at - start + CENTRAL_OFFSET_AT)
        )
        offsets = map(add, directory.offsets[run.start : run.stop], repeat(moved))
        for _ in map(OFFSET_FIELD.pack_into, repeat(output.central), fields, offsets):
            pass  # each call moves one offset; the loop only drives them
    output.record += directory.lines[run.start : run.stop]
    output.count += len(run)


def _copy_bytes(source: BinaryIO, target: BinaryIO, first: int, length: int) -> None:
    """Append `length` bytes of `source` from `first` to `target`: within the kernel
    where the system can (`copy_file_range`, Linux), else (and for what it left, at
    the source's end too) through memory."""
    target.flush()
    at = target.tell()
    done = 0
    copy_range = getattr(os, "copy_file_range", None)
    with contextlib.suppress(OSError):  # not on this file system: copied through memory
        while copy_range and done < length:
            copied = copy_range(
                source.fileno(), target.fileno(), length - done, first + done, at + done
            )
            if not copied:
                break  # the source's end: found again below
            done += copied
    target.seek(at + done)
    source.seek(first + done)
    while done < length:
        chunk = source.read(min(length - done, COPY_CHUNK))
        if not chunk:
            raise EOFError(f"the previous wheel ends {length - done} bytes early")
        target.write(chunk)
        done += len(chunk)


def _write_new(
    output: Output, name: str, data: bytes, digest: bytes | None, stamp: tuple[int, ...]
) -> None:
    """Write one member as `_write_member` writes it: zipfile writes it alone into
    memory, whose local entry and central header (its offset moved) are taken."""
    offset = output.handle.tell()
    if offset > zipfile.ZIP64_LIMIT:
        raise Declined  # its central header would need a ZIP64 offset
    scratch = io.BytesIO()
    with zipfile.ZipFile(scratch, "w") as archive:
        line = _write_member(archive, name, data, stamp, digest)
        local_end = archive.start_dir
    written = scratch.getvalue()
    fields = CENTRAL_HEADER.unpack_from(written, local_end)
    header_end = local_end + CENTRAL_HEADER.size + fields[12] + fields[13] + fields[14]
    output.handle.write(written[:local_end])
    at = len(output.central)
    output.central += written[local_end:header_end]
    OFFSET_FIELD.pack_into(output.central, at + CENTRAL_OFFSET_AT, offset)
    if line:
        output.record.append(line)
    output.count += 1


def _write_central_directory(output: Output) -> None:
    """The central directory and end records, by zipfile's rules for them (ZIP64 end
    records past its limits), so the archive ends as a fresh write's does."""
    offset = output.handle.tell()
    output.handle.write(output.central)
    count, size = output.count, len(output.central)
    if count > zipfile.ZIP_FILECOUNT_LIMIT or max(offset, size) > zipfile.ZIP64_LIMIT:
        output.handle.write(
            END_RECORD64.pack(
                zipfile.stringEndArchive64, 44, 45, 45, 0, 0, count, count, size, offset
            )
        )
        output.handle.write(
            END_LOCATOR64.pack(zipfile.stringEndArchive64Locator, 0, offset + size, 1)
        )
        count, size, offset = min(count, 0xFFFF), min(size, 0xFFFFFFFF), min(offset, 0xFFFFFFFF)
    output.handle.write(
        END_RECORD.pack(zipfile.stringEndArchive, 0, 0, count, count, size, offset, 0)
    )
