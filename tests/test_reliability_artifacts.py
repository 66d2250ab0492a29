"""Corrupt artifacts: damaged outputs in the build dir, dist dir and NEFF cache are
detected by the next build, which redoes exactly the step that made them; corrupt
inputs are refused with a clear error."""

from __future__ import annotations

import random
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from campaign import Project, finished_tasks, record
from helpers import module, softmax_manifest, softmax_project

HLO = "build/extract/softmax/default/model.hlo_module.pb"
NEFF = "build/compile/softmax/default/trn2/model.neff"
RESULT = "build/compile/softmax/default/trn2/result.json"
BUNDLE_FILE = "build/bundle/acme-kernels/acme_kernels/_runtime.py"
BUNDLED_NEFF = "build/bundle/acme-kernels/acme_kernels/neff"
WHEEL = "dist/acme_kernels-0.1.0-py3-none-any.whl"


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def empty(path: Path) -> None:
    path.write_bytes(b"")


def garbage(path: Path) -> None:
    path.write_bytes(random.Random(path.name).randbytes(path.stat().st_size))


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def append(path: Path) -> None:
    with open(path, "ab") as handle:
        handle.write(b"\n# edited\n")


CORRUPTIONS: dict[str, Callable[[Path], None]] = {
    "truncated": truncate,
    "empty": empty,
    "garbage": garbage,
    "flipped-byte": flip_a_byte,
    "appended": append,
}
CAMPAIGN = [pytest.mark.slow, pytest.mark.campaign]
# (what, path, the task that must run again); the fast run takes one corruption each.
ARTIFACTS = [
    ("HLO module", HLO, "extract:softmax/default"),
    ("NEFF", NEFF, "compile:softmax/default/trn2"),
    ("compile record", RESULT, "compile:softmax/default/trn2"),
    ("bundle file", BUNDLE_FILE, "bundle"),
    ("bundled NEFF", BUNDLED_NEFF, "bundle"),
    ("wheel", WHEEL, "wheel"),
]
FAST = {"HLO module": "truncated", "NEFF": "flipped-byte", "compile record": "garbage",
        "bundle file": "appended", "bundled NEFF": "empty", "wheel": "truncated"}  # fmt: skip
CASES = [
    pytest.param(
        what, path, task, how,
        id=f"{what}-{how}",
        marks=[] if FAST[what] == how else CAMPAIGN,
    )
    for what, path, task in ARTIFACTS
    for how in CORRUPTIONS
]  # fmt: skip


@pytest.fixture
def built(tmp_path: Path) -> tuple[Project, bytes]:
    """Every artifact damaged below is softmax's or the package's: the example's softmax
    alone (prebuilt HLO, no tracing) has them all, at the example's paths."""
    manifest = softmax_manifest(
        "{name: acme-kernels, version: 0.1.0}", defaults="{targets: [trn2]}"
    )
    project = Project.at(softmax_project(tmp_path / "project", manifest), tmp_path / "cache")
    result = project.build()
    assert result.returncode == 0, result.stderr
    return project, project.wheel()


@pytest.mark.parametrize(("what", "path", "task", "how"), CASES)
def test_a_damaged_output_is_detected_and_rebuilt(
    built: tuple[Project, bytes], what: str, path: str, task: str, how: str
) -> None:
    project, reference = built
    target = project.root / path
    if target.is_dir():
        (target,) = [p for p in target.rglob("*.neff") if "softmax" in str(p)][:1]
    CORRUPTIONS[how](target)
    rebuilt = project.build()
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    assert task in finished_tasks(rebuilt.stdout), rebuilt.stdout
    assert project.wheel() == reference
    record(f"damaged {what} in the build/dist dir", corruption=how, trials=1,
           result=f"detected; {task} ran again; wheel byte-identical")  # fmt: skip


CACHE_CASES = [
    pytest.param(member, how, id=f"{member}-{how}", marks=[] if fast else CAMPAIGN)
    for member, how, fast in [
        ("model.neff", "flipped-byte", True),
        ("model.neff", "truncated", False),
        ("model.neff", "garbage", False),
        ("entry.json", "garbage", True),
        ("entry.json", "truncated", False),
        ("entry.json", "flipped-byte", False),
    ]
]


@pytest.mark.parametrize(("member", "how"), CACHE_CASES)
def test_a_corrupt_cache_entry_is_discarded_and_recompiled(
    built: tuple[Project, bytes], member: str, how: str
) -> None:
    project, reference = built
    entries = sorted(project.cache.glob(f"neff/*/*/{member}"))
    for entry in entries:
        CORRUPTIONS[how](entry)
    for output in ("build", "dist"):
        shutil.rmtree(project.root / output)
    rebuilt = project.build()
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    if member == "model.neff" or how != "flipped-byte":  # a flipped JSON byte may still parse
        assert f"{len(entries)} compiled" in rebuilt.stdout, rebuilt.stdout
        assert "corrupt cache entry" in rebuilt.stdout, rebuilt.stdout
    assert project.wheel() == reference
    assert project.corrupt_cache_entries() == 0
    record("corrupt NEFF cache entry", member=member, corruption=how, trials=len(entries),
           result="reported, discarded, recompiled; wheel byte-identical")  # fmt: skip


@pytest.mark.parametrize("how", ["truncated", "garbage", "empty"])
def test_a_corrupt_hlo_input_is_a_clear_error(tmp_path: Path, how: str) -> None:
    # Softmax next to a second prebuilt-HLO kernel, whose build must go on.
    other = "  k0:\n    frontend: hlo\n    source: kernels/k0.pb\n"
    other += "    inputs: {x: {shape: [4, 8], dtype: float32}}\n"
    root = softmax_project(
        tmp_path / "project", softmax_manifest(kernel=other), {"kernels/k0.pb": module("k0", 8)}
    )
    project = Project.at(root, tmp_path / "cache")
    CORRUPTIONS[how](project.root / "kernels" / "softmax.hlo.pb")
    result = project.build("--keep-going")
    assert result.returncode == 1
    assert "Traceback" not in result.stdout + result.stderr
    assert "softmax/default: the HLO module is not valid" in result.stderr, result.stderr
    assert (project.root / "build" / "compile" / "k0").exists()  # the rest went on


@pytest.mark.parametrize("split", [False, True], ids=["one-wheel", "split-targets"])
def test_the_bundle_refuses_a_neff_changed_after_its_compile(tmp_path: Path, split: bool) -> None:
    """Behind the outputs check: even handed a stale compile record, no wheel gets the NEFF."""
    from helpers import build

    from nkibuild.bundle import generate_bundle
    from nkibuild.compiler import load_result
    from nkibuild.errors import BuildError
    from nkibuild.manifest import load_manifest

    # Prebuilt HLO for two targets: the bundle stage is under test, not tracing.
    package = f"{{name: acme-kernels, version: 0.1.0, split-targets: {str(split).lower()}}}"
    project_dir = softmax_project(tmp_path / "project", softmax_manifest(package))
    assert build(project_dir).ok
    manifest = load_manifest(project_dir / "nkibuild.yaml")
    compiled = [load_result(d) for d in sorted((project_dir / "build/compile").glob("*/*/*"))]
    flip_a_byte(compiled[-1].neff_path)
    with pytest.raises(BuildError, match="changed after it was compiled"):
        generate_bundle(manifest, compiled, tmp_path / "bundle")
    assert not (tmp_path / "bundle").exists()
