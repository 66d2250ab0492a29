"""The incremental bundle stage: the tree is updated in place, writing only what changed,
never trusting a NEFF whose bytes are not its compile record's, and a killed update is
finished by the next one; the wheel takes unchanged members from the wheel it replaces
and stays byte for byte the wheel a fresh write gives."""

from __future__ import annotations

import hashlib
import json
import pickle
import random
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    RemovesWhenLoaded,
    build,
    counted_member_copies,
    softmax_manifest,
    softmax_project,
)

from nkibuild import plaindata
from nkibuild.bundle import load_bundle
from nkibuild.bundle import wheel as wheel_module
from nkibuild.bundle.tree import (
    FORMAT,
    LEGACY_RECORD_FILE,
    RECORD_FILE,
    CompiledCopy,
    read_record,
    update_tree,
)
from nkibuild.bundle.wheel import WRITER_FILE, build_wheel
from nkibuild.errors import BuildError
from nkibuild.fsutil import LEFTOVER_PATTERNS, leftovers
from nkibuild.toolchain_double.hlo_writer import build_hlo_module

STAMP = "bundle.json"


def neff(directory: Path, name: str, data: bytes) -> CompiledCopy:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return CompiledCopy(path, hashlib.sha256(data).hexdigest(), f"unit {name}")


def identities(root: Path) -> dict[str, tuple[int, int]]:
    """Inode and ctime of every file: what changes when a file is written again."""
    return {
        p.relative_to(root).as_posix(): (p.stat().st_ino, p.stat().st_ctime_ns)
        for p in root.rglob("*")
        if p.is_file()
    }


def contents(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def wanted(tmp_path: Path) -> dict[str, bytes | CompiledCopy]:
    compiled = tmp_path / "compile"
    return {
        "pkg/__init__.py": b"'''package'''\n",
        "pkg/_kernels/a.py": b"A = 1\n",
        "pkg/_kernels/b.py": b"B = 1\n",
        "pkg/neff/trn2/a/default.neff": neff(compiled, "a.neff", b"NEFF a" * 100),
        "pkg/neff/trn2/b/default.neff": neff(compiled, "b.neff", b"NEFF b" * 100),
    }


def built(tmp_path: Path, wanted: dict[str, bytes | CompiledCopy], stamp: bytes) -> Path:
    """A bundle tree updated once to hold `wanted`, with `stamp` as its stamp file."""
    root = tmp_path / "bundle"
    update_tree(root, wanted, STAMP, stamp)
    return root


def test_an_update_writes_only_the_files_that_changed(
    tmp_path: Path, wanted: dict[str, bytes | CompiledCopy]
) -> None:
    root = built(tmp_path, wanted, b"stamp 1")
    assert sorted(contents(root)) == sorted([*wanted, STAMP, RECORD_FILE])
    assert contents(root)["pkg/neff/trn2/a/default.neff"] == b"NEFF a" * 100
    first = identities(root)

    changed = {**wanted, "pkg/_kernels/b.py": b"B = 2\n"}
    changed["pkg/neff/trn2/a/default.neff"] = neff(tmp_path / "compile", "a2.neff", b"new a")
    del changed["pkg/neff/trn2/b/default.neff"]
    record = update_tree(root, changed, STAMP, b"stamp 2")

    second = identities(root)
    rewritten = {name for name in first.keys() & second.keys() if first[name] != second[name]}
    assert rewritten == {"pkg/_kernels/b.py", "pkg/neff/trn2/a/default.neff", STAMP, RECORD_FILE}
    assert not (root / "pkg/neff/trn2/b").exists()  # its NEFF gone, and its emptied dir
    assert contents(root)["pkg/neff/trn2/a/default.neff"] == b"new a"
    fingerprints = record.by_name()
    assert record == read_record(root)
    assert sorted(fingerprints) == sorted([*changed, STAMP])
    assert fingerprints[STAMP][1] == hashlib.sha256(b"stamp 2").hexdigest()


def test_nothing_changed_writes_nothing(
    tmp_path: Path, wanted: dict[str, bytes | CompiledCopy]
) -> None:
    root = built(tmp_path, wanted, b"stamp")
    before = identities(root)
    update_tree(root, wanted, STAMP, b"stamp")
    assert identities(root) == before


@pytest.mark.parametrize("damage", ["same-size", "truncated", "removed"])
def test_a_damaged_file_in_the_tree_is_written_again(
    tmp_path: Path, wanted: dict[str, bytes | CompiledCopy], damage: str
) -> None:
    root = built(tmp_path, wanted, b"stamp")
    target = root / "pkg/neff/trn2/b/default.neff"
    if damage == "removed":
        target.unlink()
    else:
        data = target.read_bytes()
        target.write_bytes(b"X" + data[1:] if damage == "same-size" else data[:10])
    update_tree(root, wanted, STAMP, b"stamp")
    assert target.read_bytes() == b"NEFF b" * 100


def test_a_neff_that_is_not_its_compile_record_leaves_the_tree_as_it_was(
    tmp_path: Path, wanted: dict[str, bytes | CompiledCopy]
) -> None:
    root = built(tmp_path, wanted, b"stamp 1")
    before = contents(root)
    stale = wanted["pkg/neff/trn2/b/default.neff"]
    assert isinstance(stale, CompiledCopy)
    changed = {**wanted, "pkg/_kernels/a.py": b"A = 2\n"}
    changed["pkg/neff/trn2/b/default.neff"] = CompiledCopy(stale.source, "0" * 64, "k/v/trn2")
    with pytest.raises(BuildError, match="changed after it was compiled") as refused:
        update_tree(root, changed, STAMP, b"stamp 2")
    assert refused.value.unit == "k/v/trn2"
    assert contents(root) == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no work dir


def test_a_neff_kept_in_the_tree_is_trusted_only_with_the_recorded_sha256(
    tmp_path: Path, wanted: dict[str, bytes | CompiledCopy]
) -> None:
    """The compile record now names other bytes than the tree's copy: the copy is not
    kept on its stat, the NEFF is copied (and checked) again."""
    root = built(tmp_path, wanted, b"stamp")
    source = wanted["pkg/neff/trn2/a/default.neff"]
    assert isinstance(source, CompiledCopy)
    source.source.write_bytes(b"recompiled a")
    recompiled = CompiledCopy(source.source, hashlib.sha256(b"recompiled a").hexdigest(), "a")
    update_tree(root, {**wanted, "pkg/neff/trn2/a/default.neff": recompiled}, STAMP, b"stamp")
    assert (root / "pkg/neff/trn2/a/default.neff").read_bytes() == b"recompiled a"


def test_an_interrupted_update_is_finished_by_the_next(
    tmp_path: Path, wanted: dict[str, bytes | CompiledCopy]
) -> None:
    """As a kill between the renames leaves it: no stamp, some files new, a file the
    next update no longer wants."""
    root = built(tmp_path, wanted, b"stamp 1")
    (root / STAMP).unlink()
    (root / "pkg/_kernels/a.py").write_bytes(b"A = 2\n")
    (root / "pkg/_kernels/c.py").write_bytes(b"C = 1\n")
    update_tree(root, wanted, STAMP, b"stamp 1")
    expected = {n: c for n, c in contents(root).items() if n != RECORD_FILE}
    assert expected == {
        **{n: c if isinstance(c, bytes) else c.source.read_bytes() for n, c in wanted.items()},
        STAMP: b"stamp 1",
    }


def saved_record(root: Path) -> dict[str, object]:
    """The tree's record as its columns, by name."""
    form, names, stats, sha256 = pickle.loads((root / RECORD_FILE).read_bytes())
    return {"format": form, "names": names, "stats": stats, "sha256": sha256}


def with_integer_stats(record: dict[str, Any]) -> dict[str, Any]:
    """The record as the format before stamps had it: four numbers a file."""
    numbers = [int(number) for stamp in record["stats"] for number in stamp.split()]
    return {**record, "format": 2, "stats": numbers}


def save_record(root: Path, record: dict[str, object]) -> None:
    columns = (record["format"], record["names"], record["stats"], record["sha256"])
    (root / RECORD_FILE).write_bytes(pickle.dumps(columns))


@pytest.mark.parametrize("form", ["fingerprints", "columns", "integer-pickle"])
def test_a_record_an_older_nkibuild_wrote_is_read_and_nothing_is_written_again(
    tmp_path: Path, wanted: dict[str, bytes | CompiledCopy], form: str
) -> None:
    """A tree an older nkibuild recorded in JSON (one object of fingerprints, or the
    columns) or pickled with four numbers a file instead of its stamp is trusted as that
    record says: no file of it is written again; the next update that writes replaces it
    with this record."""
    root = built(tmp_path, wanted, b"stamp")
    recorded = read_record(root).by_name()
    older = with_integer_stats(saved_record(root))
    if form == "integer-pickle":
        save_record(root, older)
    else:
        if form == "fingerprints":
            rows = [[*map(int, stamp.split()), sha] for stamp, sha in recorded.values()]
            older = dict(reversed(list(zip(recorded, rows, strict=True))))
        (root / RECORD_FILE).unlink()
        (root / LEGACY_RECORD_FILE).write_text(json.dumps(older))
    assert read_record(root).by_name() == recorded
    before = identities(root)
    update_tree(root, wanted, STAMP, b"stamp")
    assert identities(root) == before
    update_tree(root, {**wanted, "pkg/_kernels/a.py": b"A = 2\n"}, STAMP, b"stamp")
    assert not (root / LEGACY_RECORD_FILE).exists()
    assert saved_record(root)["names"] == [*wanted, STAMP]


@pytest.mark.parametrize(
    "damage",
    [
        lambda record: {**record, "stats": [len(s) for s in record["stats"]]},
        lambda record: {**record, "stats": [True for _ in record["stats"]]},
        lambda record: {**record, "stats": record["stats"][:-1]},
        lambda record: {**with_integer_stats(record), "stats": [1, 2, 3]},
        lambda record: {**with_integer_stats(record), "stats": record["stats"] * 4},
        lambda record: {**record, "sha256": [None for _ in record["sha256"]]},
        lambda record: {**record, "names": "pkg/__init__.py"},
        lambda record: {**record, "format": 4},
    ],
    ids=[
        "stat-numbers",
        "stat-booleans",
        "stat-short",
        "older-stat-short",
        "older-stat-strings",
        "sha-none",
        "names-a-string",
        "format",
    ],
)
def test_a_record_of_the_wrong_shape_is_not_trusted(
    tmp_path: Path, wanted: dict[str, bytes | CompiledCopy], damage: Callable[[dict], dict]
) -> None:
    """A damaged record is no record (no traceback): every file is written again."""
    root = built(tmp_path, wanted, b"stamp")
    save_record(root, damage(saved_record(root)))
    assert read_record(root).by_name() == {}
    before = identities(root)
    update_tree(root, wanted, STAMP, b"stamp")
    after = identities(root)
    assert all(after[name] != before[name] for name in wanted)
    assert read_record(root).by_name().keys() == {*wanted, STAMP}


def test_a_record_that_is_no_pickle_of_plain_data_is_not_trusted(
    tmp_path: Path, wanted: dict[str, bytes | CompiledCopy]
) -> None:
    root = built(tmp_path, wanted, b"stamp")
    canary = tmp_path / "canary"
    canary.write_text("still here")
    (root / RECORD_FILE).write_bytes(pickle.dumps(RemovesWhenLoaded(canary)))
    assert read_record(root).by_name() == {}
    assert canary.exists()
    (root / RECORD_FILE).write_bytes(b"not a pickle")
    assert read_record(root).by_name() == {}
    (root / RECORD_FILE).unlink()
    (root / LEGACY_RECORD_FILE).write_text("[" * 200_000)  # an older record, nested too deep
    assert read_record(root).by_name() == {}


def test_a_file_changed_in_place_with_its_stat_kept_apart_is_found_by_its_stat(
    tmp_path: Path, wanted: dict[str, bytes | CompiledCopy]
) -> None:
    """Columns are compared file by file: one file of many changed (same size, new
    content) is the one written again, the others are kept."""
    root = built(tmp_path, wanted, b"stamp")
    target = root / "pkg/_kernels/a.py"
    target.write_bytes(b"A = 9\n")
    before = identities(root)
    update_tree(root, wanted, STAMP, b"stamp")
    after = identities(root)
    assert target.read_bytes() == b"A = 1\n"
    assert {name for name in before if after.get(name) != before[name]} == {
        "pkg/_kernels/a.py",
        STAMP,
        RECORD_FILE,
    }


def test_a_record_naming_files_outside_the_tree_is_not_trusted(
    tmp_path: Path, wanted: dict[str, bytes | CompiledCopy]
) -> None:
    root = tmp_path / "out" / "bundle"
    update_tree(root, wanted, STAMP, b"stamp 1")
    victim = tmp_path / "victim.txt"
    victim.write_text("not nkibuild's")
    record = saved_record(root)
    damaged = {
        **record,
        "names": [*record["names"], "../../victim.txt"],  # type: ignore[misc]
        "stats": [*record["stats"], 1, 1, 1, 1],  # type: ignore[misc]
        "sha256": [*record["sha256"], "x"],  # type: ignore[misc]
    }
    save_record(root, damaged)
    assert read_record(root).by_name() == {}
    update_tree(root, {**wanted, "pkg/_kernels/a.py": b"A = 2\n"}, STAMP, b"stamp 2")
    assert victim.read_text() == "not nkibuild's"
    assert (root / "pkg/_kernels/a.py").read_bytes() == b"A = 2\n"


def test_an_update_never_writes_or_removes_through_a_symlinked_directory(
    tmp_path: Path, wanted: dict[str, bytes | CompiledCopy]
) -> None:
    root = built(tmp_path, wanted, b"stamp 1")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "b.py").write_text("the user's")
    kernels = root / "pkg" / "_kernels"
    for name in ("a.py", "b.py"):
        (kernels / name).unlink()
    kernels.rmdir()
    kernels.symlink_to(outside, target_is_directory=True)
    changed = {n: c for n, c in wanted.items() if n != "pkg/_kernels/b.py"}
    changed["pkg/_kernels/a.py"] = b"A = 2\n"
    with pytest.raises(BuildError, match=r"_kernels is a symbolic link: nkibuild does not"):
        update_tree(root, changed, STAMP, b"stamp 2")
    assert sorted(p.name for p in outside.iterdir()) == ["b.py"]
    assert (outside / "b.py").read_text() == "the user's"


def test_the_record_goes_with_the_stamp_while_files_are_renamed(
    tmp_path: Path, wanted: dict[str, bytes | CompiledCopy], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kill after the renames must not leave a record the next update trusts: it
    would not list the files that update added, which then stay as strays."""
    from nkibuild.bundle import tree

    root = built(tmp_path, wanted, b"stamp 1")

    def killed(root: Path, removed: list[str]) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(tree, "_remove_empty_dirs", killed)
    with pytest.raises(KeyboardInterrupt):
        update_tree(root, {**wanted, "pkg/extra.py": b"E = 1\n"}, STAMP, b"stamp 2")
    assert not (root / STAMP).exists() and not (root / RECORD_FILE).exists()
    monkeypatch.undo()
    update_tree(root, wanted, STAMP, b"stamp 1")
    assert not (root / "pkg/extra.py").exists()


def test_an_update_of_the_same_files_appends_their_rows_to_the_record(
    tmp_path: Path, wanted: dict[str, bytes | CompiledCopy]
) -> None:
    """An edit's update (no file added or removed) appends the rows it wrote to the
    record instead of writing 15,000 rows anew; the record read is the one returned."""
    root = built(tmp_path, wanted, b"stamp 1")
    snapshot = (root / RECORD_FILE).read_bytes()
    changed = {**wanted, "pkg/_kernels/b.py": b"B = 2\n"}
    record = update_tree(root, changed, STAMP, b"stamp 2")
    data = (root / RECORD_FILE).read_bytes()
    assert data.startswith(snapshot) and len(data) > len(snapshot)
    assert read_record(root) == record
    assert record.by_name()["pkg/_kernels/b.py"][1] == hashlib.sha256(b"B = 2\n").hexdigest()
    before = identities(root)
    assert update_tree(root, changed, STAMP, b"stamp 2") == record
    assert identities(root) == before


def test_a_torn_append_is_not_applied_and_its_files_are_written_again(
    tmp_path: Path, wanted: dict[str, bytes | CompiledCopy]
) -> None:
    """A build killed while appending: the record is its snapshot, the files that update
    wrote are written again and the record is written whole."""
    root = built(tmp_path, wanted, b"stamp 1")
    first = read_record(root)
    changed = {**wanted, "pkg/_kernels/b.py": b"B = 2\n"}
    update_tree(root, changed, STAMP, b"stamp 2")
    (root / RECORD_FILE).write_bytes((root / RECORD_FILE).read_bytes()[:-3])
    assert read_record(root) == first
    before = identities(root)
    record = update_tree(root, changed, STAMP, b"stamp 2")
    after = identities(root)
    assert {name for name in before if before[name] != after[name]} == {
        "pkg/_kernels/b.py",
        STAMP,
        RECORD_FILE,
    }
    assert (root / RECORD_FILE).read_bytes() == plaindata.dumps((FORMAT, *record))


def test_the_record_is_written_anew_after_its_most_updates(
    tmp_path: Path, wanted: dict[str, bytes | CompiledCopy], monkeypatch: pytest.MonkeyPatch
) -> None:
    from nkibuild.bundle import tree

    monkeypatch.setattr(tree, "MAX_UPDATES", 2)
    root = built(tmp_path, wanted, b"stamp 0")
    sizes = []
    for version in range(1, 4):
        changed = {**wanted, "pkg/_kernels/b.py": f"B = {version}\n".encode()}
        record = update_tree(root, changed, STAMP, f"stamp {version}".encode())
        sizes.append((root / RECORD_FILE).stat().st_size)
        assert read_record(root) == record
    assert sizes[0] < sizes[1] and sizes[2] == len(plaindata.dumps((FORMAT, *record)))


def test_a_killed_update_of_the_same_files_leaves_its_files_to_be_written_again(
    tmp_path: Path, wanted: dict[str, bytes | CompiledCopy], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record stays while an edit's files are renamed in (it lists every file the
    update writes): each renamed in has another stamp than the one recorded."""
    from nkibuild.bundle import tree

    root = built(tmp_path, wanted, b"stamp 1")

    def killed(root: Path, removed: list[str]) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(tree, "_remove_empty_dirs", killed)
    changed = {**wanted, "pkg/_kernels/a.py": b"A = 2\n"}
    with pytest.raises(KeyboardInterrupt):
        update_tree(root, changed, STAMP, b"stamp 2")
    assert not (root / STAMP).exists() and (root / RECORD_FILE).exists()
    monkeypatch.undo()
    before = identities(root)
    update_tree(root, changed, STAMP, b"stamp 2")
    after = identities(root)
    rewritten = {name for name in before if before[name] != after[name]}
    assert rewritten == {"pkg/_kernels/a.py", RECORD_FILE}
    assert (root / STAMP).read_bytes() == b"stamp 2"


KILLED_UPDATE = """\
import sys
from pathlib import Path
from nkibuild.bundle.tree import update_tree
version = sys.argv[2]
wanted = {f"pkg/m{i:04d}/f.py": f"{version} {i}".encode() for i in range(int(sys.argv[3]))}
print("ready", flush=True)
update_tree(Path(sys.argv[1]), wanted, "bundle.json", version.encode())
"""


def test_sigkill_during_updates_never_leaves_a_stamped_tree_that_is_not_complete(
    tmp_path: Path,
) -> None:
    root, files = tmp_path / "bundle", 1500
    names = [f"pkg/m{i:04d}/f.py" for i in range(files)]
    rng = random.Random()
    for trial in range(6):
        version = f"v{trial}"
        command = [sys.executable, "-c", KILLED_UPDATE, str(root), version, str(files)]
        proc = subprocess.Popen(command, stdout=subprocess.PIPE)
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        time.sleep(rng.uniform(0, 0.4))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if (root / STAMP).exists():  # a stamped tree is complete: all old or all new
            stamped, found = (root / STAMP).read_text(), contents(root)
            assert all(found[n] == f"{stamped} {i}".encode() for i, n in enumerate(names)), trial
        finished = subprocess.run(command, capture_output=True, check=False)
        assert finished.returncode == 0, finished.stderr
        found = contents(root)
        assert (root / STAMP).read_text() == version
        assert sorted(found) == sorted([*names, STAMP, RECORD_FILE])
        assert all(found[n] == f"{version} {i}".encode() for i, n in enumerate(names))
    # What killed updates leave besides the tree: work dirs a build's sweep removes.
    swept = set(leftovers(tmp_path, LEFTOVER_PATTERNS))
    assert {p for p in tmp_path.iterdir() if p != root} == swept


def two_kernel_project(root: Path) -> Path:
    manifest = softmax_manifest("{name: inc-kernels, version: 1.0.0}", reference=True)
    manifest += (
        "  other:\n    frontend: hlo\n    source: kernels/other.hlo.pb\n"
        "    inputs:\n      logits: {shape: [64, 1024], dtype: float32}\n"
    )
    return softmax_project(root, manifest, {"kernels/other.hlo.pb": hlo("other")})


def hlo(name: str) -> bytes:
    return build_hlo_module(name, [("logits", "float32", (64, 1024))], [("float32", (64, 1024))])


def fresh_wheel(project: Path, out: Path) -> bytes:
    bundle = load_bundle(project / "build" / "bundle" / "inc-kernels", build_info=False)
    return build_wheel(bundle, out).read_bytes()


def built_wheel(root: Path, copied: list[str]) -> tuple[Path, Path]:
    """The two-kernel project built, and its wheel; `copied` emptied for what follows."""
    project = two_kernel_project(root)
    assert build(project).ok
    copied.clear()
    (wheel,) = (project / "dist").glob("*.whl")
    return project, wheel


@pytest.fixture
def copied(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the members taken from a previous wheel, as they are taken (one by one
    or, from a trusted wheel, in runs)."""
    names = counted_member_copies(monkeypatch)
    copy_run = wheel_module._copy_run

    def counted_run(directory: wheel_module.Directory, run: range, *args: object) -> None:
        names.extend(directory.names[run.start : run.stop])
        copy_run(directory, run, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(wheel_module, "_copy_run", counted_run)
    return names


def test_an_edit_rebuilds_a_wheel_byte_identical_to_a_fresh_one(
    tmp_path: Path, copied: list[str]
) -> None:
    project = two_kernel_project(tmp_path / "p")
    assert build(project).ok
    writer = json.loads((project / "build" / "state" / WRITER_FILE).read_text())
    assert writer["writer"] == wheel_module.writer_identity()
    copied.clear()
    (project / "kernels" / "other.hlo.pb").write_bytes(hlo("edited"))
    summary = build(project)
    assert summary.ok and "wheel" in summary.executed
    (wheel,) = (project / "dist").glob("*.whl")
    assert wheel.read_bytes() == fresh_wheel(project, tmp_path / "fresh")
    with zipfile.ZipFile(wheel) as archive:
        members = [n for n in archive.namelist() if not n.startswith("inc_kernels-1.0.0.dist")]
    # Every member but the edited kernel's NEFFs (and _build.json, which lists them)
    # comes from the previous wheel.
    changed = {"inc_kernels/_build.json"} | {
        f"inc_kernels/neff/{t}/other/default.neff" for t in ("trn1", "trn2")
    }
    assert sorted(copied) == sorted(set(members) - changed)


def test_a_damaged_member_of_the_previous_wheel_is_not_reused(
    tmp_path: Path, copied: list[str]
) -> None:
    project, wheel = built_wheel(tmp_path / "p", copied)
    with zipfile.ZipFile(wheel) as archive:
        info = archive.getinfo("inc_kernels/neff/trn2/softmax/default.neff")
    data = bytearray(wheel.read_bytes())
    data[info.header_offset + 30 + len(info.filename) + info.compress_size // 2] ^= 0x01
    wheel.write_bytes(bytes(data))
    summary = build(project)
    assert summary.ok and summary.executed == ["wheel"]
    assert "inc_kernels/neff/trn2/softmax/default.neff" not in copied
    assert "inc_kernels/neff/trn1/softmax/default.neff" in copied
    assert wheel.read_bytes() == fresh_wheel(project, tmp_path / "fresh")


@pytest.fixture
def unpacked(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Sizes of the contents the wheel stage decides a compression for: every member it
    writes, and every member of the previous wheel it checks before copying it."""
    sizes: list[int] = []
    compression = wheel_module._compression

    def counted(data: bytes) -> int:
        sizes.append(len(data))
        return compression(data)

    monkeypatch.setattr(wheel_module, "_compression", counted)
    return sizes


@pytest.mark.parametrize("touched", [False, True], ids=["as-written", "touched"])
def test_a_wheel_with_the_stat_it_was_written_with_lends_members_unchecked(
    tmp_path: Path, copied: list[str], unpacked: list[int], touched: bool
) -> None:
    """Its members are what this writer stored: not unpacked again. A wheel whose stat
    changed (same bytes, touched) is checked member by member, and lends as much."""
    project = two_kernel_project(tmp_path / "p")
    assert build(project).ok
    (wheel,) = (project / "dist").glob("*.whl")
    if touched:
        wheel.write_bytes(wheel.read_bytes())
    copied.clear()
    unpacked.clear()
    (project / "kernels" / "other.hlo.pb").write_bytes(hlo("edited"))
    assert build(project).ok
    with zipfile.ZipFile(wheel) as archive:
        written = len(archive.namelist()) - len(copied)  # RECORD and METADATA among them
    assert len(copied) >= 9  # all but the edited kernel's NEFFs and _build.json
    assert len(unpacked) == written + (len(copied) if touched else 0)
    assert wheel.read_bytes() == fresh_wheel(project, tmp_path / "fresh")


def test_a_wheel_from_another_writer_lends_nothing(tmp_path: Path, copied: list[str]) -> None:
    project = two_kernel_project(tmp_path / "p")
    assert build(project).ok
    copied.clear()
    writer_file = project / "build" / "state" / WRITER_FILE
    recorded = json.loads(writer_file.read_text())
    recorded["writer"]["zlib"] = "0.0"
    writer_file.write_text(json.dumps(recorded))
    (project / "kernels" / "other.hlo.pb").write_bytes(hlo("edited"))
    summary = build(project)
    assert summary.ok and "wheel" in summary.executed and copied == []
    (wheel,) = (project / "dist").glob("*.whl")
    assert wheel.read_bytes() == fresh_wheel(project, tmp_path / "fresh")
    assert json.loads(writer_file.read_text())["writer"] == wheel_module.writer_identity()


def test_a_previous_wheel_whose_directory_points_past_its_end_lends_nothing(
    tmp_path: Path, copied: list[str]
) -> None:
    project, wheel = built_wheel(tmp_path / "p", copied)
    data = bytearray(wheel.read_bytes())
    # The first central directory header's local header offset (at byte 42 of it) now
    # points 10 bytes before the end: too few bytes there for a local header.
    first = data.index(b"PK\x01\x02")
    data[first + 42 : first + 46] = (len(data) - 10).to_bytes(4, "little")
    wheel.write_bytes(bytes(data))
    summary = build(project)
    assert summary.ok and summary.executed == ["wheel"]
    with zipfile.ZipFile(wheel) as archive:
        assert archive.namelist()[0] not in copied
    assert wheel.read_bytes() == fresh_wheel(project, tmp_path / "fresh")


def test_a_previous_file_that_is_no_wheel_is_closed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[object] = []

    def tracked(*args: object) -> object:
        handle = open(*args)  # type: ignore[call-overload]  # noqa: SIM115 (checked closed)
        opened.append(handle)
        return handle

    monkeypatch.setattr(wheel_module, "open", tracked, raising=False)
    damaged = tmp_path / "damaged.whl"
    damaged.write_bytes(b"PK\x03\x04 not a zip archive")
    with wheel_module.Previous.of(damaged) as previous:
        assert previous is None
    assert len(opened) == 1 and all(handle.closed for handle in opened)  # type: ignore[attr-defined]
