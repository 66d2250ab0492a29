"""Ctrl-C held back while a child process is started and handed to whoever ends it.

Python raises KeyboardInterrupt in the main thread at the next bytecode, which can be
inside `subprocess.Popen` after the child was started but before its object is
returned: nothing then knows the child, and it outlives the build (a compiler for
hours). Around such a start the interrupt is noted instead and raised once the child
is in the caller's hands (registered, or assigned where cleanup finds it).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold back Ctrl-C (SIGINT) for the block, then raise it. Only in the main thread
    (the only one Python raises it in) and only over Python's own handler: a handler
    the embedding program installed is left to do what it does."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    received: list[int] = []

    def note(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)

    signal.signal(signal.SIGINT, note)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if received:  # over whatever else the block raised: the user asked to stop
            raise KeyboardInterrupt
