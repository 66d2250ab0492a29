"""One traceback per way a kernel fails to trace, not one per variant.

A kernel with ten shape variants that raises at the same line of the author's code ten
times is one mistake; the build shows its traceback once, under the first variant,
and names the others in one line each.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class TraceFailures:
    """Failures seen by one build (its session owns this); extractions run in threads."""

    _first: dict[tuple[str, str, str], str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def already_reported(self, root: str, kernel: str, cause: str, unit: str) -> str | None:
        """The unit that already showed this kernel failing with `cause` (exception type
        and innermost user frame), or None: then `unit` shows it."""
        with self._lock:
            first = self._first.setdefault((root, kernel, cause), unit)
        return None if first == unit else first
