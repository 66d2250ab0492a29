"""One build at a time per build dir: doit itself would let two runs interleave."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_nkibuild

from nkibuild.errors import UsageError
from nkibuild.session import acquire_build_lock


def test_second_build_in_the_same_dir_fails_clearly(example_project: Path) -> None:
    lock = acquire_build_lock(example_project / "build")
    try:
        result = run_nkibuild(["build", "--toolchain", "fake"], example_project)
        assert result.returncode == 2
        assert "another nkibuild build is running" in result.stderr
        assert "Traceback" not in result.stderr
        assert not (example_project / "build" / "compile").exists()
        cleaned = run_nkibuild(["clean"], example_project)
        assert cleaned.returncode == 2
        assert (example_project / "build").exists()
    finally:
        lock.release()


def test_lock_is_released_after_a_build(tmp_path: Path) -> None:
    lock = acquire_build_lock(tmp_path / "build")
    with pytest.raises(UsageError):
        acquire_build_lock(tmp_path / "build")
    lock.release()
    acquire_build_lock(tmp_path / "build").release()


def test_a_lock_file_planted_as_a_symlink_is_refused_and_its_target_untouched(
    tmp_path: Path,
) -> None:
    """The lock is opened without following a symlink (and never truncated): a link
    planted at build/state/build.lock cannot reach a file outside."""
    outside = tmp_path / "precious.txt"
    outside.write_text("keep me")
    state = tmp_path / "build" / "state"
    state.mkdir(parents=True)
    (state / "build.lock").symlink_to(outside)
    with pytest.raises(UsageError, match="cannot lock the build dir"):
        acquire_build_lock(tmp_path / "build")
    assert outside.read_text() == "keep me"


def test_two_locks_in_one_process_exclude_each_other_until_released(tmp_path: Path) -> None:
    first = acquire_build_lock(tmp_path / "build")
    with pytest.raises(UsageError, match="another nkibuild build is running"):
        acquire_build_lock(tmp_path / "build", timeout=0.05)
    first.release()
    first.release()  # a second release is harmless
    acquire_build_lock(tmp_path / "build", timeout=0.05).release()
