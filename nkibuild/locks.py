"""Exclusive locks held through an open descriptor (`fcntl.flock`).

The kernel drops such a lock when its holder exits or dies, so none is ever stale, and
two descriptors exclude each other also within one process (two builds in two threads).
Not filelock's lock files: filelock opens them with O_TRUNC, following a symlink (a link
planted in a build or cache dir would truncate a file outside it), and importing it
costs a no-op build about a fifteenth of its instructions.
"""

from __future__ import annotations

import fcntl
import time

POLL_S = 0.01


def lock_descriptor(fd: int, timeout: float) -> bool:
    """Lock `fd` exclusively, waiting up to `timeout` seconds; False if it is still held
    elsewhere then. Closing the descriptor releases the lock."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_S)
