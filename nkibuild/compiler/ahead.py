"""Kernels whose source was edited, extracted and compiled while the build still decides.

After an edit, the up-to-date decision compares the project's sources first and names
the tasks a changed source makes pending (graph/uptodate.py `decide`) before it compares
every other file: 0.3 s at 10,000 units, during which the build's other cores idle.
Those kernels' extract and compile tasks are pending whatever the rest of the decision
finds, so a session thread starts their work then: it extracts each kernel into its
staging directory (frontends/ahead.py) and compiles the kernel's units from there into
their compile directories, one compile at a time, as their compile tasks would
(`compile_unit`: cache lookups, checks, publishing, `result.json` written last).

The tasks, when doit runs them, find the work done. The extract task takes the staged
artifact if its files are as they were when it was extracted (copying its files into
place while a compile ahead still reads them: the kernel's other units need not wait
for that compile to start theirs). A compile task waits for a compile ahead into its
directory still under way, then compiles as always and finds the finished result in
its directory for its key (`compile_unit`'s reuse of the build dir); it reports the
unit as this build compiled it. A compile that failed ahead is raised by its task, if
the key is the same: a compiler is not run twice to fail twice. An artifact extracted
again (a source changed meanwhile) has another key: the unit is compiled for it.

No compile starts once doit runs the tasks (`stop_starting`), and one under way takes
one of the `--jobs` compilers the memory budget admits (compiler/budget.py): doit's
compiles wait for it as for one of their own. An edited kernel whose extraction fails
ahead (a traced kernel that raises) is extracted again by its task, which reports it.
A compile directory is its task's alone, and the task is pending, so writing it early
changes nothing doit or the proof decide.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from nkibuild.compiler.key import cache_key
from nkibuild.compiler.process import ProcessRegistry
from nkibuild.compiler.record import RESULT_FILE, CompiledNeff
from nkibuild.errors import BuildError
from nkibuild.plan import BuildUnit, ExtractSpec

if TYPE_CHECKING:
    from nkibuild.context import BuildContext
    from nkibuild.frontends import HloArtifact


@dataclass(frozen=True)
class KernelAhead:
    """One extraction to do ahead, with the files its task depends on and its units."""

    spec: ExtractSpec
    files: list[str]
    units: tuple[BuildUnit, ...]


@dataclass(frozen=True)
class CompiledAhead:
    """What compiling a unit ahead gave, for the cache key `digest`."""

    digest: str
    result: CompiledNeff | BuildError

    def raise_failure(self, digest: str) -> None:
        """Raise the compile's failure if it was for the key `digest`."""
        if isinstance(self.result, BuildError) and digest == self.digest:
            raise self.result

    def reported(self, result: CompiledNeff) -> CompiledNeff:
        """The task's `result` as the compile ahead made it (compiled by this build, or
        fetched from a cache), where the task found that one in its build dir."""
        ahead = self.result
        if isinstance(ahead, BuildError) or result.origin != "build-dir":
            return result
        if result.cache_key != self.digest:
            return result
        return replace(result, origin=ahead.origin, notices=ahead.notices)


class CompilesAhead:
    """The session's compiles ahead (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._starting = True
        self._thread: threading.Thread | None = None
        self._outcomes: dict[str, CompiledAhead] = {}  # by compile dir
        self._under_way: dict[str, threading.Event] = {}  # compile dirs, set when done
        # Its compilers' own: the session's end stops those no task waits for.
        self._processes = ProcessRegistry()

    def start(self, context: BuildContext, kernels: Sequence[KernelAhead]) -> None:
        """Extract and compile `kernels`, in order, in a thread of the session's."""
        with self._lock:
            if not self._starting or self._thread is not None or not kernels:
                return
            self._thread = threading.Thread(
                target=self._work, args=(context, kernels), name="nkibuild-ahead", daemon=True
            )
        self._thread.start()

    def stop_starting(self) -> None:
        """doit runs the tasks now: no compile starts ahead any more."""
        with self._lock:
            self._starting = False

    def take(self, out_dir: Path) -> CompiledAhead | None:
        """What compiling ahead into `out_dir` gave, once it ended (None: nothing was
        compiled there): the task never compiles beside it into the same directory."""
        key = str(out_dir)
        with self._lock:
            under_way = self._under_way.get(key)
        if under_way is not None:
            under_way.wait()
        with self._lock:
            return self._outcomes.pop(key, None)

    def finish(self) -> None:
        """The session ends: stop a compile still under way (no task took its kernel: the
        build failed before), drop what no task took; ready for the session's next run."""
        self.stop_starting()
        self._processes.kill_all()
        try:
            if self._thread is not None:
                self._thread.join()
        finally:
            with self._lock:
                self._thread = None
                self._outcomes.clear()
                self._starting = True
            self._processes.reopen()

    def _may_start(self) -> bool:
        with self._lock:
            return self._starting

    def _work(self, context: BuildContext, kernels: Sequence[KernelAhead]) -> None:
        extractions = context.session.extractions_ahead
        try:
            for kernel in kernels:
                if not self._may_start():
                    return
                extractions.extract(context, kernel.spec, kernel.files)
                for unit in kernel.units:
                    with extractions.reading(context, kernel.spec) as artifact:
                        if artifact is None or not self._compiled(context, unit, artifact):
                            break
        except Exception:  # e.g. a cache that cannot be opened: the tasks report it
            return

    def _compiled(self, context: BuildContext, unit: BuildUnit, artifact: HloArtifact) -> bool:
        """Compile `unit` ahead, noted as under way for its task to wait for; False if
        no compile may start any more."""
        out_dir = context.layout.compile_dir(unit)
        key = str(out_dir)
        done = threading.Event()
        with self._lock:
            if not self._starting:
                return False
            # Gone before doit can look at the task (stop_starting takes this lock): its
            # outputs are not taken as intact while this compiles into its directory.
            (out_dir / RESULT_FILE).unlink(missing_ok=True)
            self._under_way[key] = done
        try:
            outcome = self._compile(context, unit, artifact)
            with self._lock:
                if outcome is not None:
                    self._outcomes[key] = outcome
        finally:
            with self._lock:
                del self._under_way[key]
            done.set()
        return True

    def _compile(
        self, context: BuildContext, unit: BuildUnit, artifact: HloArtifact
    ) -> CompiledAhead | None:
        from nkibuild.compiler import compile_options, compile_unit

        digest = cache_key(unit, artifact.content_hash, context.toolchain).digest
        out_dir = context.layout.compile_dir(unit)
        options = replace(compile_options(context), processes=self._processes)
        try:
            return CompiledAhead(
                digest, compile_unit(unit, artifact, context.toolchain, out_dir, options)
            )
        except BuildError as error:
            return CompiledAhead(digest, error)
        except Exception:  # the task compiles, and reports whatever this was
            return None
