"""Ctrl-C while a child process is being started: the child is never left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from nkibuild import interrupts
from nkibuild.compiler import process as process_module
from nkibuild.compiler.process import ProcessRegistry, run_process
from nkibuild.toolchain import VersionQuery


def test_ctrl_c_in_the_block_is_raised_when_it_ends() -> None:
    reached = []
    with pytest.raises(KeyboardInterrupt), interrupts.deferred():
        os.kill(os.getpid(), signal.SIGINT)
        reached.append("after the signal")
    assert reached == ["after the signal"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_wins_over_an_error_of_the_block() -> None:
    with pytest.raises(KeyboardInterrupt), interrupts.deferred():
        os.kill(os.getpid(), signal.SIGINT)
        raise OSError("the start failed")


def test_a_handler_the_program_installed_is_left_alone() -> None:
    received: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: received.append(signum))
    try:
        with interrupts.deferred():
            os.kill(os.getpid(), signal.SIGINT)
        assert received == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, previous)


def test_outside_the_main_thread_nothing_is_changed() -> None:
    seen: list[object] = []

    def in_thread() -> None:
        with interrupts.deferred():
            seen.append(signal.getsignal(signal.SIGINT))

    thread = threading.Thread(target=in_thread)
    thread.start()
    thread.join()
    assert seen == [signal.default_int_handler]


REAL_POPEN = subprocess.Popen


class InterruptedAfterStart:
    """subprocess.Popen, with Ctrl-C arriving just after the child started (before the
    object reaches the caller): the moment that used to leave the child behind."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[Any]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> subprocess.Popen[Any]:
        child = REAL_POPEN(*args, **kwargs)
        self.started.append(child)
        os.kill(os.getpid(), signal.SIGINT)
        return child


def test_a_compiler_started_as_ctrl_c_arrives_is_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    popen = InterruptedAfterStart()
    monkeypatch.setattr(process_module.subprocess, "Popen", popen)
    registry = ProcessRegistry()
    with pytest.raises(KeyboardInterrupt):
        run_process(["sleep", "60"], tmp_path, tmp_path / "out.log", None, registry)
    (child,) = popen.started
    assert child.returncode is not None  # killed and reaped, not sleeping on


def test_a_version_query_started_as_ctrl_c_arrives_is_killed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    popen = InterruptedAfterStart()
    monkeypatch.setattr(subprocess, "Popen", popen)
    command = (sys.executable, "-c", "import time; time.sleep(60)")
    with pytest.raises(KeyboardInterrupt):
        VersionQuery(command)
    (child,) = popen.started
    assert child.returncode is not None
