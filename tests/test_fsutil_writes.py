"""Atomic writes make the directory they write into only when it is missing."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from nkibuild.fsutil import atomic_output, atomic_write_text, new_file_mode, process_umask


def test_a_write_into_missing_directories_makes_them(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "c.json"
    atomic_write_text(target, "{}", durable=False)
    assert target.read_text() == "{}"
    assert stat.S_IMODE(target.stat().st_mode) == new_file_mode()
    assert stat.S_IMODE(target.parent.stat().st_mode) == 0o777 & ~process_umask()
    with atomic_output(tmp_path / "d" / "e.bin") as tmp:
        tmp.write_bytes(b"x")
    assert (tmp_path / "d" / "e.bin").read_bytes() == b"x"
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a", "b", "c.json", "d", "e.bin"]


def test_a_write_into_an_existing_directory_leaves_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "f.txt"
    atomic_write_text(target, "one")
    atomic_write_text(target, "two", durable=False)
    assert target.read_text() == "two"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_a_file_where_the_directory_should_be_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "blocked").write_text("a file")
    with pytest.raises(NotADirectoryError):
        atomic_write_text(tmp_path / "blocked" / "x.json", "{}")
    assert (tmp_path / "blocked").read_text() == "a file"
