"""Bring the bundle's tree up to date in place, writing only the files whose content changed.

A bundle of a big project has a file per NEFF and a module per kernel; editing one
kernel changes a few of them. Regenerating the whole tree costs a copy, a hash and a
removal per file (removing a file that owns disk blocks is slow on many filesystems),
so the bundle stage instead compares what it wants with what the tree holds:

- `.files.json` (hidden: not part of the project, skipped by the outputs check)
  records, for every file the last update wrote or kept, its size, times, inode and
  sha256. A file whose stat is unchanged since then and whose recorded sha256 is the
  one wanted is kept without being read, as doit trusts unchanged stats; any other
  file is written again. A NEFF is written only from bytes whose sha256 is the one
  its compile recorded.
- The update is two-phased. First every changed file is written (NEFFs hashed as they
  are copied) into a hidden sibling work dir; a refused NEFF ends the update there,
  with the tree untouched. Then `bundle.json` and the record are removed, the new files
  are renamed into the tree (never through a symlinked directory), stray files removed,
  and `bundle.json` written last, then the record. A tree without
  `bundle.json` is not a bundle (nothing packs or verifies it); a killed update leaves
  one, and the next update finds its new files' stats unrecorded and writes them again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Container, Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import NamedTuple

from nkibuild.errors import BuildError
from nkibuild.fsutil import (
    atomic_write_bytes,
    atomic_write_text,
    new_dir_mode,
    new_file_mode,
    reported_at,
)

RECORD_FILE = ".files.json"
CHUNK = 1 << 20
Fingerprint = list[int | str]  # [size, mtime_ns, ctime_ns, inode, sha256]


class CompiledCopy(NamedTuple):
    """A NEFF the tree takes from a compile directory; its bytes must hash to `sha256`.
    A tuple: the bundle stage makes one per NEFF (10,000) at each update."""

    source: str | os.PathLike[str]  # a string from the bundle stage: 10,000 Paths cost
    sha256: str
    unit: str


Content = bytes | CompiledCopy


def digest(content: Content) -> str:
    if isinstance(content, CompiledCopy):
        return content.sha256
    return hashlib.sha256(content).hexdigest()


def update_tree(
    root: Path,
    wanted: Mapping[str, Content],
    stamp_name: str,
    stamp: bytes,
    *,
    digests: Mapping[str, str] | None = None,
) -> dict[str, Fingerprint]:
    """Make `root` hold exactly `wanted` (relative POSIX path -> content) and, written
    last, `stamp_name` with `stamp`; return every file's fingerprint (as recorded).
    `digests`: the sha256 of each wanted file, if the caller has them already."""
    digests = dict(digests or {name: digest(content) for name, content in wanted.items()})
    digests[stamp_name] = hashlib.sha256(stamp).hexdigest()
    known = read_record(root, digests)
    changed = _changed(root, wanted, known, digests)
    # A complete tree holds what its record lists; after a killed update or without a
    # record (a tree from an older nkibuild), the tree itself is listed.
    complete = known and (root / stamp_name).exists()
    strays = _strays(root, digests, known if complete else None)
    if not changed and not strays and not _changed(root, [stamp_name], known, digests):
        return {name: known[name] for name in digests}
    with reported_at(root):
        root.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{root.name}.", suffix=".new", dir=root.parent))
        os.chmod(work, new_dir_mode())  # mkdtemp's 0o700: it becomes the tree if none exists
        mode = new_file_mode()
        try:
            for name in changed:
                _write(work / name, wanted[name], mode)
            _commit(root, work, changed, strays, stamp_name)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        atomic_write_bytes(root / stamp_name, stamp, durable=False)
        # A kept file's stat is the one just compared with its record: only the files
        # written are stat'ed again.
        written = {*changed, stamp_name}
        record = {
            name: [*_stat(root, name), sha] if name in written else known[name]
            for name, sha in digests.items()
        }
        # Plain lists and strings, no cycle to look for (the check costs a tenth).
        text = json.dumps(record, check_circular=False)
        atomic_write_text(root / RECORD_FILE, text, durable=False)
    return record


def read_record(root: Path, wanted: Container[str] = ()) -> dict[str, Fingerprint]:
    """The fingerprints the last complete update recorded (none if unreadable, or if it
    names a file outside the tree: its names are removed as strays). Names in `wanted`
    are the caller's own, inside the tree: not checked again (15,000 at 10,000 units)."""
    try:
        record = json.loads((root / RECORD_FILE).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(record, dict):
        return {}
    if not all(_inside_tree(name) for name in record if name not in wanted):
        return {}
    return record


def _inside_tree(name: object) -> bool:
    """A relative POSIX path that stays below the tree (`a/b.py`, not `../x` or `/x`)."""
    if not isinstance(name, str) or name.startswith("/"):  # PurePosixPath's absolute
        return False
    return not {"", ".", ".."}.intersection(name.split("/"))


def _changed(
    root: Path, names: Iterable[str], known: Mapping[str, Fingerprint], digests: Mapping[str, str]
) -> list[str]:
    """The `names` to write again: all but those whose recorded sha256 is the one wanted
    and whose stat is as recorded. One loop, no call per file: it runs over every file
    of the tree at each update; each stat'ed relative to the tree's directory, whose
    path is then not looked up again for each file."""
    try:
        tree = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:  # no tree yet (or not a directory): every file is written
        return list(names)
    changed = []
    try:
        for name in names:
            recorded = known.get(name)
            try:
                info = os.stat(name, dir_fd=tree)
                kept = recorded == [
                    info.st_size,
                    info.st_mtime_ns,
                    info.st_ctime_ns,
                    info.st_ino,
                    digests[name],
                ]
            except OSError:
                kept = False
            if not kept:
                changed.append(name)
    finally:
        os.close(tree)
    return changed


def _strays(
    root: Path, wanted: Mapping[str, str], known: Mapping[str, Fingerprint] | None
) -> list[str]:
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


def _commit(root: Path, work: Path, changed: list[str], strays: list[str], stamp: str) -> None:
    """Move the written files into the tree (all at once if there is no tree yet)."""
    if not root.exists():
        os.replace(work, root)
        return
    _refuse_links(root, [*changed, *strays])
    # From here until they are back: not a bundle, and no record a next update trusts.
    (root / stamp).unlink(missing_ok=True)
    (root / RECORD_FILE).unlink(missing_ok=True)
    for name in changed:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        os.replace(work / name, root / name)
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


def _stat(root: Path, name: str) -> list[int]:
    # A string join, not a Path: this runs for every file of the tree at each update.
    info = os.stat(f"{root}/{name}")
    return [info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino]
