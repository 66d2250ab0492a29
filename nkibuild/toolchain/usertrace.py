"""What a kernel author needs from an exception raised by their code at trace time.

The worker's traceback runs through nkibuild's worker and tracer and through jax or
nkipy internals; the author can act only on their own lines. So a failure shows the
frames of files inside the project (not a virtualenv kept there), paths relative to
the project, and names the innermost of them: the place two variants of one kernel
failing the same way have in common.
"""

from __future__ import annotations

import os
import traceback
from dataclasses import dataclass
from pathlib import Path

# Notes a library appends to say it hid its own frames: true, and here not actionable.
_LIBRARY_NOTES = ("JAX_TRACEBACK_FILTERING",)
_ENVIRONMENT_DIRS = frozenset({"site-packages", "dist-packages"})


@dataclass(frozen=True)
class UserTraceback:
    text: str  # "Traceback ...", the user's frames, the exception
    where: str  # innermost user frame, "kernels/k.py:7 in helper"; "" if none


def user_traceback(error: BaseException, root: str) -> UserTraceback:
    """The user's part of `error`'s traceback. An error that did not pass through the
    user's code (nor names a user file, as a SyntaxError does) keeps every frame: it is
    a library's or nkibuild's, and its frames are what a bug report needs."""
    project = os.path.join(os.path.realpath(root), "")
    full = "".join(traceback.format_exception(error))
    report = traceback.TracebackException.from_exception(error)
    innermost = _keep_user_frames(report, project)
    if innermost is not None:
        where = f"{innermost.filename}:{innermost.lineno} in {innermost.name}"
        return UserTraceback("".join(report.format()), where)
    if isinstance(error, SyntaxError) and report.filename != error.filename:
        where = f"{report.filename}:{report.lineno}"
        return UserTraceback("".join(report.format_exception_only()), where)
    return UserTraceback(full, "")


def _keep_user_frames(
    report: traceback.TracebackException, project: str
) -> traceback.FrameSummary | None:
    """Filter `report` and the exceptions chained to it in place; return the innermost
    user frame of the outermost exception."""
    innermost = None
    seen: set[int] = set()
    pending: list[traceback.TracebackException | None] = [report]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        kept = [
            traceback.FrameSummary(relative, frame.lineno, frame.name, line=frame.line)
            for frame in current.stack
            if (relative := _relative_path(frame.filename, project)) is not None
        ]
        if getattr(current, "filename", None):  # a SyntaxError names its file itself
            current.filename = _relative_path(current.filename, project) or current.filename
        current.stack = traceback.StackSummary.from_list(kept)
        notes = getattr(current, "__notes__", None)
        if notes:
            current.__notes__ = [n for n in notes if not any(s in n for s in _LIBRARY_NOTES)]
        if current is report and kept:
            innermost = kept[-1]
        pending += [current.__cause__, current.__context__]
    return innermost


def _relative_path(filename: str, project: str) -> str | None:
    """`filename` relative to the project, or None if it is not the user's file."""
    if not os.path.isabs(filename):  # "<frozen importlib._bootstrap>", "<string>"
        return None
    path = os.path.realpath(filename)
    if not path.startswith(project):
        return None
    relative = Path(path[len(project) :])
    return None if _ENVIRONMENT_DIRS.intersection(relative.parts) else relative.as_posix()
