"""The outputs check (graph/intact.py): a task's recorded outputs must be what it wrote."""

from __future__ import annotations

import os
from pathlib import Path

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
    assert sorted(values[VALUES_KEY]) == [str(out / "a.neff"), str(out / "b.py")]
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
