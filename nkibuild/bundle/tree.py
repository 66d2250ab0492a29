"""Bring the bundle's tree up to date in place, writing only the files whose content changed.

A bundle of a big project has a file per NEFF and a module per kernel; editing one
kernel changes a few of them. Regenerating the whole tree costs a copy, a hash and a
removal per file (removing a file that owns disk blocks is slow on many filesystems),
so the bundle stage instead compares what it wants with what the tree holds:

- `.files.pickle` (hidden: not part of the project, skipped by the outputs check)
  records, for every file the last update wrote or kept, its stamp (size, times,
  inode: `fsutil.stamp_of`) and sha256. A file whose stamp is unchanged since then and
  whose recorded sha256 is the one wanted is kept without being read, as doit trusts
  unchanged stats; any other file is written again. A NEFF is written only from bytes
  whose sha256 is the one its compile recorded. The build's up-to-date decision has
  just compared every file of the tree with the stamps the tree's last update handed
  on (`fsutil.SeenStats`): those it found as they were are not stat'ed again.
- The update is two-phased. First every changed file is written (NEFFs hashed as they
  are copied) into a hidden sibling work dir; a refused NEFF ends the update there,
  with the tree untouched. Then `bundle.json` and the record are removed, the new files
  are renamed into the tree (never through a symlinked directory), stray files removed,
  and `bundle.json` written last, then the record. A tree without
  `bundle.json` is not a bundle (nothing packs or verifies it); a killed update leaves
  one, and the next update finds its new files' stats unrecorded and writes them again.
- An update of the files the record lists, in its order (an edit's: none added or
  removed), keeps the record while it renames them in and then appends the rows it
  wrote to it, rather than writing 15,000 rows anew; a load applies the appended rows in
  order and stops at one cut short.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Container, Iterable, Iterator, Mapping
from itertools import chain, compress, count
from operator import ne
from pathlib import Path, PurePosixPath
from typing import NamedTuple

from nkibuild import plaindata
from nkibuild.errors import BuildError
from nkibuild.fsutil import (
    STAMP_FIELDS,
    SeenStats,
    atomic_write_bytes,
    new_dir_mode,
    new_file_mode,
    reported_at,
    stamp_of,
    stamps_of_numbers,
)

RECORD_FILE = ".files.pickle"
# Where nkibuild recorded the tree before: an object of fingerprints (or, briefly, the
# same columns as JSON). Read while there is no record, removed with it.
LEGACY_RECORD_FILE = ".files.json"
FORMAT = 3  # of the record: columns of names, stamps and sha256s
INTEGER_STATS = 2  # the format before: four numbers a file instead of its stamp
# Of an update appended to the record: the rows of the files it wrote, by index.
UPDATE = "rows written"
MAX_UPDATES = 100  # appended to a record before it is written anew: each costs a load
CHUNK = 1 << 20


class CompiledCopy(NamedTuple):
    """A NEFF the tree takes from a compile directory; its bytes must hash to `sha256`.
    A tuple: the bundle stage makes one per NEFF (10,000) at each update."""

    source: str | os.PathLike[str]  # a string from the bundle stage: 10,000 Paths cost
    sha256: str
    unit: str


Content = bytes | CompiledCopy

# The NEFFs a bundle takes, as rows: each one's path in the tree, the compiled NEFF, the
# sha256 its compile recorded and its unit (a CompiledCopy's fields after the name). A
# kernel's part keeps its rows packed in one string, each field followed by a NUL (no
# path, digest or unit name holds one): one object a kernel where tuples of rows were
# three, each unpickled from the bundle's memo and scanned by the garbage collector at
# each bundle (15,000 at 10,000 units).
NeffRow = tuple[str, str, str, str]
NEFF_FIELDS = 4


def packed_neffs(rows: Iterable[NeffRow]) -> str:
    """NEFF rows as a part keeps them."""
    return "".join(f"{field}\0" for row in rows for field in row)


def neff_fields(packed: Iterable[str]) -> list[str]:
    """The fields of the NEFF rows of parts' packed strings, row after row."""
    return "".join(packed).split("\0")[:-1]


def digest(content: Content) -> str:
    if isinstance(content, CompiledCopy):
        return content.sha256
    return hashlib.sha256(content).hexdigest()


class Record(NamedTuple):
    """What `.files.pickle` records: every file of the tree, its stamp and its sha256, as
    columns (one list each, pickled as plain data: read and compared a column at a time,
    not a Python call per file; 15,000 files at 10,000 units)."""

    names: list[str]
    stamps: list[str]  # fsutil.stamp_of each file
    sha256: list[str]

    def by_name(self) -> dict[str, tuple[str, str]]:
        """Each file's stamp and sha256, by its name."""
        return dict(zip(self.names, zip(self.stamps, self.sha256, strict=True), strict=True))


NO_RECORD = Record([], [], [])


class _Appendable(NamedTuple):
    """A record file read in this format: the bytes read (its snapshot and the updates
    applied after it), the snapshot's own, and the number of updates, for the next
    update of the same files to append its rows to."""

    length: int
    snapshot: int
    updates: int


def update_tree(
    root: Path,
    wanted: Mapping[str, Content],
    stamp_name: str,
    stamp: bytes,
    *,
    digests: Mapping[str, str] | None = None,
    seen: SeenStats | None = None,
) -> Record:
    """Make `root` hold exactly `wanted` (relative POSIX path -> content) and, written
    last, `stamp_name` with `stamp`; return every file's stamp and sha256 (as recorded).
    `digests`: the sha256 of each wanted file, if the caller has them already; `seen`:
    the files' stamps as the build saw them, by path (`root` made absolute + "/" + name)."""
    digests = dict(digests or {name: digest(content) for name, content in wanted.items()})
    digests[stamp_name] = hashlib.sha256(stamp).hexdigest()
    names, shas = list(digests), list(digests.values())
    # Aligned: the record lists the same files, in the same order (no file added).
    known, appendable, aligned = _read(root, digests, names)
    stats = _stamps(root, names, seen)
    rows = _changed(names, shas, known, stats, aligned=aligned)  # the files to write
    stamp_row = names.index(stamp_name)
    # A complete tree holds what its record lists; after a killed update or without a
    # record (a tree from an older nkibuild), the tree itself is listed.
    stamped = (root / stamp_name).exists()
    if not stamped and stamp_row not in rows:  # removed since its stamp was seen
        rows.append(stamp_row)
    complete = bool(known.names) and stamped
    strays = _strays(root, digests, known.names if complete else None)
    if not rows and not strays:
        return Record(names, stats, shas)  # type: ignore[arg-type]  # none missing
    # The same files: the record still lists every one, and the update appends the
    # rows it writes (a few of 15,000) to it instead of writing it anew.
    append = appendable if aligned and appendable and appendable.updates < MAX_UPDATES else None
    with reported_at(root):
        root.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{root.name}.", suffix=".new", dir=root.parent))
        os.chmod(work, new_dir_mode())  # mkdtemp's 0o700: it becomes the tree if none exists
        mode = new_file_mode()
        rows = [index for index in rows if index != stamp_row]
        written = [names[index] for index in rows]
        # Into an existing tree the files are renamed one by one: staged flat (no
        # directories made and removed in the work dir for an edit's few files).
        flat = root.exists()
        staged = {name: work / (str(index) if flat else name) for index, name in enumerate(written)}
        try:
            for name, path in staged.items():
                _write(path, wanted[name], mode)
            _commit(root, work, staged, strays, stamp_name, keep_record=append is not None)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        atomic_write_bytes(root / stamp_name, stamp, durable=False)
        # A kept file's stamp is the one just compared with its record: only the files
        # written are stat'ed again.
        rows.append(stamp_row)
        for index in rows:
            stats[index] = _stamp(root, names[index])
        record = Record(names, stats, shas)  # type: ignore[arg-type]  # none missing
        if append is None or not _append(root, append, record, rows):
            # Plain data (a third of JSON's time to write and read, and read without
            # running code: nkibuild.plaindata).
            state = plaindata.dumps((FORMAT, *record))
            atomic_write_bytes(root / RECORD_FILE, state, durable=False)
    return record


def _append(root: Path, appendable: _Appendable, record: Record, rows: list[int]) -> bool:
    """Append the rows an update wrote to the record file it read; False, nothing
    written, if the file is not as read or the updates would outgrow the snapshot."""
    update = (UPDATE, rows, [record.stamps[i] for i in rows], [record.sha256[i] for i in rows])
    change = plaindata.dumps(update)
    return plaindata.append(root / RECORD_FILE, appendable.length, appendable.snapshot, change)


def read_record(root: Path, wanted: Container[str] = ()) -> Record:
    """What the last complete update recorded (none if unreadable, or if it names a file
    outside the tree: its names are removed as strays). Names in `wanted` are the
    caller's own, inside the tree: not checked again (15,000 at 10,000 units)."""
    return _read(root, wanted)[0]


def _read(
    root: Path, wanted: Container[str], names: list[str] | None = None
) -> tuple[Record, _Appendable | None, bool]:
    """`read_record`, where its file ends if an update may append to it, and whether it
    lists `names` (the caller's, in order)."""
    found = _recorded(root)
    if found is None:
        return NO_RECORD, None, False
    record, appendable = found
    if names is not None and record.names == names:  # the caller's own names
        return record, appendable, True
    inside = all(_inside_tree(name) for name in record.names if name not in wanted)
    return (record, appendable, False) if inside else (NO_RECORD, None, False)


def _recorded(root: Path) -> tuple[Record, _Appendable | None] | None:
    """The record in the tree if every value has its type: this format's (its snapshot
    with the updates appended after it applied in order, up to the first that is torn
    or damaged), or (while there is none) one an older nkibuild wrote, so that its tree
    is not written again (nor appended to: the next update writes it anew)."""
    try:
        return _snapshot_and_updates(plaindata.read_records(root / RECORD_FILE))
    except OSError:
        legacy = _legacy(root)
        return None if legacy is None else (legacy, None)


def _snapshot_and_updates(
    values: Iterator[tuple[object, int]],
) -> tuple[Record, _Appendable | None] | None:
    data, end = next(values, (None, 0))
    if type(data) is not tuple or len(data) != 4 or data[0] not in (FORMAT, INTEGER_STATS):
        return None
    record = _columns(*data[1:], integer_stats=data[0] == INTEGER_STATS)
    if record is None or data[0] == INTEGER_STATS:
        return None if record is None else (record, None)
    snapshot, updates = end, 0
    for update, after in values:
        if not _applied(record, update):
            break
        end, updates = after, updates + 1
    return record, _Appendable(end, snapshot, updates)


def _applied(record: Record, update: object) -> bool:
    """Apply an update appended to the record (the rows an update of the same files
    wrote: indexes, stamps, sha256s); False, none of it applied, if it is not one."""
    if type(update) is not tuple or len(update) != 4 or update[0] != UPDATE:
        return False
    _, rows, stamps, shas = update
    if not (type(rows) is list and type(stamps) is list and type(shas) is list):
        return False
    if not len(rows) == len(stamps) == len(shas) or not plaindata.only(rows, int):
        return False
    if not plaindata.only(chain(stamps, shas), str):
        return False
    if rows and not (min(rows) >= 0 and max(rows) < len(record.names)):
        return False
    for index, stamp, sha256 in zip(rows, stamps, shas, strict=True):
        record.stamps[index] = stamp
        record.sha256[index] = sha256
    return True


def _legacy(root: Path) -> Record | None:
    """The JSON record: an object of fingerprints, or this format's columns."""
    try:
        data = json.loads((root / LEGACY_RECORD_FILE).read_text())
    except (OSError, ValueError, RecursionError):  # RecursionError: nested past the stack
        return None
    if isinstance(data, dict) and data.get("format") == INTEGER_STATS:
        stats = data.get("stats")
        return _columns(data.get("names"), stats, data.get("sha256"), integer_stats=True)
    if not isinstance(data, dict) or "format" in data:
        return None
    rows = list(data.values())
    if not plaindata.only(rows, list) or set(map(len, rows)) - {STAMP_FIELDS + 1}:
        return None
    stats = list(chain.from_iterable(row[:STAMP_FIELDS] for row in rows))
    return _columns(list(data), stats, [row[STAMP_FIELDS] for row in rows], integer_stats=True)


def _columns(
    names: object, stats: object, shas: object, *, integer_stats: bool = False
) -> Record | None:
    """The record of these columns if each has its type (older records: four numbers
    a file, made stamps here)."""
    if not (type(names) is list and type(stats) is list and type(shas) is list):
        return None
    width = STAMP_FIELDS if integer_stats else 1
    if len(stats) != width * len(names) or len(shas) != len(names):
        return None
    if not plaindata.only(chain(names, shas), str):
        return None
    if integer_stats:
        if not plaindata.only(stats, int):
            return None
        stats = stamps_of_numbers(stats)
    elif not plaindata.only(stats, str):
        return None
    return Record(names, stats, shas)


def _inside_tree(name: object) -> bool:
    """A relative POSIX path that stays below the tree (`a/b.py`, not `../x` or `/x`)."""
    if not isinstance(name, str) or name.startswith("/"):  # PurePosixPath's absolute
        return False
    return not {"", ".", ".."}.intersection(name.split("/"))


def _changed(
    names: list[str], shas: list[str], known: Record, stamps: list[str | None], *, aligned: bool
) -> list[int]:
    """Where in `names` the files to write again are: all but those whose recorded
    sha256 is the one wanted (`shas`, in order) and whose stamp now (`stamps`, None where
    missing) is as recorded. Compared column by column where the record lists the same
    files in the same order (`aligned`), as an update after an edit does."""
    if aligned:
        differing = set(compress(count(), map(ne, stamps, known.stamps)))
        differing.update(compress(count(), map(ne, shas, known.sha256)))
        return sorted(differing)
    recorded = known.by_name()
    rows = zip(names, zip(stamps, shas, strict=True), strict=True)
    return [index for index, (name, row) in enumerate(rows) if recorded.get(name) != row]


def _stamps(root: Path, names: list[str], seen: SeenStats | None) -> list[str | None]:
    """Each file's stamp, None where it is missing: as `seen` has it, else stat'ed."""
    if seen is not None and seen.seen:
        return seen.stamps(map(f"{os.path.abspath(root)}/".__add__, names))
    stamps: list[str | None] = []
    try:
        # Stat'ed relative to the tree's directory, whose path is not looked up again.
        tree = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:  # no tree yet (or not a directory): every file is written
        return [None] * len(names)
    try:
        for name in names:
            try:
                stamps.append(stamp_of(os.stat(name, dir_fd=tree)))
            except OSError:
                stamps.append(None)
    finally:
        os.close(tree)
    return stamps


def _strays(root: Path, wanted: Mapping[str, str], known: list[str] | None) -> list[str]:
    """Files in the tree that are not wanted: of a complete tree, those its record
    lists; else every file found (hidden names are nkibuild's own: left)."""
    if known is not None:
        return [name for name in known if name not in wanted]
    found = []
    for directory, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        relative = Path(directory).relative_to(root)
        for name in files:
            path = (relative / name).as_posix()
            if not name.startswith(".") and path not in wanted:
                found.append(path)
    return found


def _write(path: Path, content: Content, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        _copy_checked(content, path)
    os.chmod(path, mode)


def _copy_checked(copy: CompiledCopy, path: Path) -> None:
    """Copy a NEFF, hashing the bytes copied: only the NEFF its compile recorded passes."""
    hashed = hashlib.sha256()
    with open(copy.source, "rb") as source, open(path, "wb") as target:
        while chunk := source.read(CHUNK):
            hashed.update(chunk)
            target.write(chunk)
    if hashed.hexdigest() != copy.sha256:
        raise BuildError(
            f"{copy.source} changed after it was compiled (its sha256 differs from "
            "the compile record); run the build again to restore it",
            unit=copy.unit,
        )


def _commit(
    root: Path,
    work: Path,
    staged: Mapping[str, Path],
    strays: list[str],
    stamp: str,
    *,
    keep_record: bool = False,
) -> None:
    """Move the written files (`staged`: name in the tree -> where it was written) into
    the tree (the work dir as a whole if there is no tree yet). `keep_record`: the files
    written are files the record lists (none added), which it may keep listing: each
    renamed in has a stamp other than the one recorded, so a killed update leaves them
    to be written again."""
    if not root.exists():
        os.replace(work, root)
        return
    _refuse_links(root, [*staged, *strays])
    # From here until they are back: not a bundle, and (but for the same files) no
    # record a next update trusts: one that does not list a file added would leave it.
    (root / stamp).unlink(missing_ok=True)
    if not keep_record:
        (root / RECORD_FILE).unlink(missing_ok=True)
        (root / LEGACY_RECORD_FILE).unlink(missing_ok=True)
    for name, path in staged.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, root / name)
    for name in strays:
        (root / name).unlink(missing_ok=True)
    _remove_empty_dirs(root, strays)


def _refuse_links(root: Path, names: Iterable[str]) -> None:
    """Files are written and removed below `root` only, never through a directory
    someone replaced with a symbolic link (it could lead out of the build dir)."""
    parents = {parent for name in names for parent in PurePosixPath(name).parents}
    for parent in sorted(parents, key=lambda p: len(p.parts)):
        if os.path.islink(root / parent):
            raise BuildError(
                f"{root / parent} is a symbolic link: nkibuild does not write through it; "
                "remove it (or run `nkibuild clean`) and build again"
            )


def _remove_empty_dirs(root: Path, removed: list[str]) -> None:
    parents = {parent for name in removed for parent in Path(name).parents if parent != Path()}
    for parent in sorted(parents, key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):  # not empty (or gone): keep
            (root / parent).rmdir()


def _stamp(root: Path, name: str) -> str:
    # A string join, not a Path: a first update stats every file of the tree.
    return stamp_of(os.stat(f"{root}/{name}"))
