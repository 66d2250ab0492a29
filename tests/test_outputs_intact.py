"""The outputs check (graph/intact.py): a task's recorded outputs must be what it wrote."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from nkibuild.fsutil import stat_stamp
from nkibuild.graph.intact import VALUES_KEY, OutputsIntact, record_outputs


def recorded(tmp_path: Path) -> tuple[OutputsIntact, dict, Path]:
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.neff").write_bytes(b"neff bytes")
    (out / "b.py").write_text("x = 1\n")
    check = OutputsIntact((), [str(out)])
    return check, record_outputs((), [str(out)]), out


def test_outputs_as_written_pass_and_a_touched_one_passes_by_its_hash(tmp_path: Path) -> None:
    check, values, out = recorded(tmp_path)
    files = values[VALUES_KEY]
    assert sorted(files) == [str(out / "a.neff"), str(out / "b.py")]
    assert [stamp for stamp, _ in files.values()] == [stat_stamp(path) for path in files]
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


def test_the_record_is_read_back_as_doit_saves_it(tmp_path: Path) -> None:
    """doit saves a task's values as JSON: the record survives the round trip."""
    check, values, _ = recorded(tmp_path)
    saved = json.loads(json.dumps(values))
    assert saved == values
    assert check(None, saved) is True


@pytest.mark.parametrize(
    "damaged",
    [
        "not a record",
        {"/a": ["1 2 3 4", 7]},
        {"/a": ["1 2 3 4"]},
        {"/a": "1 2 3 4 sha"},
        ["/a", "1 2 3 4", "sha"],
    ],
    ids=["string", "sha-number", "short-row", "row-string", "list"],
)
def test_a_damaged_record_fails_the_check(tmp_path: Path, damaged: object) -> None:
    """Not understood is not trusted: the task runs again (no traceback)."""
    check, _, _ = recorded(tmp_path)
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
