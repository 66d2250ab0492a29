"""Prebuilt HLO modules extracted ahead, while a compiler runs, for their extract tasks.

In a cold build both compiles of a kernel wait for its extract task, which doit runs
only once a compile slot is free: between two compiles, on the build's critical path.
Extracting a prebuilt module (`frontend: hlo`: no user code runs, only file reads,
checks and writes) does not depend on any compile, so a compile thread does it while
its compiler runs (compiler/chores.py), into a staging directory beside the artifact's
(`.<name>.ahead.new`), where nothing of the build looks.

The extract task, when doit runs it, takes the staged artifact if the files the task
depends on have the stat stamps they had before the extraction ahead read them: the
staging directory is renamed into the artifact's place where that is free (the whole
artifact appears at once), else its files are moved in as `extract` writes them (the
module, its sidecars, the metadata last). Otherwise, or if the extraction ahead
failed, the task extracts as always (and reports what fails). An extraction no task
took (doit found the task up to date, or it was not selected) is removed when the
session ends; a killed build leaves the staging directory to the next build's sweep
(fsutil.LEFTOVER_PATTERNS).

Like every chore with a job, it runs only in a wait during which all compile slots'
compilers run (neuronxcc._chores): not while another slot prepares its compile.

The compiles ahead of an edited kernel (compiler/ahead.py) extract it here too, of any
frontend (a traced one in the session's workers), and compile from the staging
directory while they hold it (`reading`): its extract task then copies the files into
place instead of moving them, and the last reader removes the staging directory.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from nkibuild.frontends import (
    HLO_FILE,
    METADATA_FILE,
    SIDECAR_DIR,
    HloArtifact,
    Tracing,
    extract,
    forget_artifact,
)
from nkibuild.fsutil import stamp_of
from nkibuild.plan import ExtractSpec

if TYPE_CHECKING:
    from nkibuild.context import BuildContext

# Frontends whose extraction runs no user code: cheap, and nothing to trace in a worker.
AHEAD_FRONTENDS = frozenset({"hlo"})


@dataclass
class _Extraction:
    done: threading.Event = field(default_factory=threading.Event)
    artifact: HloArtifact | None = None  # None: not (yet) extracted, or failed
    stamps: tuple[str, ...] = ()  # of the task's files, taken before they were read
    taken: bool = False  # the extract task has come for it (or ran without it)
    # Compiles ahead reading the staged artifact now (compiler/ahead.py): the extract
    # task copies the files into place rather than moving them, and the last reader
    # removes the staging directory.
    readers: int = 0


class ExtractionsAhead:
    """The session's extractions ahead, by artifact directory."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._extractions: dict[str, _Extraction] = {}

    def extract(self, context: BuildContext, spec: ExtractSpec, files: list[str]) -> None:
        """Extract `spec` into its staging directory, unless its task came first. `files`:
        what the task depends on (its file_dep). A chore: it never raises."""
        out_dir = context.layout.extract_dir(spec)
        extraction = _Extraction()
        with self._lock:
            if str(out_dir) in self._extractions:
                return
            self._extractions[str(out_dir)] = extraction
        staging = staging_dir(out_dir)
        try:
            stamps = _stamps(files)
            shutil.rmtree(staging, ignore_errors=True)  # a killed build's
            session = context.session
            tracing = Tracing(session.workers, session.trace_failures)
            extraction.artifact = extract(
                spec, context.manifest.root, staging, context.toolchain, tracing
            )
            extraction.stamps = stamps
        except Exception:  # the task extracts again, and reports whatever this was
            shutil.rmtree(staging, ignore_errors=True)
        finally:
            extraction.done.set()

    def take(
        self, context: BuildContext, spec: ExtractSpec, files: list[str]
    ) -> HloArtifact | None:
        """The artifact extracted ahead for `spec`, moved (or, while a compile ahead reads
        it, copied) into place, if `files` are as they were when it was extracted; None:
        the caller extracts (and from now on no extraction ahead starts for it). Waits for
        an extraction ahead under way."""
        out_dir = context.layout.extract_dir(spec)
        with self._lock:
            extraction = self._extractions.get(str(out_dir))
            if extraction is None:
                self._extractions[str(out_dir)] = _Extraction(taken=True)
                return None
            if extraction.taken:
                return None
            extraction.taken = True
        extraction.done.wait()
        if extraction.artifact is None:
            return None
        staging = staging_dir(out_dir)
        with self._lock:
            read = extraction.readers > 0
            extraction.readers += 1  # the staging dir stays while this copies from it
        try:
            unchanged = _stamps(files) == extraction.stamps
        except OSError:  # a file gone: the task's own extraction says so
            unchanged = False
        try:
            if unchanged and read:
                return _placed(extraction.artifact, staging, out_dir, _copied)
            if unchanged:
                return _moved_in(extraction.artifact, staging, out_dir)
            return None
        finally:
            self._release(extraction, staging)

    @contextlib.contextmanager
    def reading(self, context: BuildContext, spec: ExtractSpec) -> Iterator[HloArtifact | None]:
        """The artifact extracted ahead for `spec`, left in its staging directory while
        the caller reads it (its extract task, meanwhile, copies the files into place);
        None if there is none, or its task came for it first."""
        out_dir = context.layout.extract_dir(spec)
        with self._lock:
            extraction = self._extractions.get(str(out_dir))
            if extraction is None or extraction.taken or not extraction.done.is_set():
                extraction = None
            else:
                extraction.readers += 1
        try:
            yield extraction.artifact if extraction is not None else None
        finally:
            if extraction is not None:
                self._release(extraction, staging_dir(out_dir))

    def _release(self, extraction: _Extraction, staging: Path) -> None:
        """One reader is done with the staging dir: the last removes it once the task
        has taken (or refused) what it holds."""
        with self._lock:
            extraction.readers -= 1
            last = extraction.readers == 0 and extraction.taken
        if last:
            shutil.rmtree(staging, ignore_errors=True)

    def discard(self) -> None:
        """The session ends: remove what no task took."""
        with self._lock:
            left = [key for key, e in self._extractions.items() if not e.taken]
            self._extractions.clear()
        for key in left:
            shutil.rmtree(staging_dir(Path(key)), ignore_errors=True)


def staging_dir(out_dir: Path) -> Path:
    return out_dir.parent / f".{out_dir.name}.ahead.new"


def _stamps(files: list[str]) -> tuple[str, ...]:
    return tuple(stamp_of(os.stat(path)) for path in files)


def _moved_in(artifact: HloArtifact, staging: Path, out_dir: Path) -> HloArtifact:
    """The staged artifact in `out_dir`: the staging dir renamed into its place where
    there is none (a cold build: the whole artifact appears at once), else its files
    moved in (`_placed`)."""
    try:
        os.rename(staging, out_dir)
        return replace(artifact, directory=out_dir)
    except OSError:  # out_dir exists (an earlier artifact's files, its sidecars)
        return _placed(artifact, staging, out_dir, os.replace)


def _placed(
    artifact: HloArtifact, staging: Path, out_dir: Path, put: Callable[[Path, Path], None]
) -> HloArtifact:
    """The staged artifact's files put into `out_dir` (moved, or copied while a compile
    ahead still reads them) in `extract`'s order: the metadata, which marks an artifact
    whole, last."""
    out_dir.mkdir(parents=True, exist_ok=True)
    forget_artifact(out_dir)
    shutil.rmtree(out_dir / SIDECAR_DIR, ignore_errors=True)  # no stale sidecars
    if artifact.sidecars:
        put(staging / SIDECAR_DIR, out_dir / SIDECAR_DIR)
    put(staging / HLO_FILE, out_dir / HLO_FILE)
    put(staging / METADATA_FILE, out_dir / METADATA_FILE)
    return replace(artifact, directory=out_dir)


def _copied(source: Path, target: Path) -> None:
    """`target` made a copy of `source` (a file, or a directory's files), a file replaced
    atomically (through a temp name, a leftover if the build is killed). A copy, not a
    hard link: the reader's removal of the staging name would change the ctime of a
    linked file after its task recorded its stamp."""
    if source.is_dir():
        shutil.copytree(source, target)
        return
    temporary = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    shutil.copyfile(source, temporary)
    os.replace(temporary, target)
