"""Bring the bundle's tree to what the build wants, writing the files that changed.

The tree's stamp file (`bundle.json`) lists every file with its sha256 and is written
last, so a tree with a stamp is complete. The stamp is also what an update trusts: a
file it lists with the wanted sha256 is kept if its ctime is older than the stamp's
(any write, rename or link since the stamp was written moves a file's ctime past it,
and ctime cannot be set back; a file changed in the clock tick the stamp was written
in is written again too); every other file is written again. Writing the whole tree
into a sibling directory and swapping it in would be simpler still, but it was
measured at 2.3-4.5 s for a 1,000-unit bundle (1,000 directories made and removed, on
this project's loaded 2-core test machine), where this update costs ~0.05 s of the
bundle stage's ~0.35 s (CPU) after an edit of one kernel.

An update first writes the files it changes into a hidden sibling work dir (a NEFF
copied from its compile directory and hashed as it is copied: one whose bytes are not
the sha256 its compile recorded stops the update with the tree as it was). Then it
removes the stamp, renames the new files in, removes the files the stamp listed that
are no longer wanted, and writes the new stamp. A kill before the stamp is removed
leaves the old tree (and a work dir the next build sweeps, fsutil.LEFTOVER_PATTERNS);
after, a tree without a stamp, which nothing packs and which the next update writes
whole. Files are written and removed below the tree only, never through a directory
someone replaced with a symbolic link.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import NamedTuple

from nkibuild.errors import BuildError
from nkibuild.fsutil import atomic_write_bytes, reported_at

CHUNK = 1 << 20


class CompiledCopy(NamedTuple):
    """A NEFF the tree takes from a compile directory; its bytes must hash to `sha256`."""

    source: Path
    sha256: str
    unit: str


Content = bytes | CompiledCopy


_REFUSED = "nkibuild does not write through it; remove it (or run `nkibuild clean`) and build again"


def digest(content: Content) -> str:
    """The sha256 of a file of the tree: a NEFF's is its compile record's (checked when
    it is written)."""
    if isinstance(content, CompiledCopy):
        return content.sha256
    return hashlib.sha256(content).hexdigest()


def update_tree(
    root: Path,
    files: Mapping[str, Content],
    digests: Mapping[str, str],
    listed: Mapping[str, str] | None,
    stamp: tuple[str, bytes],
) -> None:
    """Make `root` hold exactly `files` (relative POSIX path -> content, with their
    `digests`) and the stamp file (`stamp`: its name and content), written last.
    `listed`: the files the tree's stamp lists with their sha256 (None: no stamp)."""
    stamp_name, stamp_bytes = stamp
    if root.is_symlink():
        raise BuildError(f"{root} is a symbolic link: {_REFUSED}")
    kept = _intact(root, stamp_name, digests, listed or {})
    changed = [name for name in files if name not in kept]
    strays = _strays(root, files, stamp_name, listed)
    if not changed and not strays and _holds(root / stamp_name, stamp_bytes):
        return
    _refuse_links(root, [*changed, *strays])
    with reported_at(root):
        root.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{root.name}.", suffix=".new", dir=root.parent))
        try:
            staged = {name: _staged(work / str(i), files[name]) for i, name in enumerate(changed)}
            (root / stamp_name).unlink(missing_ok=True)  # not a bundle from here...
            for name, path in staged.items():
                (root / name).parent.mkdir(parents=True, exist_ok=True)
                os.replace(path, root / name)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        for name in strays:
            (root / name).unlink(missing_ok=True)
        _remove_empty_dirs(root, strays)
        atomic_write_bytes(root / stamp_name, stamp_bytes, durable=False)  # ...to here


def _intact(
    root: Path, stamp_name: str, digests: Mapping[str, str], listed: Mapping[str, str]
) -> set[str]:
    """The wanted files the tree holds as its stamp lists them: same sha256, a regular
    file, not changed since the stamp was written."""
    try:
        stamped = os.lstat(root / stamp_name).st_ctime_ns
    except OSError:
        return set()
    kept = set()
    for name, sha256 in digests.items():
        if listed.get(name) != sha256:
            continue
        try:
            info = os.lstat(f"{root}/{name}")
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode) and info.st_ctime_ns < stamped:
            kept.add(name)
    return kept


def _strays(
    root: Path, files: Mapping[str, Content], stamp_name: str, listed: Mapping[str, str] | None
) -> list[str]:
    """Files to remove: of a stamped tree, those the stamp lists and no longer wanted;
    of a tree without a stamp (an update was killed), every file found but those wanted."""
    if listed is not None:
        return [name for name in listed if name not in files and _inside_tree(name)]
    found = []
    for directory, _, names in os.walk(root):
        relative = Path(directory).relative_to(root)
        found += [(relative / name).as_posix() for name in names]
    return [name for name in found if name not in files and name != stamp_name]


def _inside_tree(name: str) -> bool:
    """A relative POSIX path that stays below the tree (`a/b.py`, not `../x` or `/x`)."""
    return not name.startswith("/") and not {"", ".", ".."}.intersection(name.split("/"))


def _holds(path: Path, content: bytes) -> bool:
    try:
        return path.read_bytes() == content
    except OSError:
        return False


def _refuse_links(root: Path, names: Iterable[str]) -> None:
    """Refuse to write or remove below a directory of the tree that is a symbolic link
    (it could lead out of the build directory)."""
    parents = {parent for name in names for parent in PurePosixPath(name).parents}
    for parent in sorted(parents, key=lambda p: len(p.parts)):
        if os.path.islink(root / parent):
            raise BuildError(f"{root / parent} is a symbolic link: {_REFUSED}")


def _staged(path: Path, content: Content) -> Path:
    """`content` written at `path` (in the work dir): open() gives it the user's umask.
    A NEFF is copied (not hard-linked: one changed in place in its compile directory must
    not change the tree behind its stamp), hashing the bytes copied: only the NEFF its
    compile recorded passes."""
    if isinstance(content, bytes):
        path.write_bytes(content)
        return path
    hashed = hashlib.sha256()
    with open(content.source, "rb") as source, open(path, "wb") as target:
        while chunk := source.read(CHUNK):
            hashed.update(chunk)
            target.write(chunk)
    if hashed.hexdigest() != content.sha256:
        raise BuildError(
            f"{content.source} changed after it was compiled (its sha256 differs from "
            "the compile record); run the build again to restore it",
            unit=content.unit,
        )
    return path


def _remove_empty_dirs(root: Path, removed: list[str]) -> None:
    parents = {parent for name in removed for parent in PurePosixPath(name).parents}
    for parent in sorted(parents - {PurePosixPath()}, key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):  # not empty (or gone): kept
            (root / parent).rmdir()
