"""Atomic file writes: a killed build never leaves a half-written file behind."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def atomic_write_bytes(path: Path, data: bytes, *, durable: bool = True) -> None:
    with atomic_output(path, durable=durable) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: Path, text: str, *, durable: bool = True) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), durable=durable)


@contextlib.contextmanager
def atomic_output(path: Path, *, durable: bool = True) -> Iterator[Path]:
    """Yield a temp path beside `path`; rename it over `path` only if the block succeeds.

    The rename alone makes the write atomic for a killed process. `durable` adds an
    fsync so it also survives a power loss; files only ever read as hints (and
    checked when read) skip that cost.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        if durable:
            with open(tmp, "rb+") as handle:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_copy(source: Path, destination: Path, *, durable: bool = True) -> None:
    with atomic_output(destination, durable=durable) as tmp:
        shutil.copyfile(source, tmp)


@contextlib.contextmanager
def staging_dir(final: Path) -> Iterator[Path]:
    """Yield an empty sibling dir; on success it replaces `final` in two renames.

    The old tree is moved aside before the new one is moved in, so at every
    moment `final` is either the complete old tree or the complete new one
    (or briefly absent, which readers treat as "not built").
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".new", dir=final.parent))
    try:
        yield stage
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        if final.exists():
            os.replace(final, old)
        os.replace(stage, final)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
