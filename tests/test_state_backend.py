"""nkibuild's doit state backend (graph/state.py): one line per task, decoded on use."""

from __future__ import annotations

import json
import os
from array import array
from pathlib import Path

import pytest
from doit.dependency import JSONCodec

from nkibuild import plaindata
from nkibuild.fsutil import stamp_of
from nkibuild.graph.state import HEADER, AtomicJsonDB


def saved(path: Path, entries: dict[str, dict]) -> AtomicJsonDB:
    db = AtomicJsonDB(str(path), JSONCodec())
    for task_id, entry in entries.items():
        for key, value in entry.items():
            db.set(task_id, key, value)
    db.dump()
    return AtomicJsonDB(str(path), JSONCodec())


def test_entries_round_trip_one_line_per_task(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    db = saved(path, {"extract:a/b": {"deps:": ["x\ty"], "result:": "1"}, "wheel": {"k": [1]}})
    lines = path.read_text().splitlines()
    assert lines[0] == HEADER
    assert [line.split("\t")[0] for line in lines[1:]] == ['"extract:a/b"', '"wheel"']
    assert db.get("extract:a/b", "deps:") == ["x\ty"]
    assert db.get("wheel", "k") == [1]
    assert db.in_("wheel") and not db.in_("bundle")
    assert db.get("bundle", "k") is None


def test_unchanged_entries_are_saved_as_read(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    db = saved(path, {"a": {"k": {"z": 1, "a": 2}}, "b": {"k": 2}})
    before = path.read_text()
    db.get("a", "k")  # decoded, not changed
    db.set("b", "k", 3)
    db.dump()
    after = path.read_text().splitlines()
    assert after[1] == before.splitlines()[1]
    assert AtomicJsonDB(str(path), JSONCodec()).get("b", "k") == 3


def test_nothing_changed_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    db = saved(path, {"a": {"k": 1}})
    stamp = path.stat().st_mtime_ns, path.stat().st_ino
    db.get("a", "k")
    db.dump()
    assert (path.stat().st_mtime_ns, path.stat().st_ino) == stamp


def test_a_damaged_entry_forgets_that_task_only(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    saved(path, {"a": {"k": 1}, "b": {"k": 2}})
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], lines[1][:-3], lines[2]]) + "\n")
    db = AtomicJsonDB(str(path), JSONCodec())
    assert db.get("a", "k") is None
    assert not db.in_("a")
    assert db.get("b", "k") == 2
    db.dump()  # the damaged line is dropped from the file
    assert len(path.read_text().splitlines()) == 2


def test_an_unreadable_file_means_nothing_is_known(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text(HEADER + "\nno tab on this line\n")
    db = AtomicJsonDB(str(path), JSONCodec())
    assert not db.in_("no tab on this line")
    db.dump()  # replaced at the end of the run
    assert path.read_text() == HEADER + "\n"


def test_the_earlier_layout_is_still_read(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text(json.dumps({"wheel": {"k": [1, 2]}}))
    db = AtomicJsonDB(str(path), JSONCodec())
    assert db.get("wheel", "k") == [1, 2]
    db.remove("wheel")
    db.dump()
    assert path.read_text() == HEADER + "\n"


def test_a_run_that_changed_a_few_tasks_appends_their_lines(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    db = saved(path, {f"t{index}": {"k": index} for index in range(20)})
    before = path.read_text()
    db.set("t3", "k", "new")
    db.remove("t5")
    db.dump()
    after = path.read_text()
    assert after.startswith(before)  # the earlier lines are not written again
    assert after[len(before) :] == '"t3"\t{"k": "new"}\n"t5"\tnull\n'
    reread = AtomicJsonDB(str(path), JSONCodec())
    assert reread.get("t3", "k") == "new"
    assert not reread.in_("t5")
    assert reread.get("t4", "k") == 4


def test_a_line_cut_short_leaves_the_tasks_earlier_entry(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    saved(path, {"a": {"k": 1}, "b": {"k": 2}})
    with path.open("a") as handle:  # a build killed while appending
        handle.write('"a"\t{"k": 3')
    db = AtomicJsonDB(str(path), JSONCodec())
    assert db.get("a", "k") == 1
    assert db.get("b", "k") == 2
    db.set("b", "k", 4)
    db.dump()  # written whole: nothing is appended to a cut line
    text = path.read_text()
    assert text.startswith(HEADER + "\n") and text.endswith("\n")
    assert '{"k": 3' not in text
    reread = AtomicJsonDB(str(path), JSONCodec())
    assert (reread.get("a", "k"), reread.get("b", "k")) == (1, 4)


def test_superseded_lines_are_compacted_away(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    db = saved(path, {"small": {"k": 1}, "big": {"k": "x" * 1000}})
    sizes = []
    for run in range(12):
        db.set("big", "k", str(run) * 1000)
        db.dump()
        sizes.append(path.stat().st_size)
        db = AtomicJsonDB(str(path), JSONCodec())
    assert db.get("big", "k") == "11" * 1000  # the last line written wins
    assert db.get("small", "k") == 1
    assert max(sizes) < 2 * 2 * 1100 + 200  # never much past twice the live entries
    assert min(sizes) < 2 * 1100  # and written whole again at times


def test_a_result_equal_to_the_values_is_saved_once(tmp_path: Path) -> None:
    outputs = {"outputs": {"/p/a.neff": [1, 2, 3, 4, "ab"]}}
    path = tmp_path / "state.json"
    saved(path, {"t": {"_values_:": outputs, "result:": dict(outputs)}, "u": {"result:": "x"}})
    assert path.read_text().count("a.neff") == 1
    reread = AtomicJsonDB(str(path), JSONCodec())
    assert reread.get("t", "result:") == outputs == reread.get("t", "_values_:")
    assert reread.get("u", "result:") == "x"


def test_damaged_files_forget_what_they_damage_without_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    good = '"a"\t{"k": 1}\n'
    cases = {
        "not-utf8": (HEADER + "\n").encode() + b'"b"\t{"k": "\xc3\n',
        "two-ids-in-a-key": (HEADER + "\n" + good + '"b","c"\t{"k": 2}\n').encode(),
        "deep-entry": (HEADER + "\n" + good + '"b"\t' + "[" * 100_000 + "\n").encode(),
        "deep-key": (HEADER + "\n" + good + "[" * 100_000 + '\t{"k": 2}\n').encode(),
        "earlier-layout-non-dict": json.dumps({"a": {"k": 1}, "b": [1]}).encode(),
    }
    for name, damaged in cases.items():
        path.write_bytes(damaged)
        db = AtomicJsonDB(str(path), JSONCodec())
        assert db.get("b", "k") is None, name
        assert db.get("a", "k") == (None if name == "not-utf8" else 1), name
        db.set("c", "k", 3)
        db.dump()  # written whole, readable again
        assert path.read_text().startswith(HEADER + "\n"), name
        assert AtomicJsonDB(str(path), JSONCodec()).get("c", "k") == 3, name


def test_a_file_replaced_since_it_was_read_is_written_whole(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    db = saved(path, {"a": {"k": 1}, "b": {"k": 2}})
    path.unlink()  # e.g. `nkibuild clean` while the build ran
    db.set("b", "k", 3)
    db.dump()
    assert path.read_text().startswith(HEADER + "\n")
    reread = AtomicJsonDB(str(path), JSONCodec())
    assert (reread.get("a", "k"), reread.get("b", "k")) == (1, 3)


def big_entry(files: int) -> dict:
    outputs = {f"/b/tree/f{index}.neff": [index, 7, 7, index, "ab" * 32] for index in range(files)}
    values = {"outputs": outputs, "_config_changed": "digest"}
    deps = [f"/b/compile/u{index}/result.json" for index in range(files)]
    return {
        "_values_:": values,
        "result:": {"outputs": outputs},  # the action's return: the values but doit's own
        "deps:": deps,
        **{dep: [1.5, 100, "md5"] for dep in deps},
    }


def test_a_big_entry_changed_a_little_is_saved_as_a_patch(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    db = saved(path, {"bundle": big_entry(200), "other": {"k": 1}})
    before = path.read_text()
    assert before.count("f17.neff") == 1  # the result is saved by reference to the values
    outputs = {**db.get("bundle", "_values_:")["outputs"]}
    outputs["/b/tree/f3.neff"] = [3, 8, 8, 3, "cd" * 32]
    del outputs["/b/tree/f4.neff"]
    outputs["/b/tree/new.neff"] = [1, 2, 3, 4, "ef" * 32]
    # As doit saves a task it ran: every key again, the file_dep in another order.
    db.set("bundle", "_values_:", {"outputs": outputs, "_config_changed": "digest"})
    db.set("bundle", "result:", {"outputs": outputs})
    db.set("bundle", "/b/compile/u5/result.json", (2.5, 101, "md5b"))
    db.set("bundle", "deps:", tuple(reversed(big_entry(200)["deps:"])))
    db.dump()
    after = path.read_text()
    assert after.startswith(before)
    task_id, line = after[len(before) :].rstrip("\n").split("\t")
    assert task_id == '"bundle"' and line.startswith("[") and len(line) < 800
    reread = AtomicJsonDB(str(path), JSONCodec())
    entry = {key: reread.get("bundle", key) for key in ("_values_:", "result:", "deps:")}
    assert entry["_values_:"]["outputs"] == outputs
    assert entry["result:"] == {"outputs": outputs}
    assert entry["deps:"] == big_entry(200)["deps:"]  # the same set: not written again
    assert reread.get("bundle", "/b/compile/u5/result.json") == [2.5, 101, "md5b"]
    assert reread.get("other", "k") == 1


def test_patches_pile_up_until_the_entry_is_written_whole(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    saved(path, {"bundle": big_entry(200)})
    kinds = []
    for run in range(60):
        db = AtomicJsonDB(str(path), JSONCodec())
        db.set("bundle", "/b/compile/u1/result.json", [float(run), 100, "md5"])
        db.dump()
        kinds.append(path.read_text().splitlines()[-1].split("\t")[1][0])
    assert kinds.count("{") >= 1 and kinds.count("[") >= 50  # patches, then whole again
    reread = AtomicJsonDB(str(path), JSONCodec())
    assert reread.get("bundle", "/b/compile/u1/result.json") == [59.0, 100, "md5"]
    assert reread.get("bundle", "result:") == {"outputs": big_entry(200)["_values_:"]["outputs"]}


def test_a_whole_rewrite_applies_the_patches(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    db = saved(path, {"bundle": big_entry(200)})
    db.set("bundle", "/b/compile/u1/result.json", [9.0, 100, "md5"])
    db.dump()
    assert path.read_text().splitlines()[-1].startswith('"bundle"\t[')
    with path.open("a") as handle:  # a build killed while appending: written whole next
        handle.write('"other"\t{"k"')
    db = AtomicJsonDB(str(path), JSONCodec())
    db.set("bundle", "/b/compile/u2/result.json", [8.0, 100, "md5"])
    db.dump()
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and lines[1].startswith('"bundle"\t{')  # merged, one line
    reread = AtomicJsonDB(str(path), JSONCodec())
    assert reread.get("bundle", "/b/compile/u1/result.json") == [9.0, 100, "md5"]
    assert reread.get("bundle", "/b/compile/u2/result.json") == [8.0, 100, "md5"]
    assert reread.get("bundle", "/b/compile/u3/result.json") == [1.5, 100, "md5"]


def test_damaged_patches_forget_their_task_only(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    saved(path, {"bundle": {"k": {"a": 1, "s": "a\0b\0c"}}, "t": {"k": 2}})
    base = path.read_text()
    fields = {  # changes of the fields of a string (`"s"`)
        "past-the-last-field": '[[["k", "s"], 3, "x"]]',
        "before-the-first": '[[["k", "s"], -1, "x"]]',
        "index-not-a-number": '[[["k", "s"], "0", "x"]]',
        "index-a-bool": '[[["k", "s"], true, "x"]]',
        "text-not-a-string": '[[["k", "s"], 0, 5]]',
        "of-a-number": '[[["k", "a"], 0, "x"]]',
        "a-field-without-text": '[[["k", "s"], 0, "x", 1]]',
    }
    cases = {
        "not-a-list-of-operations": '"bundle"\t[1]\n',
        "keys-not-strings": '"bundle"\t[[[1], 2]]\n',
        "into-a-value": '"bundle"\t[[["k", "a", "b"], 2]]\n',
        "of-a-removed-task": '"bundle"\tnull\n"bundle"\t[[["k"], 2]]\n',
        "result-of-missing-values": '"bundle"\t[[["result:is:_values_:"], ["outputs"]]]\n',
        **{name: f'"bundle"\t{patch}\n' for name, patch in fields.items()},
    }
    for name, damage in cases.items():
        path.write_text(base + damage)
        db = AtomicJsonDB(str(path), JSONCodec())
        assert db.get("bundle", "k") is None, name
        assert db.get("t", "k") == 2, name
        db.set("t", "k", 3)
        db.dump()  # written whole, without the damage
        reread = AtomicJsonDB(str(path), JSONCodec())
        assert (reread.get("bundle", "k"), reread.get("t", "k")) == (None, 3), name
    path.write_text(base + '"bundle"\t[[["k", "a"], 3]]\n')  # a good one, to compare
    assert AtomicJsonDB(str(path), JSONCodec()).get("bundle", "k") == {"a": 3, "s": "a\0b\0c"}
    path.write_text(base + '"bundle"\t[[["k", "a"], 3]')  # cut short: the entry before
    assert AtomicJsonDB(str(path), JSONCodec()).get("bundle", "k") == {"a": 1, "s": "a\0b\0c"}


@pytest.mark.parametrize("version", [2, 3])
def test_earlier_versions_are_read_and_written_anew(tmp_path: Path, version: int) -> None:
    path = tmp_path / "state.json"
    header = f'{{"format": "nkibuild-doit-state", "version": {version}}}'
    entry = {"_values_:": {"o": 1}, "result:is:_values_:": True}
    path.write_text(f'{header}\n"a"\t{json.dumps(entry)}\n')
    db = AtomicJsonDB(str(path), JSONCodec())
    assert db.get("a", "result:") == {"o": 1}
    db.dump()
    assert path.read_text().startswith(HEADER + "\n")
    assert AtomicJsonDB(str(path), JSONCodec()).get("a", "result:") == {"o": 1}


def test_values_python_takes_for_equal_are_saved_as_set(tmp_path: Path) -> None:
    """1, 1.0 and True are equal in Python, not in JSON (nor 0.0 and -0.0): each is saved
    as doit set it, whole or in a patch."""
    path = tmp_path / "state.json"
    for before, after in [(1, True), (True, 1), (1, 1.0), (0.0, -0.0), ([1, "a"], [True, "a"])]:
        db = saved(path, {"t": {"flag": before}})
        db.set("t", "flag", after)
        assert repr(db.get("t", "flag")) == repr(after)
        db.dump()
        assert repr(AtomicJsonDB(str(path), JSONCodec()).get("t", "flag")) == repr(after)
    big = big_entry(100)
    big["_values_:"]["ok"] = 0
    path = tmp_path / "big.json"
    db = saved(path, {"bundle": big})
    values = {**big["_values_:"], "ok": False}
    values["outputs"] = {**values["outputs"], "/b/tree/f1.neff": [True, 7, 7, 1, "ab" * 32]}
    db.set("bundle", "_values_:", values)
    db.set("bundle", "result:", {"outputs": values["outputs"]})
    db.dump()
    assert path.read_text().splitlines()[-1].startswith('"bundle"\t[')  # a patch
    reread = AtomicJsonDB(str(path), JSONCodec()).get("bundle", "_values_:")
    assert reread["ok"] is False
    assert reread["outputs"]["/b/tree/f1.neff"][0] is True


def test_a_damaged_file_dep_list_is_replaced_not_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text(HEADER + '\n"v"\t{"deps:": [["x"], {"y": 1}], "checker:": "MD5Checker"}\n')
    db = AtomicJsonDB(str(path), JSONCodec())
    db.set("v", "deps:", ("/a",))
    db.dump()
    assert AtomicJsonDB(str(path), JSONCodec()).get("v", "deps:") == ["/a"]


def every_entry(path: Path, task_ids: list[str]) -> dict[str, dict | None]:
    db = AtomicJsonDB(str(path), JSONCodec())
    return {task_id: db._entry(task_id) for task_id in task_ids}


def test_the_index_describes_the_file_after_appends_patches_and_rewrites(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    index = Path(f"{path}.index")
    db = saved(path, {"bundle": big_entry(100), **{f"t{n}": {"k": n} for n in range(30)}})
    assert index.exists()
    ids = ["bundle", *(f"t{n}" for n in range(30))]
    for run in range(8):
        db = AtomicJsonDB(str(path), JSONCodec())
        db.set("bundle", "/b/compile/u1/result.json", [float(run), 100, "md5"])
        db.set(f"t{run}", "k", "x" * 300 * run)  # appended, then compacted away at times
        db.remove(f"t{run + 10}")
        db.dump()
        through_index = every_entry(path, ids)
        index.unlink()
        whole = every_entry(path, ids)  # read whole: the file alone says what is saved
        assert through_index == whole, run
        assert whole["bundle"]["/b/compile/u1/result.json"] == [float(run), 100, "md5"]
        assert whole[f"t{run + 10}"] is None and whole[f"t{run}"] == {"k": "x" * 300 * run}
        AtomicJsonDB(str(path), JSONCodec()).dump()  # nothing changed: indexed again
        assert index.exists(), run


def test_the_index_places_a_task_removed_then_saved_again(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    index = Path(f"{path}.index")
    saved(path, {"bundle": big_entry(50), **{f"t{n}": {"k": n} for n in range(5)}})
    ids = ["bundle", *(f"t{n}" for n in range(5))]
    changes = [("t1", None, 8), ("t2", "t1", 10), (None, "t2", 11)]  # and the lines after
    for run, (removed, added, lines) in enumerate(changes):
        db = AtomicJsonDB(str(path), JSONCodec())
        if removed is not None:
            db.remove(removed)
        if added is not None:
            db.set(added, "k", f"again {run}")
        db.dump()  # appended: the index updated, not written from the file
        assert path.read_text().count("\n") == lines, run
        through_index = every_entry(path, ids)
        index.unlink()
        assert through_index == every_entry(path, ids), run
        AtomicJsonDB(str(path), JSONCodec()).dump()  # indexed again from the whole file
    assert through_index["t1"] == {"k": "again 1"} and through_index["t2"] == {"k": "again 2"}


def test_a_run_reads_through_the_index_only_the_lines_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "state.json"
    saved(path, {"bundle": big_entry(2000), "wheel": {"k": 1}})
    read: list[int] = []
    real_pread = os.pread

    def pread(fd: int, size: int, offset: int) -> bytes:
        read.append(size)
        return real_pread(fd, size, offset)

    monkeypatch.setattr(os, "pread", pread)
    db = AtomicJsonDB(str(path), JSONCodec())
    assert db.get("wheel", "k") == 1
    assert read and sum(read) < 100  # the wheel's line, not the bundle's megabyte
    db.set("wheel", "k", 2)
    db.dump()  # appended
    monkeypatch.undo()
    assert AtomicJsonDB(str(path), JSONCodec()).get("wheel", "k") == 2
    assert AtomicJsonDB(str(path), JSONCodec()).get("bundle", "deps:") == big_entry(2000)["deps:"]


def test_an_index_of_the_file_before_a_change_is_not_used(tmp_path: Path) -> None:
    """A build killed between writing the file and its index, or another writer: the
    index names a file of other stats, and the file is read whole."""
    path = tmp_path / "state.json"
    index = Path(f"{path}.index")
    db = saved(path, {"a": {"k": 1}, "b": {"k": 2}})
    earlier_index = index.read_bytes()
    db.set("a", "k", 10)
    db.dump()
    index.write_bytes(earlier_index)  # as if killed before the index was written
    with path.open("a") as handle:  # and another writer's line
        handle.write('"b"\t{"k": 20}\n')
    reread = AtomicJsonDB(str(path), JSONCodec())
    assert (reread.get("a", "k"), reread.get("b", "k")) == (10, 20)


def test_a_line_not_where_the_index_says_is_damage_not_a_wrong_entry(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    index = Path(f"{path}.index")
    saved(path, {"a": {"k": 1}, "b": {"k": 2}})
    text = path.read_text()
    # Rewritten in place, same size, and the index made to match its stats: only where
    # the lines are is wrong (a file changed within one tick of the clock, say).
    path.write_text(text.replace('"a"\t{"k": 1}\n"b"\t{"k": 2}', '"b"\t{"k": 2}\n"a"\t{"k": 1}'))
    stale = plaindata.loads(index.read_bytes())
    stale["state"] = stamp_of(path.stat())
    index.write_bytes(plaindata.dumps(stale))
    db = AtomicJsonDB(str(path), JSONCodec())
    assert (db.get("a", "k"), db.get("b", "k")) == (None, None)  # not each other's
    db.set("c", "k", 3)
    db.dump()  # written whole, without what could not be read
    reread = AtomicJsonDB(str(path), JSONCodec())
    assert (reread.get("a", "k"), reread.get("b", "k"), reread.get("c", "k")) == (None, None, 3)


def test_a_damaged_index_is_not_used(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    index = Path(f"{path}.index")
    saved(path, {"a": {"k": 1}})
    good = plaindata.loads(index.read_bytes())
    damaged = [
        b"not a pickle",
        plaindata.dumps({**good, "format": 99}),
        plaindata.dumps({**good, "bounds": good["bounds"] + b"\x01"}),
        plaindata.dumps({**good, "ids": [1]}),
        plaindata.dumps({**good, "bounds": 5}),
        plaindata.dumps({**good, **{key: good[key] * 2 for key in ("ids", "bounds")}}),
        plaindata.dumps({**good, "patched": [["a", [1, 2, 3]]]}),
        plaindata.dumps({**good, "patched": [["b", [1, 2, 3, 4]]]}),  # "b" not among the ids
        plaindata.dumps({**good, "patched": [["a", []]]}),
        plaindata.dumps({**good, "patched": [["b", ["1", 2]]]}),
        # places outside the file: read through, they would ask for terabytes
        plaindata.dumps({**good, "bounds": array("q", [5, 2**40]).tobytes()}),
        plaindata.dumps({**good, "bounds": array("q", [-9, 20]).tobytes()}),
        plaindata.dumps({**good, "bounds": array("q", [30, 20]).tobytes()}),
        plaindata.dumps({**good, "patched": [[["a"], [1, 2, 3, 4]]]}),  # an unhashable id
        plaindata.dumps({**good, "patched": [["a", [1, 2, 3, 2**63 - 1]]]}),
    ]
    for content in damaged:
        index.write_bytes(content)
        assert AtomicJsonDB(str(path), JSONCodec()).get("a", "k") == 1, content


def test_members_equal_as_saved_are_left_out_of_a_patch_however_built(tmp_path: Path) -> None:
    """The outputs are compared in one go; where that finds types apart (a tuple for a
    list, True for 1), each member is compared as JSON saves it."""
    path = tmp_path / "state.json"
    db = saved(path, {"bundle": big_entry(300)})
    outputs = db.get("bundle", "_values_:")["outputs"]
    rebuilt = {file: tuple(fingerprint) for file, fingerprint in outputs.items()}  # as saved
    rebuilt["/b/tree/f7.neff"] = [7, 8, 8, 7, "cd" * 32]  # changed
    rebuilt["/b/tree/f9.neff"] = [9, True, 7, 9, "ab" * 32]  # 7 before: saved apart
    db.set("bundle", "_values_:", {"outputs": rebuilt, "_config_changed": "digest"})
    db.set("bundle", "result:", {"outputs": rebuilt})
    db.dump()
    patch = json.loads(path.read_text().splitlines()[-1].split("\t")[1])
    patched = [keys[-1] for keys, *_ in patch if keys[:2] == ["_values_:", "outputs"]]
    assert sorted(patched) == ["/b/tree/f7.neff", "/b/tree/f9.neff"]
    reread = AtomicJsonDB(str(path), JSONCodec()).get("bundle", "_values_:")["outputs"]
    assert reread["/b/tree/f9.neff"][1] is True and reread["/b/tree/f8.neff"] == [
        8,
        7,
        7,
        8,
        "ab" * 32,
    ]


def outputs_values(stamps: list[str]) -> dict:
    """The values of a task whose outputs record is in columns (graph/intact.py)."""
    names = [f"neffs/k{index:05d}.neff" for index in range(len(stamps))]
    columns = {"names": names, "stamps": stamps, "sha256": ["ab" * 32] * len(stamps)}
    return {"outputs": {"root": "/b/", **{key: "\0".join(value) for key, value in columns.items()}}}


STAMPS = [f"{index} 1795{index:015d} 1795{index:015d} {1000 + index}" for index in range(2000)]


def test_a_long_column_changed_in_a_few_fields_is_saved_as_those_fields(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    db = saved(path, {"bundle": {"_values_:": outputs_values(STAMPS)}, "t": {"k": 1}})
    runs = [STAMPS]
    for edit in range(3):
        stamps = list(runs[-1])
        stamps[edit] = f"changed {edit}"  # first fields, shorter
        stamps[1234 - edit] = f"{stamps[1234 - edit]} and longer"
        stamps[-1] = "last" * edit
        runs.append(stamps)
        before = path.read_text()
        db.set("bundle", "_values_:", outputs_values(stamps))
        db.dump()
        after = path.read_text()
        assert after.startswith(before)
        task_id, line = after[len(before) :].rstrip("\n").split("\t")
        assert task_id == '"bundle"' and len(line) < 400  # the column is ~100 KB
        operations = {tuple(operation[0]): operation for operation in json.loads(line)}
        operation = operations[("_values_:", "outputs", "stamps")]
        assert operation[1::2] == [edit, 1234 - edit, len(STAMPS) - 1]  # fields replaced
        assert operation[2::2] == [f"changed {edit}", stamps[1234 - edit], stamps[-1]]
        db = AtomicJsonDB(str(path), JSONCodec())
        assert db.get("bundle", "_values_:") == outputs_values(stamps), edit
        assert db.get("t", "k") == 1
    db.set("t", "k", 2)
    db._rewrite = True  # written whole: the splices applied, once
    db.dump()
    lines = path.read_text().splitlines()
    assert len(lines) == 3 and lines[1].startswith('"bundle"\t{')
    assert AtomicJsonDB(str(path), JSONCodec()).get("bundle", "_values_:") == outputs_values(
        runs[-1]
    )


def test_a_column_of_other_fields_or_changed_much_is_set_whole(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    unchanged = "y" * 2_000_000  # the patch is small beside it: a patch line, not the entry
    for stamps in (STAMPS[:-1], [f"new {stamp}" for stamp in STAMPS]):
        db = saved(path, {"bundle": {"_values_:": outputs_values(STAMPS), "other:": unchanged}})
        db.set("bundle", "_values_:", outputs_values(stamps))
        db.dump()
        line = path.read_text().splitlines()[-1].split("\t")[1]
        operations = {tuple(operation[0]): operation for operation in json.loads(line)}
        assert operations[("_values_:", "outputs", "stamps")][1:] == ["\0".join(stamps)]
        reread = AtomicJsonDB(str(path), JSONCodec())
        assert reread.get("bundle", "_values_:") == outputs_values(stamps)


def test_field_changes_apply_in_order_until_the_string_is_set_whole(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    saved(path, {"bundle": {"k": {"s": "a\0b\0c", "n": 1}}, "t": {"k": 2}})
    base = path.read_text()
    good = [
        '[[["k", "s"], 2, "C", 0, ""]]',
        '[[["k", "s"], 1, "B"]]',  # on the string as the patch before left it
        '[[["k", "n"], 7]]',
    ]
    path.write_text(base + "".join(f'"bundle"\t{patch}\n' for patch in good))
    assert AtomicJsonDB(str(path), JSONCodec()).get("bundle", "k") == {"s": "\0B\0C", "n": 7}
    # Set whole after fields were replaced: the value set is the string.
    path.write_text(f'{base}"bundle"\t{good[0]}\n"bundle"\t[[["k", "s"], "whole"]]\n')
    assert AtomicJsonDB(str(path), JSONCodec()).get("bundle", "k") == {"s": "whole", "n": 1}
    path.write_text(f'{base}"bundle"\t[[["k", "s"], "x\\u0000y"]]\n"bundle"\t{good[1]}\n')
    assert AtomicJsonDB(str(path), JSONCodec()).get("bundle", "k") == {"s": "x\0B", "n": 1}
    # The object holding the string set whole: its fields are the new object's.
    whole = '[[["k"], {"s": "p\\u0000q"}]]'
    path.write_text(f'{base}"bundle"\t{good[0]}\n"bundle"\t{whole}\n"bundle"\t{good[1]}\n')
    assert AtomicJsonDB(str(path), JSONCodec()).get("bundle", "k") == {"s": "p\0B"}
