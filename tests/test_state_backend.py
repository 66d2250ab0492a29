"""nkibuild's doit state backend (graph/state.py): doit's JSON layout, saved atomically."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
from doit.dependency import JSONCodec
from helpers import build, softmax_manifest, softmax_project

from nkibuild import fsutil
from nkibuild.graph.state import DEP_FILE, AtomicJsonDB


def opened(path: Path) -> AtomicJsonDB:
    return AtomicJsonDB(str(path), JSONCodec())


def saved(path: Path, entries: dict[str, dict]) -> AtomicJsonDB:
    db = opened(path)
    for task_id, entry in entries.items():
        for key, value in entry.items():
            db.set(task_id, key, value)
    db.dump()
    return opened(path)


def test_entries_round_trip_in_doits_json_layout(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    db = saved(path, {"extract:a/b": {"deps:": ("x", "y"), "result:": "1"}, "wheel": {"k": [1]}})
    assert json.loads(path.read_text()) == {
        "extract:a/b": {"deps:": ["x", "y"], "result:": "1"},
        "wheel": {"k": [1]},
    }
    assert db.get("extract:a/b", "deps:") == ["x", "y"]
    assert db.in_("wheel") and not db.in_("bundle")
    assert db.get("bundle", "k") is None
    db.remove("wheel")
    db.dump()
    assert not opened(path).in_("wheel")
    db.remove_all()
    db.dump()
    assert json.loads(path.read_text()) == {}


def test_nothing_changed_writes_nothing(tmp_path: Path) -> None:
    """A no-op build sets every task's state again (doit's file_dep tuples among it)."""
    path = tmp_path / "state.json"
    db = saved(path, {"a": {"deps:": ("x",), "k": {"z": 1}}})
    stamp = path.stat().st_mtime_ns, path.stat().st_ino
    db.set("a", "deps:", ("x",))
    db.set("a", "k", {"z": 1})
    db.dump()
    assert (path.stat().st_mtime_ns, path.stat().st_ino) == stamp


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b'{"a": {"k": 1',
        b"\xff\xfe not utf-8",
        b"[" * 100_000,
        b'{"format": "nkibuild-doit-state", "version": 4}\n"a"\t{"k": 1}\n',
        b"[1, 2]",
    ],
    ids=["empty", "cut-short", "not-utf8", "deep", "older-nkibuild", "not-an-object"],
)
def test_a_file_that_does_not_decode_means_nothing_is_known(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(content)
    db = opened(path)
    assert not db.in_("a")
    db.set("c", "k", 3)
    db.dump()
    assert opened(path).get("c", "k") == 3


def test_entries_that_are_not_objects_are_dropped(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text(json.dumps({"a": {"k": 1}, "b": [1], "c": "x"}))
    db = opened(path)
    assert db.get("a", "k") == 1
    assert not db.in_("b") and not db.in_("c")


def test_a_failed_save_keeps_the_old_state_and_leaves_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "state.json"
    db = saved(path, {"a": {"k": 1}})
    before = path.read_bytes()
    real = fsutil.os.replace

    def disk_full(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fsutil.os, "replace", disk_full)
    db.set("a", "k", 2)
    with pytest.raises(OSError):  # no build session: raised as doit would
        db.dump()
    monkeypatch.setattr(fsutil.os, "replace", real)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_a_build_whose_state_cannot_be_saved_says_so_without_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = softmax_project(tmp_path / "p", softmax_manifest())

    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("nkibuild.graph.state.atomic_write_text", refuse)
    summary = build(project)
    assert not summary.ok
    assert any("doit's state was not saved" in error for error in summary.runtime_errors)
    assert not (project / "build" / "state" / DEP_FILE).exists()
