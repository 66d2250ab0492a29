"""The outputs check (graph/intact.py): a task's recorded outputs must be what it wrote."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from nkibuild.fsutil import stat_stamp
from nkibuild.graph.intact import (
    VALUES_KEY,
    OutputsIntact,
    columns,
    record_outputs,
    recorded_outputs,
)


def recorded(tmp_path: Path) -> tuple[OutputsIntact, dict, Path]:
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.neff").write_bytes(b"neff bytes")
    (out / "b.py").write_text("x = 1\n")
    check = OutputsIntact((), [str(out)])
    return check, record_outputs((), [str(out)]), out


def test_outputs_as_written_pass_and_a_touched_one_passes_by_its_hash(tmp_path: Path) -> None:
    check, values, out = recorded(tmp_path)
    files = recorded_outputs(values[VALUES_KEY])
    assert files is not None and sorted(files.paths) == [str(out / "a.neff"), str(out / "b.py")]
    assert files.stamps == [stat_stamp(path) for path in files.paths]
    assert check(None, values) is True
    os.utime(out / "a.neff", ns=(1, 1))  # new stat, same bytes
    assert check(None, values) is True
    (out / "extra.txt").write_text("not the task's")  # not what it wrote: ignored
    assert check(None, values) is True


def test_changed_or_removed_outputs_fail_the_check(tmp_path: Path) -> None:
    check, values, out = recorded(tmp_path)
    (out / "a.neff").write_bytes(b"NEFF bytes")  # same size, other content
    assert check(None, values) is False
    (tmp_path / "again").mkdir()
    check, values, out = recorded(tmp_path / "again")
    (out / "b.py").unlink()
    assert check(None, values) is False
    assert check(None, {}) is None  # never ran: doit's other checks decide


def test_the_record_is_saved_as_json_strings_and_read_back(tmp_path: Path) -> None:
    """doit saves values as JSON: the record is three NUL-joined strings after a root."""
    check, values, out = recorded(tmp_path)
    saved = json.loads(json.dumps(values))
    assert all(type(text) is str for text in saved[VALUES_KEY].values())
    assert recorded_outputs(saved[VALUES_KEY]) == recorded_outputs(values[VALUES_KEY])
    assert check(None, saved) is True
    rooted = columns(f"{out}/", ["a.neff"], [stat_stamp(out / "a.neff") or ""], ["0" * 64])
    assert recorded_outputs(rooted) == (
        [str(out / "a.neff")],
        [stat_stamp(out / "a.neff")],
        ["0" * 64],
    )


def test_a_record_an_older_nkibuild_saved_is_checked(tmp_path: Path) -> None:
    """path -> [size, mtime_ns, ctime_ns, inode, sha256]: read as the same record."""
    check, values, out = recorded(tmp_path)
    files = recorded_outputs(values[VALUES_KEY])
    assert files is not None
    older = {path: [*map(int, stamp.split()), sha] for path, stamp, sha in zip(*files, strict=True)}
    assert recorded_outputs(older) == files
    assert check(None, {VALUES_KEY: older}) is True
    (out / "b.py").write_text("x = 2\n")
    assert check(None, {VALUES_KEY: older}) is False


@pytest.mark.parametrize(
    "damaged",
    [
        "not a record",
        {"root": "", "names": "a", "stamps": "1 2 3 4", "sha256": 7},
        {"root": "", "names": "a\0b", "stamps": "1 2 3 4", "sha256": "x\0y"},
        {"/a": [1, 2, 3, "4", "sha"]},
        {"/a": [1, 2, 3, 4]},
    ],
    ids=["string", "sha-number", "short-column", "older-stat-string", "older-short"],
)
def test_a_damaged_record_fails_the_check(tmp_path: Path, damaged: object) -> None:
    """Not understood is not trusted: the task runs again (no traceback)."""
    check, _, _ = recorded(tmp_path)
    assert recorded_outputs(damaged) is None
    assert check(None, {VALUES_KEY: damaged}) is False


def test_an_output_that_cannot_be_read_fails_the_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its stamp changed and reading it fails (unreadable, an I/O error): not trusted, no
    traceback; the task runs again."""
    from nkibuild.graph import intact

    check, values, out = recorded(tmp_path)
    os.utime(out / "a.neff", ns=(1, 1))  # a new stamp, the same size: its hash decides

    def unreadable(path: object) -> str:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(intact, "file_sha256", unreadable)
    assert check(None, values) is False
