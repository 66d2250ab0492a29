"""A small, reproducible wheel writer for generated bundles.

Standard backends always deflate, which costs time and gains nothing on
NEFFs (their payload is already gzip); they also need SOURCE_DATE_EPOCH or VCS
tweaks to be reproducible. This writer stores a file when deflating does not
pay, deflates big files at zlib's fastest level in chunks deflated alone, writes
entries in name order (as a bundle lists its files), and fixes every timestamp, so
equal inputs give a byte-identical wheel. A wheel it wrote is updated in place from
an index kept beside it: unchanged members copied as stored, only changed chunks
deflated again, with the same bytes as a fresh write. Names, versions and tags come
from `packaging`.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import functools
import hashlib
import io
import json
import os
import re
import struct
import sys
import zipfile
import zlib
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate, compress, count, pairwise, repeat
from operator import add, itemgetter, ne, sub
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from packaging.tags import Tag
from packaging.utils import canonicalize_name
from packaging.version import Version

from nkibuild import __version__, plaindata
from nkibuild.bundle import BundleProject
from nkibuild.errors import BuildError, UsageError
from nkibuild.fsutil import atomic_output, atomic_write_bytes, atomic_write_text, stat_stamp
from nkibuild.manifest.model import Package
from nkibuild.plaindata import only
from nkibuild.text import printable

TAG = Tag("py3", "none", "any")
WRITER_FILE = "wheel-writer.json"  # in the state dir: which writer made the wheels in dist/
INDEX_FILE = "wheel-index.pickle"  # beside it: what updating each of them needs (`WheelIndex`)
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
# ... and in chunks of about this size, each deflated alone (`_deflate_in_chunks`), so
# an update deflates again only the chunks whose bytes changed: a kernel edit changes
# 2 of the 98 chunks of a 10,000-unit project's `_build.json`. A chunk ends at the
# first end of a line or of a JSON object (`CHUNK_END`) past this size, if there is one
# before twice it: a line that got longer moves the next chunk's start with it, so the
# chunks after it have the content they had.
DEFLATE_CHUNK_BYTES = 1 << 16
CHUNK_END = re.compile(rb"\n|\},")
# What ends a stream of chunks: an empty final block, as zlib ends a stream of no input.
FINAL_BLOCK = zlib.compressobj(FAST_DEFLATE_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS).flush()

if TYPE_CHECKING:
    from concurrent.futures import Executor, Future, ThreadPoolExecutor

    from nkibuild.context import BuildContext


def wheel_file_name(package: Package) -> str:
    distribution = canonicalize_name(package.name).replace("-", "_")
    return f"{distribution}-{Version(package.version)}-{TAG}.whl"


def run(context: BuildContext) -> list[Path]:
    """The wheel stage of a build: the generated bundle project -> its wheels in dist/
    (the bundle's, and one per target when its NEFFs are split out).

    A wheel it replaces lends its unchanged members (see `Previous`) when the same
    writer made it (`WRITER_FILE` says), and is updated in place from its index
    (`INDEX_FILE`, see `_update_zip`) while it has the stat its index was stamped with.
    Neither file is removed first: a build killed after a wheel was replaced leaves an
    index stamped with the stat of the wheel it replaced, which lends nothing. One
    worker thread takes what releases the GIL while this one goes on (`Background`).
    The wheels and the index it replaces keep a second name in the state dir
    (`_set_aside`), removed by the worker when the next build's wheel stage starts: a
    rename frees no blocks on the way (ms for MBs on ext4)."""
    from nkibuild.bundle import load_bundle
    from nkibuild.bundle.buildinfo import FILE_NAME

    bundle_dir = context.layout.bundle_dir(context.manifest)
    writer_file = context.layout.state_dir / WRITER_FILE
    index_file = context.layout.state_dir / INDEX_FILE
    identity = writer_identity()
    same_writer = _written_by(writer_file, identity)
    dist_dir, state_dir = context.layout.dist_dir, context.layout.state_dir
    with _worker() as worker:
        # `_build.json`, which every change of the bundle rewrites (megabytes for
        # thousands of kernels), read and hashed while the index and bundle.json load;
        # then what the last build set aside is removed, before any copy is handed over.
        info = bundle_dir / context.manifest.package.import_name / FILE_NAME
        ahead = {str(info): worker.submit(MemberData.read, info)} if same_writer else {}
        for aside in _set_aside_in(state_dir):
            worker.submit(aside.unlink, missing_ok=True)
        reuse = _indexes(index_file) if same_writer else None
        project = load_bundle(bundle_dir, build_info=False)
        wheels = [
            write_wheel(
                each, dist_dir, reuse=reuse, worker=worker, ahead=ahead, set_aside=state_dir
            )
            for each in (project, *project.parts)
        ]
        indexes = {}
        for wheel, index in wheels:
            stamp = stat_stamp(wheel)
            if index is not None and stamp is not None:
                indexes[wheel.name] = dataclasses.replace(index, stamp=stamp).plain()
        _set_aside(index_file, state_dir)
        atomic_write_bytes(index_file, plaindata.dumps(indexes), durable=False)
    if not same_writer:
        atomic_write_text(writer_file, json.dumps({"writer": identity}), durable=False)
    return [wheel for wheel, _ in wheels]


def _indexes(index_file: Path) -> dict[str, WheelIndex]:
    """The indexes of the wheels in dist/ as they were written (none from a file that is
    missing or damaged); each is used only while its wheel has the stat it was stamped
    with."""
    try:
        plain = plaindata.loads(index_file.read_bytes())
    except (OSError, ValueError):
        return {}
    if not isinstance(plain, dict):
        return {}
    indexes = {name: WheelIndex.from_plain(value) for name, value in plain.items()}
    return {name: index for name, index in indexes.items() if index is not None}


def _written_by(writer_file: Path, identity: dict[str, str]) -> bool:
    """Whether the writer `identity` made what dist/ holds (as far as `writer_file`
    says: another writer, or none known, and nothing of dist/ is reused)."""
    try:
        record = json.loads(writer_file.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and record.get("writer") == identity


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
    project: BundleProject, dist_dir: Path, *, reuse: Mapping[str, WheelIndex] | None = None
) -> Path:
    """`write_wheel`'s wheel."""
    return write_wheel(project, dist_dir, reuse=reuse)[0]


def _worker() -> ThreadPoolExecutor:
    # Imported here: every build imports this module for the wheel task's outputs,
    # a build with nothing to do included; concurrent.futures costs it ~8 ms.
    from concurrent.futures import ThreadPoolExecutor

    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="nkibuild-wheel")


def write_wheel(
    project: BundleProject,
    dist_dir: Path,
    *,
    reuse: Mapping[str, WheelIndex] | None = None,
    worker: Executor | None = None,
    ahead: Mapping[str, Future[MemberData]] | None = None,
    set_aside: Path | None = None,
) -> tuple[Path, WheelIndex | None]:
    """Write the distribution's wheel; return it and its index (None: not one an update
    copies from). With `reuse` (this writer wrote the wheels in `dist_dir`: the indexes
    of those it knows, see `run`), the members of the wheel already at the destination
    whose content is unchanged are copied over as they are stored, not read and
    compressed again; checked first unless the wheel still has the stat its index was
    made for, in which case they are copied in runs of consecutive members
    (`_update_zip`). `worker`: the thread that takes the copies, hashes and fsync that
    can run beside this one (one of its own if not given); it also frees the wheel
    replaced, maybe after this returns (the caller's `worker` is done with it when shut
    down). `ahead`: bundle files being read and hashed in `worker`, by path, taken by
    an update if they changed. `set_aside`: where the wheel replaced keeps a second name
    (`_set_aside`) for the caller to remove; by default it is removed by `worker`."""
    if worker is None:
        with _worker() as own:
            return write_wheel(
                project, dist_dir, reuse=reuse, worker=own, ahead=ahead, set_aside=set_aside
            )
    members = _members(project)
    destination = dist_dir / wheel_file_name(project.package)
    previous = destination if reuse is not None else None
    index = reuse.get(destination.name) if reuse is not None else None
    trusted = index is not None and stat_stamp(destination) == index.stamp
    key = _dist_info_key(project)
    if index is not None and index.dist_info[0] == key:
        generated = dict(index.dist_info[1])
    else:
        generated = dist_info_files(project)[1]
    record_name = f"{_dist_info_name(project.package)}/RECORD"
    root = project.directory
    aside = None
    try:
        # Not `durable`: each way of writing fsyncs the wheel itself (an update, in the
        # worker while it makes the index).
        with atomic_output(destination, durable=False) as tmp:
            written = None
            if index is not None and trusted:
                written = _update_zip(
                    tmp, destination, index, root, members, generated, record_name, worker, ahead
                )
            if written is None:
                with Previous.of(previous, trusted=trusted) as old:
                    written = _write_zip(tmp, root, members, generated, record_name, old)
                _fsync(tmp)
            aside = _set_aside(destination, set_aside) if set_aside else None
            kept = aside is not None
            aside = aside or _set_aside(destination, dist_dir)
    except BaseException:
        if aside is not None:
            aside.unlink(missing_ok=True)
        raise
    if aside is not None and not kept:
        worker.submit(aside.unlink, missing_ok=True)
    if written is not None:
        written = dataclasses.replace(written, dist_info=(key, generated))
    return destination, written


def _dist_info_key(project: BundleProject) -> str:
    """What `dist_info_files` makes a distribution's files of (besides this writer's
    code, which the writer record covers): its package, requirements and targets, its
    parts', and the versions of nkibuild (WHEEL names it) and packaging (which writes
    the specifiers)."""
    import packaging

    parts = [(part.package, part.target) for part in project.parts]
    inputs = (project.package, project.requirements, project.targets, project.target, parts)
    return repr((*inputs, __version__, packaging.__version__))


def _fsync(path: Path) -> None:
    with open(path, "rb+") as handle:
        os.fsync(handle.fileno())


def _set_aside(path: Path, directory: Path) -> Path | None:
    """A second name (hard link) in `directory` for the file at `path`, about to be
    replaced, so that the rename over it does not free its blocks (ms for a file of MBs,
    on ext4): the caller removes it later, in a worker. A hidden name `.*.old-*`, as an
    interrupted writer leaves (`fsutil.LEFTOVER_PATTERNS`: what a build killed in
    between leaves is swept by the next). None if there is no file, or it cannot be
    linked there (another file system: then the rename frees it)."""
    import secrets

    aside = directory / f".{path.name}.old-{secrets.token_hex(4)}"
    try:
        os.link(path, aside, follow_symlinks=False)
    except OSError:
        return None
    return aside


def _set_aside_in(directory: Path) -> list[Path]:
    """What `_set_aside` left in `directory` (and any other interrupted writer's
    `.*.old-*` there: garbage, while the build holds the build dir's lock)."""
    import fnmatch

    try:
        with os.scandir(directory) as entries:
            names = [entry.name for entry in entries if not entry.is_dir(follow_symlinks=False)]
    except OSError:
        return []
    return [directory / name for name in names if fnmatch.fnmatchcase(name, ".*.old-*")]


def _members(project: BundleProject) -> Sequence[tuple[str, str]]:
    """The bundle's files in its import package, in the order of its files (sorted by
    name, as a `BundleProject` keeps them): the wheel's order, fresh or updated. Sorted,
    they are the files from the first whose name starts with "<import name>/" to the
    first past them ("<import name>0", "0" following "/")."""
    files, package = project.files, project.package.import_name
    return files[bisect_left(files, (f"{package}/",)) : bisect_left(files, (f"{package}0",))]


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
    dist_info = _dist_info_name(package)
    generated = {
        f"{dist_info}/METADATA": metadata(project).encode(),
        f"{dist_info}/WHEEL": _wheel_file().encode(),
    }
    if project.target is None:  # tools discover bundles, not their NEFF parts
        generated[f"{dist_info}/entry_points.txt"] = _entry_points(package.import_name).encode()
    return dist_info, generated


def _dist_info_name(package: Package) -> str:
    return wheel_file_name(package).rsplit("-", 3)[0] + ".dist-info"


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
    members: Sequence[tuple[str, str]],
    generated: dict[str, bytes],
    record_name: str,
    previous: Previous | None = None,
) -> WheelIndex | None:
    """Members (path, sha256 recorded by the bundle stage) one at a time, then
    metadata, then RECORD. A member whose bytes no longer match its recorded sha256 was
    changed after the bundle was generated: refuse to package it. A member the previous
    wheel holds with that sha256 is copied from it as stored. Returns the wheel's index
    (what an update of it needs), or None if it has ZIP64 records an update would not
    copy."""
    stamp = _date_time()
    record, shas, chunked = [], [], {}
    with zipfile.ZipFile(target, "w") as archive:
        for name, recorded in members:
            stored = previous.stored(name, recorded) if previous else None
            if stored is not None:
                _copy_member(archive, name, stamp, stored)
                record.append(_record_line(name, stored.digest, stored.size))
                shas.append(stored.digest.hex())
                continue
            data, digest = _read_member(root, name, recorded)
            record.append(_write_member(archive, name, data, stamp, digest, chunked))
            shas.append(digest.hex())
        for name, data in sorted(generated.items()):
            digest = _sha256(data)
            record.append(_write_member(archive, name, data, stamp, digest, chunked))
        record.append(f"{record_name},,")
        listing = ("\n".join(record) + "\n").encode()
        _write_member(archive, record_name, listing, stamp, None, chunked)
        entries, directory_at = list(archive.filelist), archive.start_dir
    contents = Contents(
        names="\0".join(name for name, _ in members).encode(),
        shas=shas,
        record=record[: len(members)],
        chunks={
            info.filename: (at, chunked[info.filename])
            for at, info in enumerate(entries)
            if info.filename in chunked
        },
    )
    return contents.index_of(target, entries, directory_at, _dos_date_time(stamp))


def _read_member(root: Path, name: str, recorded: str) -> tuple[bytes, bytes]:
    """A bundle file's bytes and sha256, refused if they are no longer what the bundle
    stage recorded: it was changed after the bundle was generated."""
    data = _bundle_file(root, name)
    return data, _checked(root, name, recorded, _sha256(data))


def _bundle_file(root: Path, name: str) -> bytes:
    try:
        return (root / name).read_bytes()
    except FileNotFoundError:
        raise BuildError(
            f"{root / name} was removed after the bundle was generated; build again "
            "to write it back"
        ) from None


def _checked(root: Path, name: str, recorded: str, digest: bytes) -> bytes:
    """`digest`, the sha256 of the bundle file `name` as read, if it is the one the
    bundle stage recorded."""
    if recorded and digest.hex() != recorded:
        raise BuildError(
            f"{root / name} changed after the bundle was generated (sha256 differs "
            "from bundle.json); rebuild the bundle instead of editing its files"
        )
    return digest


def _write_member(
    archive: zipfile.ZipFile,
    name: str,
    content: bytes | MemberData,
    stamp: tuple[int, ...],
    digest: bytes | None,
    chunked: dict[str, Chunks],
    previous: Deflated | None = None,
) -> str:
    """Write one entry with fixed metadata; return its RECORD line (RECORD has no hash).
    A big deflated one is deflated in chunks (`_deflate_in_chunks`, which takes the
    unchanged chunks' deflated bytes from `previous`) and listed in `chunked`."""
    known = content if isinstance(content, MemberData) else MemberData(content)
    data = known.data
    info = zipfile.ZipInfo(name, date_time=stamp)  # type: ignore[arg-type]
    info.external_attr = 0o644 << 16
    info.compress_type = _compression(data)
    if info.compress_type == zipfile.ZIP_DEFLATED and _in_chunks(data):
        stream, chunked[name] = _deflate_in_chunks(data, previous)
        info.CRC = zlib.crc32(data) if known.crc is None else known.crc
        info.file_size = len(data)
        _append_stored(archive, info, stream)
    else:
        archive.writestr(info, data)
    return "" if digest is None else _record_line(name, digest, len(data))


def _record_line(name: str, digest: bytes, size: int) -> str:
    return f"{name},sha256={_record_hash(digest)},{size}"


def _record_hash(digest: bytes) -> str:
    """A sha256 as RECORD writes it: urlsafe base64 without padding (PEP 376/427)."""
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _in_chunks(data: bytes) -> bool:
    """Whether this writer deflates `data` (when it deflates it) at `FAST_DEFLATE_LEVEL`
    in chunks, not at zlib's default level in one stream as zipfile does."""
    return len(data) >= FAST_DEFLATE_BYTES


def _compression(data: bytes) -> int:
    if len(data) < 2 * SAMPLE_BYTES:
        return zipfile.ZIP_DEFLATED  # small files: deflating them costs nothing worth saving
    middle = len(data) // 2
    sample = data[middle : middle + SAMPLE_BYTES]
    gained = 1 - len(zlib.compress(sample, 1)) / len(sample)
    return zipfile.ZIP_DEFLATED if gained >= MIN_DEFLATE_GAIN else zipfile.ZIP_STORED


@dataclass(frozen=True)
class Chunks:
    """A member deflated in chunks (`_deflate_in_chunks`): the sha256 of each chunk of
    its content, each chunk's deflated length, and the CRC-32 of the deflated stream
    (what the chunks taken from it are checked with)."""

    digests: bytes
    lengths: tuple[int, ...]
    stream_crc: int

    def plain(self) -> tuple[bytes, tuple[int, ...], int]:
        return self.digests, self.lengths, self.stream_crc


@dataclass(frozen=True)
class Deflated:
    """A member's stream of deflated chunks as a previous wheel stores it."""

    chunks: Chunks
    stream: bytes

    def pieces(self) -> dict[bytes, bytes]:
        """Each chunk's deflated bytes by the sha256 of its content; none if the stream
        is not the one `chunks` describes (then nothing of it is taken)."""
        lengths, digests = self.chunks.lengths, self.chunks.digests
        if (
            zlib.crc32(self.stream) != self.chunks.stream_crc
            or len(digests) != DIGEST_BYTES * len(lengths)
            or sum(lengths) + len(FINAL_BLOCK) != len(self.stream)
        ):
            return {}
        ends = list(accumulate(lengths, initial=0))
        return {
            digests[DIGEST_BYTES * number : DIGEST_BYTES * (number + 1)]: self.stream[start:end]
            for number, (start, end) in enumerate(pairwise(ends))
        }


def _deflate_in_chunks(data: bytes, previous: Deflated | None = None) -> tuple[bytes, Chunks]:
    """`data` deflated as chunks (`_chunk_ends`), each by a compressor of its own ended
    with a full flush (no match reaches into another chunk, and each ends on
    a byte boundary), then an empty final block: one valid deflate stream whose every
    chunk's bytes depend on that chunk's content only. So a chunk `previous` deflated
    from the same content is taken as it is: the stream is byte for byte the one a
    fresh write gives, and an edit deflates again only the chunks it changed."""
    reusable = previous.pieces() if previous is not None else {}
    view = memoryview(data)
    digests, pieces = [], []
    for start, end in pairwise([0, *_chunk_ends(data)]):
        chunk = view[start:end]
        digest = hashlib.sha256(chunk).digest()
        piece = reusable.get(digest)
        if piece is None:
            compressor = zlib.compressobj(FAST_DEFLATE_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS)
            piece = compressor.compress(chunk) + compressor.flush(zlib.Z_FULL_FLUSH)
        digests.append(digest)
        pieces.append(piece)
    stream = b"".join([*pieces, FINAL_BLOCK])
    lengths = tuple(map(len, pieces))
    return stream, Chunks(b"".join(digests), lengths, zlib.crc32(stream))


def _chunk_ends(data: bytes) -> list[int]:
    """Where each chunk of `data` ends (`DEFLATE_CHUNK_BYTES`, `CHUNK_END`)."""
    ends = []
    at = 0
    while at < len(data):
        if len(data) - at <= DEFLATE_CHUNK_BYTES:
            at = len(data)
        else:
            found = CHUNK_END.search(data, at + DEFLATE_CHUNK_BYTES, at + 2 * DEFLATE_CHUNK_BYTES)
            at = found.end() if found else at + DEFLATE_CHUNK_BYTES
        ends.append(at)
    return ends


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
    does not say its level nor its chunks: no member deflated in chunks is taken); so
    the new wheel is byte for byte the one a fresh write gives. Anything unreadable: no
    reuse. A `trusted` wheel (this writer's, with the stat it was written with: its
    members are what this writer stored for those sha256s) skips unpacking them, which
    for thousands of NEFFs of many MB each is most of the stage's time."""

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
        digest = _sha256(data)
        if digest.hex() != sha256 or zlib.crc32(data) != info.CRC:
            return None
        if _compression(data) != info.compress_type:
            return None  # this writer would store it otherwise
        if info.compress_type == zipfile.ZIP_DEFLATED and _in_chunks(data):
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
) -> None:
    """Append a member's stored bytes with the header `_write_member` would write."""
    info = zipfile.ZipInfo(name, date_time=stamp)  # type: ignore[arg-type]
    info.external_attr = 0o644 << 16
    info.compress_type = member.compress_type
    info.CRC, info.file_size = member.crc, member.size
    _append_stored(archive, info, member.stored)


def _append_stored(archive: zipfile.ZipFile, info: zipfile.ZipInfo, stored: bytes) -> None:
    """Append an entry whose bytes are already stored as `info` says (its compression,
    CRC and size set). zipfile has no call for that; this does what its writestr does
    (header at the end of the archive, entry listed for the central directory), minus
    the compression."""
    info.compress_size = len(stored)
    zip64 = info.file_size * 1.05 > zipfile.ZIP64_LIMIT  # writestr's rule
    archive.fp.seek(archive.start_dir)  # type: ignore[union-attr]
    info.header_offset = archive.start_dir
    archive.fp.write(info.FileHeader(zip64))  # type: ignore[union-attr]
    archive.fp.write(stored)  # type: ignore[union-attr]
    archive.start_dir = archive.fp.tell()  # type: ignore[union-attr]
    archive.filelist.append(info)
    archive.NameToInfo[info.filename] = info
    archive._didModify = True  # else close() would not write the central directory


# Updating a trusted wheel (`_update_zip`) reads and writes zipfile's own records
# (its layouts and signatures) directly, and handles its thousands of members as
# columns (one `map` or slice per column, not a Python call per member): per-member
# work is most of an update's time when only a few of 15,000 members changed.
CENTRAL_HEADER = struct.Struct(zipfile.structCentralDir)
CENTRAL_OFFSET_AT = CENTRAL_HEADER.size - 4  # its last field: the local header's offset
OFFSET_FIELD = struct.Struct("<L")
END_RECORD = struct.Struct(zipfile.structEndArchive)
END_RECORD64 = struct.Struct(zipfile.structEndArchive64)
END_LOCATOR64 = struct.Struct(zipfile.structEndArchive64Locator)
END_SIGNATURES = (zipfile.stringEndArchive, zipfile.stringEndArchive64)
COPY_CHUNK = 1 << 20
# A member changed since the previous wheel at least this big is hashed in the worker
# (`Background.read`): a handover costs more than hashing a small file here.
BACKGROUND_HASH_BYTES = 1 << 20
# A bundle member the previous wheel does not store with its content. Not -1: a
# member stored at index 0 must not continue from it (`_segments`).
NOT_STORED = -2
SHA256_HEX = 64  # characters of a sha256 in hex, as bundle.json and the index hold it
DIGEST_BYTES = hashlib.sha256().digest_size


class Declined(Exception):
    """The previous wheel is not the one its index describes, or the new one would need
    ZIP64 records: written member by member instead."""


@dataclass(frozen=True)
class WheelIndex:
    """What updating a wheel in place needs to know of it, kept (`INDEX_FILE`) from when
    it was written, so that an update reads neither its central directory's entries
    nor its RECORD: the bundle members' names and sha256s (as single strings, compared
    whole), RECORD's lines for them, the length of each line, entry and central header
    (packed integers: a run of members copied takes its slice of each column), the
    members deflated in chunks, and the CRC-32 of the wheel from its central directory
    to its end, checked before anything is copied: the index describes the wheel with
    that directory (the stat, `stamp`, says the wheel is as written; that check finds
    an index that is not its own, or a wheel damaged in place)."""

    date: bytes  # every member's time and date fields, as headers hold them
    names: bytes  # the bundle members, in archive order, joined by NUL (UTF-8)
    shas: bytes  # their sha256s in hex, joined
    record: bytes  # RECORD's lines of the bundle members, each ended by a newline
    line_sizes: bytes  # the length of each of those lines
    entry_sizes: bytes  # each entry's length: local header and stored bytes
    header_sizes: bytes  # each entry's central header's length
    tail: int  # CRC-32 of the wheel from its central directory to its end
    check: int  # CRC-32 of the columns above that place bytes (`_checksum`)
    chunks: dict[str, tuple[int, Chunks]]  # entries deflated in chunks: name -> (entry, chunks)
    # The dist-info files but RECORD, and what made them (`_dist_info_key`): an update of
    # the same distribution takes them from here, not from packaging's specifier parser
    # (imported and its patterns compiled in each build process: ~7 ms).
    dist_info: tuple[str, dict[str, bytes]] = ("", {})
    stamp: str = ""

    @classmethod
    def made(
        cls,
        date: bytes,
        names: bytes,
        shas: bytes,
        columns: tuple[bytes, bytes, bytes, bytes],
        tail: bytes,
        chunks: dict[str, tuple[int, Chunks]],
    ) -> WheelIndex:
        """The index of a wheel just written: `columns` are its record, line, entry and
        header sizes; `tail` its bytes from the central directory to the end."""
        check = _checksum(*columns)
        return cls(date, names, shas, *columns, zlib.crc32(tail), check, chunks)

    @property
    def members(self) -> int:
        return len(self.shas) // SHA256_HEX

    def plain(self) -> tuple[object, ...]:
        """The index as plain data (`nkibuild.plaindata`)."""
        columns = [getattr(self, field.name) for field in dataclasses.fields(self)[:-3]]
        chunks = {name: (entry, chunk.plain()) for name, (entry, chunk) in self.chunks.items()}
        return (*columns, chunks, self.dist_info, self.stamp)

    @classmethod
    def from_plain(cls, value: object) -> WheelIndex | None:
        """The index `plain` gave, or None if `value` is not one (a damaged or older file)."""
        if not isinstance(value, tuple) or len(value) != len(dataclasses.fields(cls)):
            return None
        *columns, plain_chunks, dist_info, stamp = value
        if not (
            only(columns[:7], bytes)
            and only(columns[7:], int)
            and isinstance(stamp, str)
            and isinstance(plain_chunks, dict)
            and _plain_dist_info(dist_info)
        ):
            return None
        chunks = {}
        for name, entry in plain_chunks.items():
            if not (
                isinstance(name, str)
                and only([entry], tuple)
                and len(entry) == 2
                and only(entry[:1], int)
                and only([entry[1]], tuple)
                and len(entry[1]) == 3
                and only(entry[1][:1], bytes)
                and only(entry[1][1:2], tuple)
                and only([*entry[1][1], entry[1][2]], int)
            ):
                return None
            chunks[name] = (entry[0], Chunks(*entry[1]))
        index = cls(*columns, chunks=chunks, dist_info=dist_info, stamp=stamp)
        return index if index._consistent() else None

    def _consistent(self) -> bool:
        """Whether the columns agree with each other (counts and lengths)."""
        members = self.members
        entries = len(self.entry_sizes) // WORD
        return (
            len(self.shas) == SHA256_HEX * members
            and (self.names.count(b"\0") + 1 if self.names else 0) == members
            and len(self.line_sizes) == WORD * members
            and sum(_integers(self.line_sizes)) == len(self.record)
            and len(self.entry_sizes) == len(self.header_sizes) == WORD * entries
            and entries > members
            and self.check
            == _checksum(self.record, self.line_sizes, self.entry_sizes, self.header_sizes)
            and len(self.date) == 4
            and all(0 <= entry < entries for entry, _ in self.chunks.values())
        )


def _plain_dist_info(value: object) -> bool:
    """Whether `value` is a `WheelIndex.dist_info`: a key and files' names and bytes."""
    if not (isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str)):
        return False
    files = value[1]
    return isinstance(files, dict) and only(files, str) and only(files.values(), bytes)


WORD = 8  # bytes of each integer of an index's column


def _packed(values: Sequence[int]) -> bytes:
    """Non-negative integers as 8-byte little-endian words (how the index keeps them)."""
    words = array("Q", values)
    if sys.byteorder == "big":
        words.byteswap()
    return words.tobytes()


def _checksum(*columns: bytes) -> int:
    """A CRC-32 of an index's columns that say where bytes are (RECORD's lines, the
    entries' and headers' lengths), checked when it is read: a damaged index would
    copy the wrong bytes."""
    crc = 0
    for column in columns:
        crc = zlib.crc32(column, crc)
    return crc


def _integers(data: bytes) -> list[int]:
    """The integers `_packed` packed."""
    words = array("Q")
    words.frombytes(data[: len(data) - len(data) % WORD])
    if sys.byteorder == "big":
        words.byteswap()
    return words.tolist()


@dataclass
class Contents:
    """What an index records of a wheel besides where its entries are: its bundle
    members (names and sha256s), their RECORD lines, its entries deflated in chunks."""

    names: bytes
    shas: list[str]
    record: list[str]
    chunks: dict[str, tuple[int, Chunks]]

    def index_of(
        self, target: Path, entries: list[zipfile.ZipInfo], directory_at: int, date: bytes
    ) -> WheelIndex | None:
        """The index of the wheel zipfile just wrote at `target` (`entries` its infos),
        or None when an entry has ZIP64 fields (an update does not move those)."""
        limit = zipfile.ZIP64_LIMIT
        if directory_at > limit or any(
            info.file_size * 1.05 > limit or info.compress_size > limit or info.extra
            for info in entries
        ):
            return None
        offsets = [*(info.header_offset for info in entries), directory_at]
        header_sizes = [CENTRAL_HEADER.size + len(info.filename.encode()) for info in entries]
        starts = list(accumulate(header_sizes, initial=0))
        with open(target, "rb") as handle:
            handle.seek(directory_at)
            tail = handle.read()
        signatures = b"".join(tail[start : start + 4] for start in starts[:-1])
        if (
            signatures != zipfile.stringCentralDir * len(entries)
            or tail[starts[-1] : starts[-1] + 4] not in END_SIGNATURES
        ):
            return None  # not the central headers zipfile writes without extra fields
        text = "".join(f"{line}\n" for line in self.record).encode()
        if len(text) == sum(map(len, self.record)) + len(self.record):  # all ASCII
            lengths = [len(line) + 1 for line in self.record]
        else:
            lengths = [len(line.encode()) + 1 for line in self.record]
        entry_sizes = _packed(list(map(sub, offsets[1:], offsets)))
        columns = (text, _packed(lengths), entry_sizes, _packed(header_sizes))
        shas = "".join(self.shas).encode()
        return WheelIndex.made(date, self.names, shas, columns, tail, self.chunks)


@dataclass
class Directory:
    """A previous wheel's central directory as stored, with its index.

    A member's local entry (header and stored bytes) runs from its offset to the next
    member's; the last one's up to the central directory (`offsets` ends with its
    offset). `starts` says where each entry's central header starts in `headers`
    (and ends with its length); `line_starts` where each member's RECORD line starts
    in the index's `record` (and ends with its length)."""

    index: WheelIndex
    headers: bytes
    offsets: list[int]
    starts: list[int]
    line_starts: list[int]

    @classmethod
    def read(cls, source: BinaryIO, index: WheelIndex) -> Directory:
        """The directory of the wheel `source` reads, which `index` describes; Declined
        if the wheel's directory and end records are not the ones it was written with."""
        offsets = list(accumulate(_integers(index.entry_sizes), initial=0))
        source.seek(offsets[-1])
        tail = source.read()
        if zlib.crc32(tail) != index.tail:
            raise Declined
        starts = list(accumulate(_integers(index.header_sizes), initial=0))
        if tail[starts[-1] : starts[-1] + 4] not in END_SIGNATURES:
            raise Declined  # the central headers do not end where the index says
        line_starts = list(accumulate(_integers(index.line_sizes), initial=0))
        return cls(index, tail[: starts[-1]], offsets, starts, line_starts)

    @functools.cached_property
    def names(self) -> list[str]:
        return self.index.names.decode().split("\0") if self.index.names else []

    def segments(
        self, members: Sequence[tuple[str, str]], names: bytes
    ) -> list[tuple[int, int, int]]:
        """The members (name, sha256 as hex; `names` joined by NUL) in segments, in
        order: (start, end, at) for each run `members[start:end]` the wheel stores one
        after another from its member `at` with the content they have, and for each
        member it does not store so (`at` NOT_STORED). When the wheel holds the same
        members (none added, removed or renamed), the sha256s are compared as one
        string, only its differing parts narrowed down: no step per member."""
        shas = "".join(map(itemgetter(1), members))
        if (
            names == self.index.names
            and shas.isascii()
            and set(map(len, map(itemgetter(1), members))) <= {SHA256_HEX}
        ):
            changed = _differing_slots(shas.encode(), self.index.shas, SHA256_HEX)
            return _around(sorted(changed), len(members))
        old = self.index.shas.decode()
        hexdigests = (old[at : at + SHA256_HEX] for at in range(0, len(old), SHA256_HEX))
        stored = dict(zip(zip(self.names, hexdigests, strict=True), count()))
        found = list(map(stored.get, members, repeat(NOT_STORED)))
        return [(start, end, found[start]) for start, end in _segments(found)]

    def deflated(self, name: str, source: BinaryIO) -> Deflated | None:
        """The stream of the entry `name` if the wheel holds it deflated in chunks."""
        entry = self.index.chunks.get(name)
        if entry is None:
            return None
        position, chunks = entry
        start = self.offsets[position] + LOCAL_HEADER.size + len(name.encode())
        source.seek(start)
        return Deflated(chunks, source.read(self.offsets[position + 1] - start))


def _differing_slots(new: bytes, old: bytes, width: int) -> list[int]:
    """The indexes of the `width`-long slots in which two byte strings differ (a slot past
    the shorter one's end included): halves compared whole, only unequal ones split
    further, so a few changed slots among thousands cost a few dozen comparisons."""
    found = []
    pending = [(0, max(len(new), len(old)) // width)]
    while pending:
        first, end = pending.pop()
        if new[first * width : end * width] == old[first * width : end * width]:
            continue
        if end - first == 1:
            found.append(first)
            continue
        middle = (first + end) // 2
        pending += [(middle, end), (first, middle)]
    return found


@dataclass
class Output:
    """The wheel being written by an update: its file (written by the worker alone: the
    bytes of new members and records kept here until the next run's copy or the end,
    then handed over in one write; a write beside a copy into the same file would wait
    for the copy), its central directory and RECORD so far, and the columns of its
    index."""

    target: int  # the file's descriptor
    background: Background
    position: int = 0  # where what is written so far ends
    unwritten: list[bytes] = dataclasses.field(default_factory=list)  # what ends there
    central: bytearray = dataclasses.field(default_factory=bytearray)
    record: bytearray = dataclasses.field(default_factory=bytearray)
    shas: list[bytes] = dataclasses.field(default_factory=list)
    line_sizes: list[bytes] = dataclasses.field(default_factory=list)
    entry_sizes: list[bytes] = dataclasses.field(default_factory=list)
    header_sizes: list[bytes] = dataclasses.field(default_factory=list)
    chunks: dict[str, tuple[int, Chunks]] = dataclasses.field(default_factory=dict)
    count: int = 0

    def index(self, names: bytes, date: bytes, members_end: int, tail: bytes) -> WheelIndex:
        """The index of the wheel written, whose bundle members are `names` (their RECORD
        lines the first `members_end` bytes of `record`) and whose central directory and
        end records are `tail`."""
        columns = (
            bytes(self.record[:members_end]),
            *map(b"".join, (self.line_sizes, self.entry_sizes, self.header_sizes)),
        )
        return WheelIndex.made(date, names, b"".join(self.shas), columns, tail, self.chunks)

    def write(self, data: bytes) -> None:
        """Append `data` (kept until `hand_over`)."""
        self.unwritten.append(data)
        self.position += len(data)

    def hand_over(self) -> None:
        """Have the worker write the bytes kept, at their place."""
        if self.unwritten:
            data = b"".join(self.unwritten)
            self.background.submit(_write_at, self.target, data, self.position - len(data))
            self.unwritten = []


def _write_at(target: int, data: bytes, at: int) -> None:
    done = 0
    while done < len(data):
        done += os.pwrite(target, memoryview(data)[done:], at + done)


def _update_zip(
    target: Path,
    previous: Path,
    index: WheelIndex,
    root: Path,
    members: Sequence[tuple[str, str]],
    generated: dict[str, bytes],
    record_name: str,
    worker: Executor,
    ahead: Mapping[str, Future[MemberData]] | None = None,
) -> WheelIndex | None:
    """Write the wheel as `_write_zip` would, from a trusted previous wheel (this
    writer's, as it wrote it, described by `index`), in time that grows with the
    changed members; return the new wheel's index.

    Each run of members stored there one after another with the content they have now
    is copied as one byte range: a local header depends on the name, content,
    compression and date only, all the same. Their central headers are taken as stored
    with offsets moved, their RECORD lines from the index; only the other members are
    read and compressed (of one deflated in chunks, only its changed chunks). None (and
    nothing reused) when the previous wheel is not the one `index` describes or the new
    one needs ZIP64 records; the caller then writes member by member.

    The runs are copied, the big members hashed, and the wheel fsynced (written and
    durable when this returns) in `worker` meanwhile."""
    stamp = _date_time()
    date = _dos_date_time(stamp)
    if index.date != date:
        return None  # another SOURCE_DATE_EPOCH: every header differs
    try:
        with (
            open(previous, "rb") as source,
            open(target, "wb") as handle,
            Background(worker, ahead or {}) as background,
        ):
            directory = Directory.read(source, index)
            output = Output(handle.fileno(), background)
            names = _write_update(output, directory, source, root, members, stamp)
            # The runs' bytes on their way to the disk while the rest is written:
            # the last fsync has little left to wait for.
            output.hand_over()
            background.submit(os.fsync, handle.fileno())
            members_end = len(output.record)
            for name, data in sorted(generated.items()):
                _write_new(output, name, data, _sha256(data), stamp)
            listing = bytes(output.record) + f"{record_name},,\n".encode()
            old_record = directory.deflated(record_name, source)
            _write_new(output, record_name, listing, None, stamp, old_record)
            tail = _write_central_directory(output)
            output.hand_over()
            background.submit(os.fsync, handle.fileno())
            written = output.index(names, date, members_end, tail)
            background.finish()  # every run copied and the wheel synced, or what failed raised
    except (Declined, *UNREADABLE):
        return None
    return written


class Background:
    """What an update hands to the worker thread (copies of runs, sha256s of big
    members, the fsync): calls that release the GIL, run beside this thread's work on
    the rest. All of it has ended when the update ends, however it ends: a copy still
    running must not write into the file a failed update leaves to a fresh write."""

    def __init__(self, worker: Executor, ahead: Mapping[str, Future[MemberData]]) -> None:
        self.worker = worker
        self.ahead = ahead
        self.pending: list[Future[object]] = []

    def __enter__(self) -> Background:
        return self

    def __exit__(self, *exc_info: object) -> None:
        from concurrent.futures import wait

        wait(self.pending)

    def submit(self, call: Callable[..., object], *args: object) -> Future[object]:
        future = self.worker.submit(call, *args)
        self.pending.append(future)
        return future

    def read(self, root: Path, name: str) -> tuple[MemberData, Future[object]]:
        """The bundle file `name` and (to be checked) its sha256: as read ahead (with its
        CRC) if it was, else read now and hashed in the worker if
        big (while this thread deflates its chunks), else here."""
        ahead = self.ahead.get(str(root / name))
        if ahead is not None and ahead.exception() is None:
            hashed = ahead.result()
            return hashed, _done(hashed.digest)
        data = _bundle_file(root, name)
        if len(data) >= BACKGROUND_HASH_BYTES:
            return MemberData(data), self.submit(_sha256, data)
        return MemberData(data), _done(_sha256(data))

    def finish(self) -> None:
        """Wait for everything handed over; raise what failed."""
        for future in self.pending:
            future.result()


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _done(result: object) -> Future[object]:
    from concurrent.futures import Future

    done: Future[object] = Future()
    done.set_result(result)
    return done


@dataclass(frozen=True)
class MemberData:
    """A member's bytes, with what packing them needs where it is known already: their
    sha256 and, for a file deflated in chunks, its CRC-32 (computed when needed
    otherwise)."""

    data: bytes
    digest: bytes = b""
    crc: int | None = None

    @classmethod
    def read(cls, path: Path) -> MemberData:
        """The file at `path`, both computed: in the worker, ahead of its turn. Three
        calls that release the GIL: its chunks' sha256s are left to the stage's thread,
        as the worker would wait for the GIL after each of them (up to CPython's switch
        interval, 5 ms, while that thread runs)."""
        data = path.read_bytes()
        return cls(data, _sha256(data), zlib.crc32(data) if _in_chunks(data) else None)


def _write_update(
    output: Output,
    directory: Directory,
    source: BinaryIO,
    root: Path,
    members: Sequence[tuple[str, str]],
    stamp: tuple[int, ...],
) -> str:
    """The bundle's members in order: unchanged ones in runs from `source`. Returns
    their names joined by NUL (as the index keeps them)."""
    names = "\0".join(map(itemgetter(0), members)).encode()
    for start, end, at in directory.segments(members, names):
        if at == NOT_STORED:
            name, recorded = members[start]
            member, hashing = output.background.read(root, name)
            _write_new(output, name, member, None, stamp, directory.deflated(name, source))
            digest = _checked(root, name, recorded, hashing.result())  # type: ignore[arg-type]
            line = f"{_record_line(name, digest, len(member.data))}\n".encode()
            output.record += line
            output.line_sizes.append(_packed([len(line)]))
            output.shas.append(digest.hex().encode())
        else:
            _copy_run(directory, range(at, at + end - start), source, output)
    return names


def _around(changed: list[int], count: int) -> list[tuple[int, int, int]]:
    """The segments (`Directory.segments`) of `count` members stored in order but the
    `changed` ones (ascending)."""
    segments = []
    at = 0
    for index in changed:
        if index > at:
            segments.append((at, index, at))
        segments.append((index, index + 1, NOT_STORED))
        at = index + 1
    if at < count:
        segments.append((at, count, at))
    return segments


def _segments(found: list[int]) -> list[tuple[int, int]]:
    """The (start, end) of each run of `found` that counts up by one (members stored
    one after another) and of each NOT_STORED entry, in order."""
    if not found:
        return []
    breaks = compress(count(1), map(ne, found[1:], map(add, found, repeat(1))))
    edges = [0, *breaks, len(found)]
    return list(pairwise(edges))


def _dos_date_time(stamp: tuple[int, ...]) -> bytes:
    """The time and date fields of a header written with `stamp`, as zipfile encodes them."""
    info = zipfile.ZipInfo("-", date_time=stamp)  # type: ignore[arg-type]
    info.CRC = 0
    fields = LOCAL_HEADER.unpack_from(info.FileHeader())
    return struct.pack("<HH", fields[5], fields[6])


def _copy_run(directory: Directory, run: range, source: BinaryIO, output: Output) -> None:
    """Copy the members `run` indexes, stored one after another, as one byte range."""
    first, end = directory.offsets[run.start], directory.offsets[run.stop]
    moved = output.position - first
    if directory.offsets[run.stop - 1] + moved > zipfile.ZIP64_LIMIT:
        raise Declined  # its central header would need a ZIP64 offset
    output.hand_over()
    output.background.submit(
        _copy_bytes, source.fileno(), output.target, first, output.position, end - first
    )
    output.position += end - first
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
    index, words = directory.index, slice(WORD * run.start, WORD * run.stop)
    output.entry_sizes.append(index.entry_sizes[words])
    output.header_sizes.append(index.header_sizes[words])
    output.line_sizes.append(index.line_sizes[words])
    output.record += index.record[
        directory.line_starts[run.start] : directory.line_starts[run.stop]
    ]
    output.shas.append(index.shas[SHA256_HEX * run.start : SHA256_HEX * run.stop])
    for name, (entry, chunks) in index.chunks.items():
        if entry in run:
            output.chunks[name] = (output.count + entry - run.start, chunks)
    output.count += len(run)


def _copy_bytes(source: int, target: int, first: int, at: int, length: int) -> None:
    """Copy `length` bytes of the file `source` from `first` to the file `target` at
    `at` (both descriptors; neither's position moves): within the kernel where the
    system can (`copy_file_range`, Linux), else (and for what it left, at the source's
    end too) through memory."""
    done = 0
    copy_range = getattr(os, "copy_file_range", None)
    with contextlib.suppress(OSError):  # not on this file system: copied through memory
        while copy_range and done < length:
            copied = copy_range(source, target, length - done, first + done, at + done)
            if not copied:
                break  # the source's end: found again below
            done += copied
    while done < length:
        chunk = os.pread(source, min(length - done, COPY_CHUNK), first + done)
        if not chunk:
            raise EOFError(f"the previous wheel ends {length - done} bytes early")
        done += os.pwrite(target, chunk, at + done)


def _write_new(
    output: Output,
    name: str,
    data: bytes | MemberData,
    digest: bytes | None,
    stamp: tuple[int, ...],
    previous: Deflated | None = None,
) -> None:
    """Write one member as `_write_member` writes it: zipfile writes it alone into
    memory, whose local entry and central header (its offset moved) are taken."""
    offset = output.position
    if offset > zipfile.ZIP64_LIMIT:
        raise Declined  # its central header would need a ZIP64 offset
    scratch = io.BytesIO()
    chunked: dict[str, Chunks] = {}
    with zipfile.ZipFile(scratch, "w") as archive:
        line = _write_member(archive, name, data, stamp, digest, chunked, previous)
        local_end = archive.start_dir
    written = scratch.getvalue()
    fields = CENTRAL_HEADER.unpack_from(written, local_end)
    header_end = local_end + CENTRAL_HEADER.size + fields[12] + fields[13] + fields[14]
    if header_end - local_end != CENTRAL_HEADER.size + len(name.encode()):
        raise Declined  # ZIP64 fields: not the plain layout an index describes
    output.write(written[:local_end])
    at = len(output.central)
    output.central += written[local_end:header_end]
    OFFSET_FIELD.pack_into(output.central, at + CENTRAL_OFFSET_AT, offset)
    output.entry_sizes.append(_packed([local_end]))
    output.header_sizes.append(_packed([header_end - local_end]))
    if line:
        output.record += f"{line}\n".encode()
    if chunked:
        output.chunks[name] = (output.count, chunked[name])
    output.count += 1


def _write_central_directory(output: Output) -> bytes:
    """The central directory and end records, by zipfile's rules for them (ZIP64 end
    records past its limits), so the archive ends as a fresh write's does; returned as
    written."""
    offset = output.position
    tail = bytearray(output.central)
    count, size = output.count, len(output.central)
    if count > zipfile.ZIP_FILECOUNT_LIMIT or max(offset, size) > zipfile.ZIP64_LIMIT:
        tail += END_RECORD64.pack(
            zipfile.stringEndArchive64, 44, 45, 45, 0, 0, count, count, size, offset
        )
        tail += END_LOCATOR64.pack(zipfile.stringEndArchive64Locator, 0, offset + size, 1)
        count, size, offset = min(count, 0xFFFF), min(size, 0xFFFFFFFF), min(offset, 0xFFFFFFFF)
    tail += END_RECORD.pack(zipfile.stringEndArchive, 0, 0, count, count, size, offset, 0)
    written = bytes(tail)
    output.write(written)
    return written
