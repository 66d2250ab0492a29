"""Cache directories on a local filesystem, walked without ever following a symlink.

A shared cache directory is writable by others: anything in it may be a symlink to
`/etc/passwd`, a FIFO that blocks a reader forever, a device, or a sparse file of
10 GB. Everything here opens path components one at a time relative to the parent's
descriptor with `O_NOFOLLOW` (so a symlinked `neff/`, `neff/ab/` or entry directory is
refused, never entered), opens files with `O_NONBLOCK` (a FIFO cannot block) and
checks with `fstat` that what was opened is a regular file of bounded size. Writes
are made the same way: files created (`O_EXCL | O_NOFOLLOW`) and renamed relative to a
directory descriptor that was checked, never through a path resolved again.

Removal is just as careful: only names the caller recognizes as nkibuild's own
(`ours`), only regular files, and a directory only once it is empty. Whatever else
is found is left in place and described.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import os
import secrets
import shutil
import stat
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from nkibuild.cache.store import CorruptEntry
from nkibuild.confine import file_kind

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 20


@contextlib.contextmanager
def opened_dir(
    root: str | Path | int, parts: Sequence[str], *, make: bool = False
) -> Iterator[int]:
    """A descriptor of `root/parts...`; `root` itself may be a symlink (the user chose
    it), no component below it may be. FileNotFoundError when a component is missing
    (with `make`, it is made, as mkdir() would), CorruptEntry when one is a symlink or
    not a directory. `root` may be a descriptor (not closed here). Files made relative
    to the descriptor land in the directory that was checked, even if its path is
    swapped for a symlink meanwhile: a path is never resolved twice."""
    if isinstance(root, int):
        fd = os.dup(root)
    else:
        if make:
            Path(root).mkdir(parents=True, exist_ok=True)
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts:
            child = _opened_or_made(fd, part) if make else _open_child_dir(fd, part)
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def _opened_or_made(parent: int, name: str) -> int:
    try:
        return _open_child_dir(parent, name)
    except FileNotFoundError:
        with contextlib.suppress(FileExistsError):  # made meanwhile by another build
            os.mkdir(name, dir_fd=parent)
        return _open_child_dir(parent, name)


def _open_child_dir(parent: int, name: str) -> int:
    """A descriptor of the directory `name` in `parent`; CorruptEntry for a symlink or
    anything else that is not a directory."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            raise CorruptEntry(f"{name} is a symbolic link or not a directory") from None
        raise


@contextlib.contextmanager
def opened_file(
    dir_fd: int, name: str, max_bytes: int
) -> Iterator[tuple[Callable[[int], bytes], int]]:
    """(a read function, size) of a regular file of at most `max_bytes` in `dir_fd`. A
    read that fails (EIO) raises CorruptEntry: the file's failure, not the reader's."""
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise CorruptEntry(f"{name} is a symbolic link") from None
        raise
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise CorruptEntry(f"{name} is not a regular file ({file_kind(status.st_mode)})")
        if status.st_size > max_bytes:
            raise CorruptEntry(f"{name} is {status.st_size} bytes, more than {max_bytes}")
        yield functools.partial(_read, fd), status.st_size
    finally:
        os.close(fd)


def _read(fd: int, size: int) -> bytes:
    try:
        return os.read(fd, size)
    except OSError as error:
        raise CorruptEntry(f"unreadable ({error.strerror or error})") from None


def replace_file(dir_fd: int, name: str, content: bytes | Path) -> None:
    """Write `content` (bytes, or a file's) to `name` in `dir_fd` atomically: a temp file
    created there with the mode open() gives, never through a name already there (a
    planted symlink is refused, EEXIST, and left alone), then renamed over `name`
    relative to the same descriptor (which replaces a symlink there, never follows it)."""
    temp = f".{name}.{secrets.token_hex(16)}.tmp"
    out = open(os.open(temp, _NEW_FILE_FLAGS, 0o666, dir_fd=dir_fd), "wb")  # noqa: SIM115
    try:
        with out:
            _fill(out, content)
        os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        os.unlink(temp, dir_fd=dir_fd)
        raise


def _fill(out: BinaryIO, content: bytes | Path) -> None:
    if isinstance(content, bytes):
        out.write(content)
        return
    with open(content, "rb") as source:
        shutil.copyfileobj(source, out)


def read_small(root: str | Path | int, parts: Sequence[str], name: str, max_bytes: int) -> bytes:
    with opened_dir(root, parts) as dir_fd, opened_file(dir_fd, name, max_bytes) as (read, _):
        return b"".join(blocks(read, max_bytes))


def copy_hashed(read: Callable[[int], bytes], destination: Path, max_bytes: int) -> str:
    """Copy what `read` gives to `destination`, hashing what is written; its sha256."""
    digest = hashlib.sha256()
    with open(destination, "wb") as out:
        for block in blocks(read, max_bytes):
            digest.update(block)
            out.write(block)
    return digest.hexdigest()


def blocks(read: Callable[[int], bytes], max_bytes: int) -> Iterator[bytes]:
    """What `read` gives until its end, stopped past `max_bytes`: a file that grows while
    it is read (its size was checked when it was opened)."""
    size = 0
    while block := read(_CHUNK):
        size += len(block)
        if size > max_bytes:
            raise CorruptEntry(f"it grew past {max_bytes} bytes while being read")
        yield block


def child_dirs(dir_fd: int, wanted: Callable[[str], object]) -> tuple[list[str], list[str]]:
    """(real subdirectories whose names are `wanted`, wanted names that are symlinks or
    other non-directories). Other names are not nkibuild's and are not looked at."""
    found, strays = [], []
    for name in sorted(os.listdir(dir_fd)):
        if not wanted(name):
            continue
        try:
            mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
        except FileNotFoundError:
            continue
        (found if stat.S_ISDIR(mode) else strays).append(name)
    return found, strays


def regular_files(dir_fd: int) -> dict[str, os.stat_result]:
    """Every name in `dir_fd` with its lstat (symlinks are not followed)."""
    found = {}
    for name in os.listdir(dir_fd):
        with contextlib.suppress(FileNotFoundError):
            found[name] = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    return found


def check_owned(dir_fd: int, ours: Callable[[str], object]) -> None:
    """CorruptEntry naming what in `dir_fd` nkibuild did not write (other names, or its
    names as non-files), if anything."""
    others = sorted(
        name
        for name, status in regular_files(dir_fd).items()
        if not (ours(name) and stat.S_ISREG(status.st_mode))
    )
    if others:
        raise CorruptEntry(f"it holds files nkibuild did not write ({', '.join(others[:5])})")


def remove_owned_dir(parent_fd: int, name: str, ours: Callable[[str], object]) -> None:
    """Remove `parent/name`: its regular files named `ours`, then the directory.

    Raises CorruptEntry (nothing removed) when it holds anything else, OSError when
    the filesystem refuses (read-only, permissions)."""
    fd = _open_child_dir(parent_fd, name)
    try:
        check_owned(fd, ours)
        for child, status in regular_files(fd).items():
            if ours(child) and stat.S_ISREG(status.st_mode):  # re-checked: it may have changed
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(child, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent_fd)
