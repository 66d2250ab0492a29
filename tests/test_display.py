"""The progress displays write every task's line to the stream they were made with,
even while doit's parallel runner swaps `sys.stdout` for its capture objects."""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from conftest import run_nkibuild
from helpers import softmax_project

from nkibuild.cli.display import PlainDisplay, RichDisplay
from nkibuild.graph.report import BuildSummary, TaskOutcome

KERNELS = [f"softmax_{i}" for i in range(4)]
TARGETS = ["trn1", "trn2"]
# 4 extracts + 8 compiles + bundle + wheel: more tasks than -j 4 runs at once.
TASKS = [
    *(f"extract:{k}/default" for k in KERNELS),
    *(f"compile:{k}/default/{t}" for k in KERNELS for t in TARGETS),
    "bundle",
    "wheel",
]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
PTY_TIMEOUT_S = 120


def many_tasks_project(root: Path) -> Path:
    kernels = "".join(
        f"  {name}:\n"
        "    frontend: hlo\n"
        "    source: kernels/softmax.hlo.pb\n"
        "    inputs:\n"
        "      logits: {shape: [64, 1024], dtype: float32}\n"
        for name in KERNELS
    )
    manifest = (
        "format-version: 1\n"
        "package: {name: many-kernels, version: 0.1.0}\n"
        f"defaults: {{targets: [{', '.join(TARGETS)}]}}\n"
        f"kernels:\n{kernels}"
    )
    return softmax_project(root, manifest)


def run_on_terminal(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run `argv` with stdout and stderr on a pseudo-terminal; its exit code and output."""
    master, slave = os.openpty()
    # Wide enough that no task line wraps (a pty starts at 0x0: rich would assume 80).
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env, close_fds=True
    )
    os.close(slave)
    try:
        output = _read_until_closed(master, time.monotonic() + PTY_TIMEOUT_S)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    return proc.wait(), output.decode("utf-8", "replace")


def _read_until_closed(master: int, deadline: float) -> bytes:
    chunks = []
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 1.0)
        if not ready:
            continue
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: every holder of the terminal's other end has closed it
            break
        if not data:
            break
        chunks.append(data)
    else:
        pytest.fail(f"the build did not finish within {PTY_TIMEOUT_S}s")
    return b"".join(chunks)


def terminal_env() -> dict[str, str]:
    """The environment of an interactive terminal: rich display on."""
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "NO_COLOR", "COLUMNS")}
    return {**env, "TERM": "xterm-256color"}


def test_every_task_line_reaches_the_terminal_with_parallel_jobs(tmp_path: Path) -> None:
    project = many_tasks_project(tmp_path / "project")
    argv = [sys.executable, "-m", "nkibuild", "-C", str(project)]
    code, output = run_on_terminal(
        [*argv, "build", "--toolchain", "fake", "-j", "4"], terminal_env()
    )
    text = ANSI.sub("", output).replace("\r", "")
    assert code == 0, text
    assert "━" in output, f"not the rich display:\n{text}"
    missing = [name for name in TASKS if f"✓ {name} " not in text]
    assert not missing, f"{len(missing)} of {len(TASKS)} task lines missing: {missing}\n{text}"
    assert f"{len(TASKS)} ran" in text


def test_every_finished_task_is_listed_on_a_pipe_with_parallel_jobs(tmp_path: Path) -> None:
    project = many_tasks_project(tmp_path / "project")
    result = run_nkibuild(["build", "--toolchain", "fake", "-j", "4"], cwd=project)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    listed = [m[1] for line in lines if (m := re.match(r"\[\s*\d+/14\] done\s+(\S+) ", line))]
    assert sorted(listed) == sorted(TASKS), result.stdout
    counters = [line.split("]")[0] for line in lines if line.startswith("[")]
    assert counters == [f"[{n:>2}/14" for n in range(1, 15)]


def outcome(name: str) -> TaskOutcome:
    return TaskOutcome(name, "done", 0.5, "compiled")


def test_plain_display_keeps_the_stream_it_was_made_with() -> None:
    real, capture = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(real):
        display = PlainDisplay()
    display.start(1)
    with contextlib.redirect_stdout(capture):  # as doit does around an action
        display.task_finished(outcome("compile:k/default/trn2"))
    display.close()  # its heartbeat thread: left running, it would outlive the test
    assert "done   compile:k/default/trn2 0.5s (compiled)" in real.getvalue()
    assert capture.getvalue() == ""


def test_rich_display_keeps_the_stream_it_was_made_with() -> None:
    real, capture = io.StringIO(), io.StringIO()
    display = RichDisplay(real)
    display.start(1)
    with contextlib.redirect_stdout(capture), contextlib.redirect_stderr(capture):
        display.task_started("compile:k/default/trn2")
        display.task_finished(outcome("compile:k/default/trn2"))
    display.finish(BuildSummary())
    assert "✓ compile:k/default/trn2 0.5s (compiled)" in real.getvalue()
    assert capture.getvalue() == ""
