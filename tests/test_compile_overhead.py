"""What the compile stage does around the compiler: the compiled NEFF hard-linked into the
local cache (and never spoiled through the link), atomic writes, the compiler started
without forking the build process and still killed with it."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import build, softmax_manifest, softmax_project

from nkibuild.cache import LocalCache
from nkibuild.compiler.process import DeathGuard, run_process
from nkibuild.fsutil import atomic_write_bytes

UNITS = ("softmax/default/trn1", "softmax/default/trn2")


def project(root: Path) -> Path:
    return softmax_project(root, softmax_manifest("{name: overhead, version: 0.1.0}"))


def test_the_compiled_neff_is_hard_linked_into_the_local_cache(
    tmp_path: Path, isolated_cache: Path
) -> None:
    root = project(tmp_path / "a")
    assert build(root, "compile:*").ok
    entries = LocalCache(isolated_cache).entries()
    assert len(entries) == 2
    built = {(root / "build/compile" / u / "model.neff").stat().st_ino for u in UNITS}
    cached = {(e.directory / "model.neff").stat().st_ino for e in entries}
    assert built == cached
    logs = {(e.directory / "compile.log").stat().st_ino for e in entries}
    assert logs == {(root / "build/compile" / u / "compile.log").stat().st_ino for u in UNITS}
    assert LocalCache(isolated_cache).verify() == []


def test_a_build_neff_edited_in_place_spoils_no_later_build(
    tmp_path: Path, isolated_cache: Path
) -> None:
    """The hazard of sharing an inode: the entry changes with the build's file. The entry's
    recorded sha256 catches it; the next checkout compiles instead of using it."""
    first = project(tmp_path / "a")
    assert build(first, "compile:*").ok
    for unit in UNITS:
        with open(first / "build/compile" / unit / "model.neff", "r+b") as neff:
            neff.seek(100)
            neff.write(b"edited in place")
    summary = build(project(tmp_path / "b"), "compile:*")
    assert summary.origins == {"compiled": 2}
    assert len(summary.notices) == 2
    assert all(
        "corrupt cache entry" in n and "differs from the recorded" in n for n in summary.notices
    )
    assert LocalCache(isolated_cache).verify() == []


def test_a_cache_on_another_filesystem_gets_copies(
    tmp_path: Path, isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def cross_device(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))

    monkeypatch.setattr(os, "link", cross_device)
    root = project(tmp_path / "a")
    assert build(root, "compile:*").ok
    for entry in LocalCache(isolated_cache).entries():
        neff = entry.directory / "model.neff"
        assert neff.stat().st_nlink == 1
        assert neff.read_bytes() in {
            (root / "build/compile" / u / "model.neff").read_bytes() for u in UNITS
        }
    assert build(project(tmp_path / "b"), "compile:*").origins == {"cache-local": 2}


def test_a_failed_atomic_write_keeps_the_old_file_and_leaves_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "result.json"
    atomic_write_bytes(target, b"old", durable=False)

    def full(fd: int, mode: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fchmod", full)
    with pytest.raises(OSError, match="No space left on device") as raised:
        atomic_write_bytes(target, b"new", durable=True)
    assert raised.value.filename == str(target)  # named as the file that was not written
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]


# --- starting the compiler ---------------------------------------------------------------


GUARDS: dict[str, Callable[[], DeathGuard]] = {
    "setpriv": DeathGuard.find,
    "preexec_fn": DeathGuard.fallback,
}


def test_the_compiler_is_started_behind_setpriv_where_there_is_one() -> None:
    guard = DeathGuard.find()
    if guard.prefix == ():
        pytest.skip("no setpriv on this machine: the preexec_fn fallback is used")
    assert guard.preexec_fn is None  # which keeps subprocess on its vfork path
    assert guard.prefix[1:] == ("--pdeathsig", "KILL", "--")


@pytest.mark.parametrize("guard", sorted(GUARDS))
def test_a_compiler_dies_with_the_process_that_started_it(tmp_path: Path, guard: str) -> None:
    """SIGKILL runs no cleanup: the kernel's parent-death signal must take the compiler."""
    script = f"""
import sys
from pathlib import Path
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_compile_overhead import GUARDS
from nkibuild.compiler.process import ProcessRegistry, run_process
registry = ProcessRegistry()
registry.death_guard = GUARDS[{guard!r}]()
command = ["sh", "-c", "echo $$ > pid; exec sleep 300"]
run_process(command, Path("."), Path("out.log"), None, registry)
"""
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path)
    try:
        compiler = int(wait_for(lambda: (tmp_path / "pid").read_text().strip()))
        assert alive(compiler)
    finally:
        parent.kill()
        parent.wait(10)
    wait_for(lambda: not alive(compiler))


def test_a_compiler_that_is_not_there_cannot_be_started(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "neuronx-cc"
    with pytest.raises(FileNotFoundError, match="No such file or directory"):
        run_process([str(missing), "compile"], tmp_path, tmp_path / "out.log", None)


def test_a_relative_program_is_found_from_the_directory_it_runs_in(tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    tool = tmp_path / "work" / "tool"
    tool.write_text("#!/bin/sh\necho ran in $PWD\n")
    tool.chmod(0o755)
    outcome = run_process(["./tool"], tmp_path / "work", tmp_path / "out.log", None)
    assert outcome.returncode == 0
    assert (tmp_path / "out.log").read_text() == f"ran in {tmp_path / 'work'}\n"
    with pytest.raises(FileNotFoundError, match=r"\./tool"):
        run_process(["./tool"], tmp_path, tmp_path / "out.log", None)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1]
    except OSError:
        return False
    return state != "Z"


def wait_for(condition: Callable[[], Any], seconds: float = 20.0) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            found = condition()
        except (OSError, ValueError):
            found = None
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError("timed out")
