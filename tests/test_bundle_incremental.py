"""The bundle stage: the tree holds exactly what the build wants, whatever it held
before (an edit, a damaged or removed file, a killed update), never a NEFF whose bytes
are not its compile record's, and never written through a symbolic link; the wheel of
an edited project is byte for byte the wheel of a fresh bundle."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import build, softmax_manifest, softmax_project

from nkibuild.bundle import load_bundle
from nkibuild.bundle.buildinfo import read_build_info
from nkibuild.bundle.tree import CompiledCopy, Content, digest, update_tree
from nkibuild.bundle.wheel import build_wheel
from nkibuild.errors import BuildError
from nkibuild.fsutil import LEFTOVER_PATTERNS, leftovers
from nkibuild.toolchain_double.hlo_writer import build_hlo_module

STAMP = "bundle.json"


def neff(directory: Path, name: str, data: bytes) -> CompiledCopy:
    """A compiled NEFF, written as a compile writes it (a new file, renamed in)."""
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{name}.tmp")
    temp.write_bytes(data)
    os.replace(temp, path)
    return CompiledCopy(path, hashlib.sha256(data).hexdigest(), f"unit {name}")


def update(root: Path, files: dict[str, Content]) -> None:
    """Bring the tree at `root` to `files`, its stamp listing them as bundle.json does."""
    digests = {name: digest(content) for name, content in files.items()}
    try:
        listed = json.loads((root / STAMP).read_text())
    except (OSError, ValueError):
        listed = None
    stamp = json.dumps(digests, sort_keys=True).encode()
    update_tree(root, files, digests, listed, (STAMP, stamp))


def contents(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def expected(files: dict[str, Content]) -> dict[str, bytes]:
    """What a tree holding `files` holds, its stamp included."""
    wanted = {n: c if isinstance(c, bytes) else c.source.read_bytes() for n, c in files.items()}
    stamp = {name: digest(content) for name, content in files.items()}
    return {**wanted, STAMP: json.dumps(stamp, sort_keys=True).encode()}


@pytest.fixture
def wanted(tmp_path: Path) -> dict[str, Content]:
    compiled = tmp_path / "compile"
    return {
        "pkg/__init__.py": b"'''package'''\n",
        "pkg/_kernels/a.py": b"A = 1\n",
        "pkg/_kernels/b.py": b"B = 1\n",
        "pkg/neff/trn2/a/default.neff": neff(compiled, "a.neff", b"NEFF a" * 100),
        "pkg/neff/trn2/b/default.neff": neff(compiled, "b.neff", b"NEFF b" * 100),
    }


@pytest.fixture
def root(tmp_path: Path, wanted: dict[str, Content]) -> Path:
    """A bundle tree written once to hold `wanted`."""
    root = tmp_path / "out" / "bundle"
    update(root, wanted)
    assert contents(root) == expected(wanted)
    return root


def test_an_update_gives_the_tree_exactly_the_files_wanted(
    tmp_path: Path, wanted: dict[str, Content], root: Path
) -> None:
    changed = {**wanted, "pkg/_kernels/b.py": b"B = 2\n", "pkg/_kernels/c.py": b"C = 1\n"}
    changed["pkg/neff/trn2/a/default.neff"] = neff(tmp_path / "compile", "a2.neff", b"new a")
    del changed["pkg/neff/trn2/b/default.neff"]
    update(root, changed)
    assert contents(root) == expected(changed)
    assert not (root / "pkg/neff/trn2/b").exists()  # its NEFF gone, and its emptied dir


@pytest.mark.parametrize("damage", ["same-size", "truncated", "removed", "a-link"])
def test_a_damaged_file_in_the_tree_is_written_again(
    tmp_path: Path, wanted: dict[str, Content], root: Path, damage: str
) -> None:
    """Whatever became of a file since the stamp was written, even at once (in the
    same tick of the clock), the next update writes it again."""
    for name in ("pkg/neff/trn2/b/default.neff", "pkg/_kernels/a.py"):
        target = root / name
        data = target.read_bytes()
        target.unlink()
        if damage == "same-size":
            target.write_bytes(b"X" + data[1:])
        elif damage == "truncated":
            target.write_bytes(data[:3])
        elif damage == "a-link":  # to a file outside with the wanted bytes
            (tmp_path / "outside").write_bytes(data)
            target.symlink_to(tmp_path / "outside")
    update(root, wanted)
    assert contents(root) == expected(wanted)
    assert not (root / "pkg/_kernels/a.py").is_symlink()


def test_a_neff_that_is_not_its_compile_record_leaves_the_tree_as_it_was(
    tmp_path: Path, wanted: dict[str, Content], root: Path
) -> None:
    before = contents(root)
    stale = wanted["pkg/neff/trn2/b/default.neff"]
    assert isinstance(stale, CompiledCopy)
    changed = {**wanted, "pkg/_kernels/a.py": b"A = 2\n"}
    changed["pkg/neff/trn2/b/default.neff"] = CompiledCopy(stale.source, "0" * 64, "k/v/trn2")
    with pytest.raises(BuildError, match="changed after it was compiled") as refused:
        update(root, changed)
    assert refused.value.unit == "k/v/trn2"
    assert contents(root) == before  # no temp file left either


def test_a_neff_kept_in_the_tree_is_trusted_only_with_the_recorded_sha256(
    tmp_path: Path, wanted: dict[str, Content], root: Path
) -> None:
    """A unit compiled again: its record names other bytes than the tree's NEFF, which
    is taken again (and checked)."""
    recompiled = neff(tmp_path / "compile", "a.neff", b"recompiled a")
    update(root, {**wanted, "pkg/neff/trn2/a/default.neff": recompiled})
    assert (root / "pkg/neff/trn2/a/default.neff").read_bytes() == b"recompiled a"


def test_a_neff_changed_in_place_behind_its_record_is_never_taken(
    wanted: dict[str, Content], root: Path
) -> None:
    """The tree's NEFF is its own copy: bytes changed in place in the compile directory
    leave it as it was, and are refused where the NEFF must be taken again."""
    compiled = wanted["pkg/neff/trn2/a/default.neff"]
    assert isinstance(compiled, CompiledCopy)
    with open(compiled.source, "r+b") as handle:
        handle.write(b"X")
    before = contents(root)
    update(root, wanted)
    assert contents(root) == before
    (root / "pkg/neff/trn2/a/default.neff").unlink()
    with pytest.raises(BuildError, match="changed after it was compiled"):
        update(root, wanted)
    assert contents(root) == {
        n: c for n, c in before.items() if n != "pkg/neff/trn2/a/default.neff"
    }


def test_an_interrupted_update_is_finished_by_the_next(
    wanted: dict[str, Content], root: Path
) -> None:
    """As a kill after the stamp was removed leaves it: some files new, a file the next
    update does not want, a temp file."""
    (root / STAMP).unlink()
    (root / "pkg/_kernels/a.py").write_bytes(b"A = 2\n")
    (root / "pkg/_kernels/c.py").write_bytes(b"C = 1\n")
    (root / "pkg/.x.py.0123.tmp").write_bytes(b"half")
    update(root, wanted)
    assert contents(root) == expected(wanted)


def test_a_stamp_listing_files_outside_the_tree_removes_none_of_them(
    tmp_path: Path, wanted: dict[str, Content], root: Path
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("not nkibuild's")
    listed = json.loads((root / STAMP).read_text())
    (root / STAMP).write_text(json.dumps({**listed, "../../victim.txt": "x", "/x": "y"}))
    update(root, {**wanted, "pkg/_kernels/a.py": b"A = 2\n"})
    assert victim.read_text() == "not nkibuild's"
    assert (root / "pkg/_kernels/a.py").read_bytes() == b"A = 2\n"


def test_an_update_never_writes_or_removes_through_a_symlinked_directory(
    tmp_path: Path, wanted: dict[str, Content], root: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "b.py").write_text("the user's")
    kernels = root / "pkg" / "_kernels"
    shutil.rmtree(kernels)
    kernels.symlink_to(outside, target_is_directory=True)
    changed = {n: c for n, c in wanted.items() if n != "pkg/_kernels/b.py"}
    changed["pkg/_kernels/a.py"] = b"A = 2\n"
    with pytest.raises(BuildError, match=r"_kernels is a symbolic link: nkibuild does not"):
        update(root, changed)
    assert sorted(p.name for p in outside.iterdir()) == ["b.py"]
    assert (outside / "b.py").read_text() == "the user's"


def test_a_tree_that_is_a_symbolic_link_is_refused(
    tmp_path: Path, wanted: dict[str, Content]
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "bundle"
    root.symlink_to(outside, target_is_directory=True)
    with pytest.raises(BuildError, match=r"bundle is a symbolic link: nkibuild does not"):
        update(root, wanted)
    assert list(outside.iterdir()) == []


KILLED_UPDATE = """\
import hashlib, json, sys
from pathlib import Path
from nkibuild.bundle.tree import update_tree
root, version, count = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
files = {f"pkg/m{i:04d}/f.py": f"{version} {i}".encode() for i in range(count)}
digests = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
try:
    listed = json.loads((root / "bundle.json").read_text())["files"]
except OSError:
    listed = None
stamp = json.dumps({"version": version, "files": digests}).encode()
print("ready", flush=True)
update_tree(root, files, digests, listed, ("bundle.json", stamp))
"""


def test_sigkill_during_updates_never_leaves_a_stamped_tree_that_is_not_complete(
    tmp_path: Path,
) -> None:
    root, files = tmp_path / "bundle", 1500
    names = [f"pkg/m{i:04d}/f.py" for i in range(files)]
    rng = random.Random(28)
    for trial in range(6):
        version = f"v{trial}"
        command = [sys.executable, "-c", KILLED_UPDATE, str(root), version, str(files)]
        proc = subprocess.Popen(command, stdout=subprocess.PIPE)
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        time.sleep(rng.uniform(0, 0.4))  # a kill at some point of the update
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if (root / STAMP).exists():  # a stamped tree is complete: all old or all new
            stamped, found = json.loads((root / STAMP).read_text())["version"], contents(root)
            assert all(found[n] == f"{stamped} {i}".encode() for i, n in enumerate(names)), trial
        finished = subprocess.run(command, capture_output=True, check=False)
        assert finished.returncode == 0, finished.stderr
        found = contents(root)
        assert json.loads(found.pop(STAMP))["version"] == version
        assert found == {n: f"{version} {i}".encode() for i, n in enumerate(names)}
    # What killed updates leave besides the tree: temp files a build's sweep removes.
    assert {p for p in tmp_path.iterdir() if p != root} == set(
        leftovers(tmp_path, LEFTOVER_PATTERNS)
    )


# The bundle stage of a build: the tree after any change is the one a fresh bundle writes.

PACKAGE = "parts_kernels"
KERNELS = ("softmax", "other", "third")


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


def tree(project: Path) -> dict[str, bytes]:
    return contents(project / "build" / "bundle" / "parts-kernels")


def fresh_tree(project: Path) -> dict[str, bytes]:
    """The tree the bundle stage writes where there was none."""
    shutil.rmtree(project / "build" / "bundle")
    assert build(project, "bundle").ok
    return tree(project)


def build_info(project: Path) -> dict:
    return json.loads(tree(project)[f"{PACKAGE}/_build.json"])


def test_an_edit_gives_the_tree_a_fresh_bundle_writes_with_the_recompiled_neff(
    tmp_path: Path,
) -> None:
    project = project_of_three(tmp_path / "p")
    assert build(project).ok
    (project / "kernels" / "other.hlo.pb").write_bytes(hlo("edited"))
    summary = build(project)
    assert summary.ok and "bundle" in summary.executed
    compiled = project / "build" / "compile" / "other" / "default" / "trn2" / "model.neff"
    sha256 = hashlib.sha256(compiled.read_bytes()).hexdigest()
    assert build_info(project)["kernels"]["other"]["neffs"]["trn2"]["default"]["sha256"] == sha256
    edited = tree(project)
    assert hashlib.sha256(edited[f"{PACKAGE}/neff/trn2/other/default.neff"]).hexdigest() == sha256
    assert edited == fresh_tree(project)


@pytest.mark.parametrize(
    "change",
    [
        ("    inputs:\n      logits", "    tolerance: {rtol: 0.25}\n    inputs:\n      logits"),
        ("version: 1.0.0}", "version: 1.0.0, split-targets: true}"),
        ("    inputs:\n      logits", "    targets: [trn2]\n    inputs:\n      logits"),
        ("  other:", "  zother:"),
    ],
    ids=["a-kernels-tolerance", "split-targets", "one-kernels-targets", "a-kernel-renamed"],
)
def test_a_manifest_change_gives_the_tree_a_fresh_bundle_writes(
    tmp_path: Path, change: tuple[str, str]
) -> None:
    project = project_of_three(tmp_path / "p")
    assert build(project).ok
    manifest = project / "nkibuild.yaml"
    manifest.write_text(manifest.read_text().replace(*change, 1))  # the first: softmax's
    assert build(project).ok
    changed = tree(project)
    assert changed == fresh_tree(project)
    if "tolerance" in change[1]:
        tolerances = {k: v["tolerance"]["rtol"] for k, v in build_info(project)["kernels"].items()}
        assert tolerances["softmax"] == 0.25 and tolerances["other"] != 0.25


def test_a_changed_project_file_gets_its_new_digest_in_the_provenance_summary(
    tmp_path: Path,
) -> None:
    project = project_of_three(tmp_path / "p")
    assert build(project).ok
    reference = project / "kernels" / "reference.py"
    reference.write_text(reference.read_text().replace("NumPy", "Numpy", 1))
    assert build(project).ok
    info = read_build_info(project / "build" / "bundle" / "parts-kernels" / PACKAGE / "_build.json")
    assert info.provenance is not None
    digests = {material.path: material.sha256 for material in info.provenance.sources}
    assert digests["kernels/reference.py"] == hashlib.sha256(reference.read_bytes()).hexdigest()


@pytest.mark.parametrize(
    "stamp", ["", "not json", "[" * 100_000, '{"files": 1}', '{"package": {}, "files": {}}']
)
def test_a_bundle_json_that_is_not_one_gets_the_whole_tree_written_again(
    tmp_path: Path, stamp: str
) -> None:
    """No traceback: the tree is written as if there were none."""
    project = project_of_three(tmp_path / "p")
    assert build(project).ok
    bundle_dir = project / "build" / "bundle" / "parts-kernels"
    (bundle_dir / f"{PACKAGE}/_kernels/other.py").write_text("damaged")
    (bundle_dir / "bundle.json").write_text(stamp)
    assert build(project).ok
    assert tree(project) == fresh_tree(project)


def test_bundle_json_is_its_content_indented_with_sorted_keys(tmp_path: Path) -> None:
    """bundle.json reads as one `json.dumps(indent=2, sort_keys=True)`, split-target
    parts included, and lists every file of the tree with its sha256."""
    project = project_of_three(tmp_path / "p")
    manifest = project / "nkibuild.yaml"
    manifest.write_text(
        manifest.read_text().replace("version: 1.0.0}", "version: 1.0.0, split-targets: true}")
    )
    assert build(project).ok
    found = tree(project)
    text = found.pop(STAMP).decode()
    stamp = json.loads(text)
    assert stamp["parts"] and all(part["files"] for part in stamp["parts"])
    assert text == json.dumps(stamp, indent=2, sort_keys=True)
    listed = dict(stamp["files"])
    for part in stamp["parts"]:
        listed.update((f"{part['directory']}/{n}", sha) for n, sha in part["files"].items())
    assert listed == {name: hashlib.sha256(data).hexdigest() for name, data in found.items()}


def two_kernel_project(root: Path) -> Path:
    manifest = softmax_manifest("{name: inc-kernels, version: 1.0.0}", reference=True)
    manifest += (
        "  other:\n    frontend: hlo\n    source: kernels/other.hlo.pb\n"
        "    inputs:\n      logits: {shape: [64, 1024], dtype: float32}\n"
    )
    return softmax_project(root, manifest, {"kernels/other.hlo.pb": hlo("other")})


def hlo(name: str) -> bytes:
    return build_hlo_module(name, [("logits", "float32", (64, 1024))], [("float32", (64, 1024))])


def test_an_edit_rebuilds_a_wheel_byte_identical_to_a_fresh_one(tmp_path: Path) -> None:
    project = two_kernel_project(tmp_path / "p")
    assert build(project).ok
    (project / "kernels" / "other.hlo.pb").write_bytes(hlo("edited"))
    summary = build(project)
    assert summary.ok and {"bundle", "wheel"} <= set(summary.executed)
    (wheel,) = (project / "dist").glob("*.whl")
    bundle = load_bundle(project / "build" / "bundle" / "inc-kernels", build_info=False)
    assert wheel.read_bytes() == build_wheel(bundle, tmp_path / "fresh").read_bytes()
    shutil.rmtree(project / "build" / "bundle")
    assert build(project, "bundle").ok  # a fresh bundle gives the same wheel too
    assert wheel.read_bytes() == build_wheel(bundle, tmp_path / "fresh2").read_bytes()
