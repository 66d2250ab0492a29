"""The bundle's per-kernel parts and their memo (nkibuild/bundle/parts.py): an edit
recomputes the edited kernel's part only, and what the bundle writes is byte for byte
what computing every part anew writes; a damaged, foreign or stale memo lends nothing."""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
from pathlib import Path

import pytest
from helpers import RemovesWhenLoaded, build, parts_made, softmax_manifest, softmax_project

from nkibuild import plaindata
from nkibuild.bundle.buildinfo import BuildInfo, document_json, encode, read_build_info
from nkibuild.bundle.parts import MEMO_FILE, KernelPart, _load
from nkibuild.toolchain_double.hlo_writer import build_hlo_module

PACKAGE = "parts_kernels"
KERNELS = ("softmax", "other", "third")


def hlo(name: str) -> bytes:
    return build_hlo_module(name, [("logits", "float32", (64, 1024))], [("float32", (64, 1024))])


def project_of_three(root: Path) -> Path:
    manifest = softmax_manifest("{name: parts-kernels, version: 1.0.0}", reference=True)
    for name in KERNELS[1:]:
        manifest += (
            f"  {name}:\n    frontend: hlo\n    source: kernels/{name}.hlo.pb\n"
            "    reference: kernels/reference.py:softmax\n"
            "    inputs:\n      logits: {shape: [64, 1024], dtype: float32}\n"
        )
    files = {f"kernels/{name}.hlo.pb": hlo(name) for name in KERNELS[1:]}
    return softmax_project(root, manifest, files)


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Kernels whose part the bundle stage computes (not taken from the memo)."""
    return parts_made(monkeypatch)


def tree(project: Path) -> dict[str, bytes]:
    root = project / "build" / "bundle" / "parts-kernels"
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.startswith(".")
    }


def rebuilt_without_memo(project: Path) -> dict[str, bytes]:
    """The tree the bundle stage writes with every part computed anew."""
    (project / "build" / "state" / MEMO_FILE).unlink()
    shutil.rmtree(project / "build" / "bundle")
    assert build(project, "bundle").ok
    return tree(project)


def test_an_edit_recomputes_only_the_edited_kernels_part(tmp_path: Path, made: list[str]) -> None:
    project = project_of_three(tmp_path / "p")
    assert build(project).ok
    assert sorted(made) == sorted(KERNELS)
    made.clear()
    (project / "kernels" / "other.hlo.pb").write_bytes(hlo("edited"))
    summary = build(project)
    assert summary.ok and "bundle" in summary.executed
    assert made == ["other"]
    edited = tree(project)
    info = json.loads(edited[f"{PACKAGE}/_build.json"])
    neff = project / "build" / "compile" / "other" / "default" / "trn2" / "model.neff"
    assert info["kernels"]["other"]["neffs"]["trn2"]["default"]["sha256"] == (
        hashlib.sha256(neff.read_bytes()).hexdigest()
    )
    assert edited == rebuilt_without_memo(project)


def test_a_kernels_manifest_entry_changed_recomputes_its_part(
    tmp_path: Path, made: list[str]
) -> None:
    project = project_of_three(tmp_path / "p")
    assert build(project).ok
    made.clear()
    manifest = project / "nkibuild.yaml"
    manifest.write_text(manifest.read_text() + "    tolerance: {rtol: 0.25}\n")  # on `third`
    assert build(project).ok
    assert made == ["third"]
    info = read_build_info(project / "build" / "bundle" / "parts-kernels" / PACKAGE / "_build.json")
    assert info.kernels["third"].tolerance.rtol == 0.25
    assert info.kernels["other"].tolerance.rtol != 0.25


@pytest.mark.parametrize(
    "memo", [b"", b"not a pickle", b"\x80\x05N."], ids=["empty", "garbage", "none"]
)
def test_a_damaged_memo_lends_nothing(tmp_path: Path, made: list[str], memo: bytes) -> None:
    project = project_of_three(tmp_path / "p")
    assert build(project).ok
    expected = tree(project)
    (project / "build" / "state" / MEMO_FILE).write_bytes(memo)
    shutil.rmtree(project / "build" / "bundle")
    made.clear()
    assert build(project, "bundle").ok
    assert sorted(made) == sorted(KERNELS)
    assert tree(project) == expected


def test_a_memo_naming_a_function_is_not_run(tmp_path: Path, made: list[str]) -> None:
    project = project_of_three(tmp_path / "p")
    assert build(project).ok
    canary = tmp_path / "canary"
    canary.write_text("still here")
    memo = project / "build" / "state" / MEMO_FILE
    memo.write_bytes(pickle.dumps(RemovesWhenLoaded(canary)))
    shutil.rmtree(project / "build" / "bundle")  # so that the bundle runs and reads it
    made.clear()
    assert build(project, "bundle").ok
    assert canary.exists()
    assert sorted(made) == sorted(KERNELS)  # lent nothing


def test_another_package_name_lends_nothing(tmp_path: Path, made: list[str]) -> None:
    project = project_of_three(tmp_path / "p")
    assert build(project).ok
    manifest = project / "nkibuild.yaml"
    manifest.write_text(manifest.read_text().replace("version: 1.0.0", "version: 1.0.1"))
    made.clear()
    assert build(project).ok
    assert sorted(made) == sorted(KERNELS)


def test_a_changed_project_file_gets_its_new_digest_in_the_provenance_summary(
    tmp_path: Path,
) -> None:
    """The memo hashes a file again when its stat changed (same size, new content)."""
    project = project_of_three(tmp_path / "p")
    assert build(project).ok
    reference = project / "kernels" / "reference.py"
    reference.write_text(reference.read_text().replace("NumPy", "Numpy", 1))
    assert build(project).ok
    info = read_build_info(project / "build" / "bundle" / "parts-kernels" / PACKAGE / "_build.json")
    assert info.provenance is not None
    digests = {material.path: material.sha256 for material in info.provenance.sources}
    assert digests["kernels/reference.py"] == hashlib.sha256(reference.read_bytes()).hexdigest()


def test_document_json_is_the_whole_document_encoded(example_bundle_info: BuildInfo) -> None:
    kernels = {
        name: encode(kernel.to_json()).encode()
        for name, kernel in example_bundle_info.kernels.items()
    }
    document = document_json(example_bundle_info.header_json(), kernels)
    assert document == (encode(example_bundle_info.to_json()) + "\n").encode()
    assert BuildInfo.from_text(document.decode()) == example_bundle_info


@pytest.fixture
def example_bundle_info(tmp_path: Path) -> BuildInfo:
    project = project_of_three(tmp_path / "p")
    assert build(project).ok
    return read_build_info(project / "build" / "bundle" / "parts-kernels" / PACKAGE / "_build.json")


@pytest.mark.parametrize(
    ("change", "recomputed"),
    [
        (("version: 1.0.0}", "version: 1.0.0, split-targets: true}"), sorted(KERNELS)),
        (("    inputs:\n      logits", "    targets: [trn2]\n    inputs:\n      logits"), None),
    ],
    ids=["split-targets", "one-kernels-targets"],
)
def test_what_changes_a_kernels_neffs_or_their_place_recomputes_its_part(
    tmp_path: Path, made: list[str], change: tuple[str, str], recomputed: list[str] | None
) -> None:
    project = project_of_three(tmp_path / "p")
    assert build(project).ok
    made.clear()
    manifest = project / "nkibuild.yaml"
    manifest.write_text(manifest.read_text().replace(*change, 1))  # the first: softmax's
    assert build(project).ok
    assert sorted(made) == (recomputed or ["softmax"])
    if recomputed is None:
        assert tree(project) == rebuilt_without_memo(project)


def test_an_edit_appends_to_the_memo_and_a_torn_append_is_redone(
    tmp_path: Path, made: list[str]
) -> None:
    """An edit appends its part to the memo instead of writing the whole memo anew; an
    append cut short lends nothing of its own and the next bundle writes the memo anew."""
    project = project_of_three(tmp_path / "p")
    assert build(project).ok
    memo = project / "build" / "state" / MEMO_FILE
    snapshot = memo.read_bytes()
    (project / "kernels" / "other.hlo.pb").write_bytes(hlo("edited"))
    made.clear()
    assert build(project).ok and made == ["other"]
    appended = memo.read_bytes()
    assert appended.startswith(snapshot) and len(appended) > len(snapshot)
    memo.write_bytes(appended[:-7])  # killed while appending
    (project / "kernels" / "third.hlo.pb").write_bytes(hlo("edited too"))
    made.clear()
    assert build(project).ok
    assert sorted(made) == ["other", "third"]  # other's recorded part was the torn one
    rewritten = memo.read_bytes()
    assert not rewritten.startswith(appended[:-7])
    made.clear()
    assert build(project, "bundle").ok and made == []
    assert tree(project) == rebuilt_without_memo(project)


def _memo_columns(memo: Path) -> tuple[tuple, list, dict, str]:
    """The memo's scope, the state of its kernels, its file digests and the bundle
    task's definition (a snapshot)."""
    scope, state, digests, definition = pickle.loads(memo.read_bytes())
    return scope, list(state), digests, definition


def _column(name: str) -> int:
    from nkibuild.bundle.parts import KernelPart

    return KernelPart._fields.index(name)


def test_a_memo_column_that_is_not_a_parts_lends_nothing(tmp_path: Path, made: list[str]) -> None:
    """The memo keeps the parts as columns, checked whole: one cut short lends nothing."""
    project = project_of_three(tmp_path / "p")
    assert build(project).ok
    expected = tree(project)
    memo = project / "build" / "state" / MEMO_FILE
    scope, state, digests, definition = _memo_columns(memo)
    state[4][_column("module")].pop()
    memo.write_bytes(pickle.dumps((scope, tuple(state), digests, definition)))
    shutil.rmtree(project / "build" / "bundle")
    made.clear()
    assert build(project, "bundle").ok
    assert sorted(made) == sorted(KERNELS)
    assert tree(project) == expected


def test_bundle_json_is_its_content_indented_with_sorted_keys(tmp_path: Path) -> None:
    """bundle.json's file lists are encoded apart (fast); the file reads as one
    `json.dumps(indent=2, sort_keys=True)`, split-target parts included."""
    project = project_of_three(tmp_path / "p")
    manifest = project / "nkibuild.yaml"
    manifest.write_text(
        manifest.read_text().replace("version: 1.0.0}", "version: 1.0.0, split-targets: true}")
    )
    assert build(project).ok
    text = (project / "build" / "bundle" / "parts-kernels" / "bundle.json").read_text()
    stamp = json.loads(text)
    assert stamp["parts"] and all(part["files"] for part in stamp["parts"])
    assert text == json.dumps(stamp, indent=2, sort_keys=True)


@pytest.mark.parametrize(
    "description",
    ["plain", "\0files 0", "\0files 1", "\0files 2"],
    ids=["plain", "spells-the-top-marker", "spells-a-parts-marker", "spells-an-unused-one"],
)
def test_bundle_json_is_written_as_json_dumps_indents_it(description: str) -> None:
    """The stamp joined from pieces is byte for byte `json.dumps(indent=2, sort_keys=True)`,
    also when a manifest's value spells the marker of a file list (then encoded whole),
    with an empty list and parts in the order given."""
    from nkibuild.bundle import _stamp_json

    stamp = {
        "package": {"name": "p", "description": description},
        "files": {"z.py": "9" * 64, "a/b.py": "0" * 64},
        "parts": [
            {"target": "trn2", "files": {"n/x.neff": "1" * 64}},
            {"target": "trn1", "files": {}},
        ],
        "targets": ["trn1", "trn2"],
    }
    assert _stamp_json(stamp) == json.dumps(stamp, indent=2, sort_keys=True).encode()


def _damaged(row: tuple, field: str, value: object) -> tuple:
    """A memo row (a part's fields) with one field replaced."""
    from nkibuild.bundle.parts import KernelPart

    return KernelPart._make(row)._replace(**{field: value})[:]


ROW_DAMAGE = {
    "module-kept": lambda row: _damaged(row, "module", b'"""other"""\n'),
    "info-text": lambda row: _damaged(row, "info_json", row[1].decode()),
    "neff-row-short": lambda row: _damaged(row, "neffs", row[4].split("\0", 1)[1]),
    "neff-row-unended": lambda row: _damaged(row, "neffs", row[4] + "x"),
    "neff-rows-a-tuple": lambda row: _damaged(row, "neffs", tuple(row[4].split("\0")[:4])),
    "targets-a-string": lambda row: _damaged(row, "targets", "trn2"),
    "tool-not-a-pair": lambda row: _damaged(row, "tools", (("nki",),)),
    "placeholder-number": lambda row: _damaged(row, "placeholder", 1),
    "sha-none": lambda row: _damaged(row, "module_sha256", None),
}


@pytest.mark.parametrize("damage", list(ROW_DAMAGE), ids=list(ROW_DAMAGE))
def test_a_memo_value_of_the_wrong_type_lends_nothing(
    tmp_path: Path, made: list[str], damage: str
) -> None:
    """A kernel's part in the memo with a value of the wrong type: the memo is not
    trusted (no traceback), every part is made again, and the tree is as before."""
    project = project_of_three(tmp_path / "p")
    assert build(project).ok
    expected = tree(project)
    memo = project / "build" / "state" / MEMO_FILE
    scope, state, digests, definition = _memo_columns(memo)
    columns = state[4]
    at = columns[0].index("other")
    row = ROW_DAMAGE[damage](tuple(column[at] for column in columns))
    for column, value in zip(columns, row, strict=True):
        column[at] = value
    memo.write_bytes(pickle.dumps((scope, tuple(state), digests, definition)))
    shutil.rmtree(project / "build" / "bundle")
    made.clear()
    assert build(project, "bundle").ok
    assert sorted(made) == sorted(KERNELS)
    assert tree(project) == expected


def test_a_kept_part_is_the_part_made_anew(
    tmp_path: Path, made: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the memo lends is field for field the part computing it anew gives (the
    module's sha256 included), tuples and all."""
    import nkibuild.bundle as bundle_module

    project = project_of_three(tmp_path / "p")
    assert build(project).ok
    given: list[list] = []
    write = bundle_module.write_bundle

    def spied(manifest: object, parts: list, *args: object) -> object:
        given.append(list(parts))
        return write(manifest, parts, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(bundle_module, "write_bundle", spied)
    bundle_dir = project / "build" / "bundle"
    shutil.rmtree(bundle_dir)
    made.clear()
    assert build(project, "bundle").ok and made == []  # every part lent by the memo
    (project / "build" / "state" / MEMO_FILE).unlink()
    shutil.rmtree(bundle_dir)
    assert build(project, "bundle").ok and sorted(made) == sorted(KERNELS)
    kept, anew = given
    # A tuple where a list was made, or the reverse, differs too. A lent part has no
    # module: the tree makes it again if it needs it.
    assert kept == [part._replace(module=None) for part in anew]
    assert all(part.module_sha256 == hashlib.sha256(part.module).hexdigest() for part in anew)
    assert all(type(part.neffs) is str and part.neffs.count("\0") == 8 for part in kept)


@pytest.mark.parametrize("key", ["k00001", "_x", "a b", "é", 'a"b\\c', "1st"])
def test_document_json_encodes_each_kernels_name_as_json_does(key: str) -> None:
    kernels = {key: encode({"n": 1}).encode(), "zz": encode([]).encode()}
    document = document_json({"format_version": 1}, kernels)
    expected = encode({"format_version": 1, "kernels": {key: {"n": 1}, "zz": []}}) + "\n"
    assert document == expected.encode()


def test_a_memo_that_cannot_be_read_lends_nothing(tmp_path: Path, made: list[str]) -> None:
    """The memo is unpickled as its file is read: a path that is no readable file
    (here a directory) is no memo, and the bundle is made whole, without a traceback."""
    project = project_of_three(tmp_path / "p")
    assert build(project).ok
    expected = tree(project)
    memo = project / "build" / "state" / MEMO_FILE
    memo.unlink()
    memo.mkdir()
    shutil.rmtree(project / "build" / "bundle")
    made.clear()
    summary = build(project, "bundle")
    assert summary.ok and sorted(made) == sorted(KERNELS)
    assert tree(project) == expected


def test_updates_after_a_damaged_one_are_not_applied(tmp_path: Path, made: list[str]) -> None:
    """Unpickling stops at the first damaged update: a later, whole one is not trusted."""
    project = project_of_three(tmp_path / "p")
    assert build(project).ok
    memo = project / "build" / "state" / MEMO_FILE
    snapshot = memo.read_bytes()
    _, state, digests, definition = pickle.loads(snapshot)
    columns = state[4]
    at = columns[0].index("other")
    stats = ["0 0 0 0"] * state[2][at]  # not the records' stamps: lends nothing if applied
    row = tuple(column[at] for column in columns)
    later = pickle.dumps(([(at, "other", state[0][at], stats, row)], digests, definition))
    memo.write_bytes(snapshot + b"\x80\x05garbage" + later)
    shutil.rmtree(project / "build" / "bundle")
    made.clear()
    assert build(project, "bundle").ok
    assert made == []  # the snapshot's parts, not the update's stale key


def test_a_kernel_added_or_removed_remakes_its_own_part_only(
    tmp_path: Path, made: list[str]
) -> None:
    """Another list of kernels is matched with the memo's by name: the others are kept,
    and the tree is the one computing every part anew writes."""
    project = project_of_three(tmp_path / "p")
    assert build(project).ok
    manifest = project / "nkibuild.yaml"
    original = manifest.read_text()
    (project / "kernels" / "fourth.hlo.pb").write_bytes(hlo("fourth"))
    manifest.write_text(
        original + "  fourth:\n    frontend: hlo\n    source: kernels/fourth.hlo.pb\n"
        "    inputs:\n      logits: {shape: [64, 1024], dtype: float32}\n"
    )
    made.clear()
    assert build(project).ok
    assert made == ["fourth"]
    assert tree(project) == rebuilt_without_memo(project)
    manifest.write_text(original.replace("  other:", "  zother:"))
    made.clear()
    assert build(project).ok
    assert made == ["zother"]
    assert tree(project) == rebuilt_without_memo(project)


def test_a_record_removed_is_not_lent_for(tmp_path: Path, made: list[str]) -> None:
    """A kernel whose compile record is gone: the build compiles it again and the
    bundle remakes its part (its record's stat is not the memo's), and only its."""
    project = project_of_three(tmp_path / "p")
    assert build(project).ok
    record = next((project / "build" / "compile").glob("other/*/*/result.json"))
    record.unlink()
    made.clear()
    assert build(project).ok
    assert made == ["other"]
    assert tree(project) == rebuilt_without_memo(project)


def test_a_memo_whose_columns_are_not_lists_lends_nothing_even_after_an_update(
    tmp_path: Path,
) -> None:
    """A damaged snapshot (a column of another type) followed by an update: no memo,
    not a traceback from applying the update to it."""
    scope = ("scope",)
    columns: list = [[] for _ in KernelPart._fields]
    columns[0] = {"x": 1}
    snapshot = (scope, ([], "", [], [], columns), {})
    update = ([(0, "k", b"", [], ("k", *[None] * (len(KernelPart._fields) - 1)))], {})
    memo_file = tmp_path / MEMO_FILE
    memo_file.write_bytes(plaindata.dumps(snapshot) + plaindata.dumps(update))
    assert _load(memo_file, scope).kernels.names == []


def test_a_bundle_of_the_same_definition_takes_the_memos_records_and_configs(
    tmp_path: Path, made: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given the bundle task's definition (its fingerprint) as when the memo was saved,
    the memo's record paths and kernel configs are not made again (only the records'
    stamps are taken); another definition (a kernel's config edited) makes them."""
    from nkibuild.bundle import parts

    project = project_of_three(tmp_path / "p")
    assert build(project).ok
    computed: list[int] = []
    current = parts._current

    def counted(*args):  # type: ignore[no-untyped-def]
        computed.append(1)
        return current(*args)

    monkeypatch.setattr(parts, "_current", counted)
    made.clear()
    (project / "kernels" / "other.hlo.pb").write_bytes(hlo("edited"))
    assert "bundle" in build(project).executed
    assert (made, computed) == (["other"], [])
    manifest = project / "nkibuild.yaml"
    manifest.write_text(manifest.read_text().replace("kernels/third.hlo.pb", "kernels/t.hlo.pb"))
    (project / "kernels" / "t.hlo.pb").write_bytes(hlo("third"))
    made.clear()
    assert "bundle" in build(project).executed
    assert (made, computed) == (["third"], [1])
    assert tree(project) == rebuilt_without_memo(project)


def test_a_memo_of_another_definition_is_checked_record_by_record(
    tmp_path: Path, made: list[str]
) -> None:
    """A memo whose definition is not the build's lends only the parts whose records
    and configs are as it recorded them (here a config it holds differs)."""
    project = project_of_three(tmp_path / "p")
    assert build(project).ok
    memo = project / "build" / "state" / MEMO_FILE
    scope, state, digests, _ = _memo_columns(memo)
    state[0][state[4][0].index("other")] = b"another config"  # as if edited since
    memo.write_bytes(pickle.dumps((scope, tuple(state), digests, "another definition")))
    made.clear()
    (project / "kernels" / "third.hlo.pb").write_bytes(hlo("third edited"))
    assert "bundle" in build(project).executed
    assert sorted(made) == ["other", "third"]
    assert tree(project) == rebuilt_without_memo(project)


def test_an_update_of_which_a_change_is_not_understood_is_not_applied_at_all(
    tmp_path: Path, made: list[str]
) -> None:
    """An appended update whose second change is damaged: its first change is not
    applied either (the memo would otherwise hold configs its definition does not
    describe, and lend a stale part under it)."""
    project = project_of_three(tmp_path / "p")
    assert build(project).ok
    manifest = project / "nkibuild.yaml"
    original = manifest.read_text()
    edited = original
    for name in ("other", "third"):
        line = f"    source: kernels/{name}.hlo.pb\n"
        edited = edited.replace(line, line + "    tolerance: {rtol: 0.25}\n")
    manifest.write_text(edited)
    assert build(project).ok  # one update appended, with two changes
    memo = project / "build" / "state" / MEMO_FILE
    (_, snapshot_end), (update, _) = plaindata.read_records(memo)
    changes, digests, definition = update
    assert [change[1] for change in changes] == ["other", "third"]
    changes[1] = (changes[1][0], "not-third", *changes[1][2:])
    memo.write_bytes(
        memo.read_bytes()[:snapshot_end] + plaindata.dumps((changes, digests, definition))
    )
    manifest.write_text(original)  # the snapshot's definition again
    made.clear()
    assert build(project).ok
    assert made == []  # the snapshot's parts: made of the original manifest
    assert tree(project) == rebuilt_without_memo(project)


@pytest.mark.parametrize("damage", ["removed", "edited"])
def test_a_lent_parts_loader_the_tree_lacks_is_made_again(
    tmp_path: Path, made: list[str], damage: str
) -> None:
    """The memo keeps a part's module sha256, not its module: a loader removed or edited
    in the tree is made again from its kernel, as it was when its part was made."""
    project = project_of_three(tmp_path / "p")
    assert build(project).ok
    expected = tree(project)
    loader = project / "build" / "bundle" / "parts-kernels" / PACKAGE / "_kernels" / "third.py"
    if damage == "removed":
        loader.unlink()
    else:
        loader.write_text("raise SystemExit\n")
    (project / "kernels" / "other.hlo.pb").write_bytes(hlo("edited"))
    made.clear()
    assert build(project).ok
    assert made == ["other"]
    assert loader.read_bytes() == expected[f"{PACKAGE}/_kernels/third.py"]


def test_a_lent_part_whose_loader_is_not_the_one_recorded_stops_the_bundle(
    tmp_path: Path, made: list[str]
) -> None:
    """A memo well-typed but wrong about a module's sha256 (written by hand): the loader
    made again does not hash to it, and the bundle says so rather than record a sha256
    its file does not have."""
    project = project_of_three(tmp_path / "p")
    assert build(project).ok
    memo = project / "build" / "state" / MEMO_FILE
    scope, state, digests, definition = _memo_columns(memo)
    columns = state[4]
    columns[_column("module_sha256")][columns[0].index("third")] = "0" * 64
    memo.write_bytes(pickle.dumps((scope, tuple(state), digests, definition)))
    (project / "kernels" / "other.hlo.pb").write_bytes(hlo("edited"))
    summary = build(project)
    assert not summary.ok and [failed.name for failed in summary.failures] == ["bundle"]
    assert "kernel 'third': its loader made again is not the one" in summary.failures[0].detail
