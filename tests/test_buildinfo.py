"""`_build.json`: the writer's output reads back through the typed definition unchanged,
the vendored runtime reads only fields the definition has, and bad documents are
refused with the field named."""

from __future__ import annotations

import ast
import copy
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from helpers import build, softmax_manifest, softmax_project

from nkibuild.bundle import RUNTIME_SOURCE, load_bundle
from nkibuild.bundle import buildinfo as schema
from nkibuild.bundle.buildinfo import FILE_NAME, FORMAT_VERSION, BuildInfo, BuildInfoError

REPO = Path(__file__).resolve().parents[1]


def built_bundle(project: Path, cache: Path) -> Path:
    """Build `project` up to its bundle with the toolchain double; the bundle directory."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("NKIBUILD_CACHE_DIR", str(cache))
        summary = build(project, "bundle")
    assert summary.ok, summary.to_json()
    (bundle,) = (project / "build" / "bundle").iterdir()
    return bundle


@pytest.fixture(scope="module")
def examples_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The examples (jax and hlo kernels, constants, variants, references, two targets)."""
    pytest.importorskip("jax")
    project = tmp_path_factory.mktemp("examples") / "project"
    shutil.copytree(REPO / "examples", project, ignore=shutil.ignore_patterns("build", "dist"))
    return built_bundle(project, tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def document(examples_bundle: Path) -> dict[str, Any]:
    return json.loads((examples_bundle / "acme_kernels" / FILE_NAME).read_text())


def test_the_written_document_round_trips(examples_bundle: Path) -> None:
    text = (examples_bundle / "acme_kernels" / FILE_NAME).read_text()
    info = BuildInfo.from_text(text)
    assert info.to_text() == text
    assert load_bundle(examples_bundle).build_info == info
    assert info.format_version == FORMAT_VERSION
    assert info.targets() == ["trn1", "trn2"]
    scaled_add = info.kernels["scaled_add"]
    assert scaled_add.constants == (("alpha", 0.5),)
    assert set(scaled_add.variants) == {"small", "large"}
    assert scaled_add.variants["large"].inputs[0].shape == (1024, 512)
    assert scaled_add.reference is not None and scaled_add.reference.function == "scaled_add"


def test_a_split_bundle_records_each_neff_in_its_target_package(tmp_path: Path) -> None:
    manifest = softmax_manifest("{name: split-kernels, version: 0.2.0, split-targets: true}")
    bundle = built_bundle(softmax_project(tmp_path / "project", manifest), tmp_path / "cache")
    project = load_bundle(bundle)
    assert project.build_info is not None
    assert project.build_info.split_targets == ("trn1", "trn2")
    neffs = project.build_info.kernels["softmax"].neffs
    assert {t: n["default"].package for t, n in neffs.items()} == {
        "trn1": "split_kernels_trn1",
        "trn2": "split_kernels_trn2",
    }
    assert [(p.target, p.build_info) for p in project.parts] == [("trn1", None), ("trn2", None)]


# --- the runtime's reads ------------------------------------------------------------------


NOT_THE_DOCUMENT = {"sys.modules", "os.environ"}  # mappings the runtime reads besides it


def runtime_keys() -> set[str]:
    """Every literal key runtime.py reads from a dict: `x["key"]` and `x.get("key", ...)`."""
    keys = set()
    for node in ast.walk(ast.parse(RUNTIME_SOURCE.read_text())):
        if isinstance(node, ast.Subscript):
            mapping, key = node.value, node.slice
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and node.args
        ):
            mapping, key = node.func.value, node.args[0]
        else:
            continue
        if ast.unparse(mapping) in NOT_THE_DOCUMENT:
            continue
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            keys.add(key.value)
    return keys


def defined_fields() -> set[str]:
    classes = [
        value
        for value in vars(schema).values()
        if isinstance(value, type) and dataclasses.is_dataclass(value)
    ]
    return {f.name for cls in classes for f in dataclasses.fields(cls)}


def written_keys(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for item in value.values() for k in written_keys(item)}
    if isinstance(value, list):
        return {k for item in value for k in written_keys(item)}
    return set()


def test_the_runtime_reads_only_defined_fields_that_the_writer_writes(
    document: dict[str, Any],
) -> None:
    read = runtime_keys()
    # Guards the scan itself: these are reads the runtime is known to make.
    assert {"kernels", "neffs", "placeholder", "input_names", "neuron_sdk"} <= read
    assert read - defined_fields() == set()
    assert read - written_keys(document) == set()


RUN_EVERY_KERNEL = """\
import ml_dtypes
import numpy as np
import acme_kernels

DTYPES = {"bfloat16": ml_dtypes.bfloat16}
info = acme_kernels.build_info()
for name in acme_kernels.KERNELS:
    kernel = getattr(acme_kernels, name)
    assert kernel.targets == tuple(info["kernels"][name]["neffs"]), name
    for variant, shapes in kernel.variants.items():
        args = [np.ones(shapes[a], dtype=DTYPES.get(t, t)) for a, t in kernel.signature]
        out = kernel(*args, mode="reference")
        outputs = out if isinstance(out, tuple) else (out,)
        print(name, variant, kernel.frontend, *(list(o.shape) for o in outputs))
"""


def test_the_runtime_runs_every_kernel_from_the_written_document(examples_bundle: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(examples_bundle), "NKIBUILD_MODE": ""}
    run = subprocess.run(
        [sys.executable, "-c", RUN_EVERY_KERNEL],
        capture_output=True,
        text=True,
        env=env,
        cwd=examples_bundle.parent,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    info = load_bundle(examples_bundle).build_info
    assert info is not None
    expected = [
        " ".join([name, variant, kernel.frontend, *(str(list(t.shape)) for t in neff.outputs)])
        for name, kernel in info.kernels.items()
        for variant, neff in kernel.neffs["trn2"].items()
    ]
    assert sorted(run.stdout.splitlines()) == sorted(expected)
    assert len(expected) == 4


# --- validation ---------------------------------------------------------------------------


def changed(document: dict[str, Any], path: str, value: Any = ...) -> dict[str, Any]:
    """A copy of `document` with the field at dotted `path` set (or removed: `...`)."""
    copied = copy.deepcopy(document)
    *parents, last = path.split(".")
    node = copied
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if value is ...:
        del node[last]
    else:
        node[last] = value
    return copied


NEFF = "kernels.scaled_add.neffs.trn2.small"


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (f"{NEFF}.sha256", ..., f"{NEFF}.sha256: missing"),
        (f"{NEFF}.lnc", "two", f"{NEFF}.lnc: expected an integer, got 'two'"),
        (f"{NEFF}.lnc", True, f"{NEFF}.lnc: expected an integer, got a boolean"),
        (f"{NEFF}.placeholder", "no", f"{NEFF}.placeholder: expected true or false, got 'no'"),
        (f"{NEFF}.outputs", {}, f"{NEFF}.outputs: expected a list, got an object"),
        (f"{NEFF}.input_names", ["x", 1], f"{NEFF}.input_names[1]: expected a string, got 1"),
        ("kernels.scaled_add.variants.small", [], "variants.small: expected an object, got a list"),
        ("kernels.scaled_add.constants", [["alpha"]], "constants[0]: expected [name, value]"),
        ("kernels.softmax.tolerance.rtol", "tight", "tolerance.rtol: expected a number or null"),
        ("kernels.softmax.reference", 3, "kernels.softmax.reference: expected an object, got 3"),
        ("neuron_sdk", 2, "neuron_sdk: expected a string or null, got 2"),
        ("requirements", None, "requirements: expected a list, got null"),
        ("format_version", FORMAT_VERSION + 1, f"format_version: {FORMAT_VERSION + 1} is not"),
        ("provenance.manifest", "x", "provenance.manifest: expected an object, got 'x'"),
        ("provenance.sources.0.sha256", ..., "provenance.sources[0].sha256: missing"),
        ("provenance.tools", {}, "provenance.tools: expected a list, got an object"),
    ],
)
def test_a_bad_field_is_named(
    document: dict[str, Any], path: str, value: Any, message: str
) -> None:
    with pytest.raises(BuildInfoError, match=r"^_build\.json: ") as raised:
        BuildInfo.from_json(changed(document, path, value))
    assert message in str(raised.value)


def test_a_document_from_before_the_format_version_reads_as_version_1(
    document: dict[str, Any],
) -> None:
    info = BuildInfo.from_json(changed(document, "format_version"))
    assert info.format_version == 1
    assert info.to_json() == document  # and writes back as version 1


def test_the_provenance_summary_records_what_the_bundle_was_built_from(
    examples_bundle: Path,
) -> None:
    import hashlib

    project = examples_bundle.parents[2]
    info = load_bundle(examples_bundle).build_info
    assert info is not None and info.provenance is not None
    summary = info.provenance

    def sha256(path: str) -> str:
        return hashlib.sha256((project / path).read_bytes()).hexdigest()

    assert summary.manifest == schema.MaterialInfo("nkibuild.yaml", sha256("nkibuild.yaml"))
    paths = ["kernels/jax_kernels.py", "kernels/reference.py", "kernels/softmax.hlo.pb"]
    assert summary.sources == tuple(schema.MaterialInfo(p, sha256(p)) for p in paths)
    tools = {tool.name: tool.version for tool in summary.tools}
    assert tools["neuronx-cc"] == "2.23.0.0+nkibuild.fake"
    assert set(tools) == {"jax", "jaxlib", "neuronx-cc"}  # the hlo kernel traces nothing


def test_a_document_from_before_provenance_reads_without_it(document: dict[str, Any]) -> None:
    info = BuildInfo.from_json(changed(document, "provenance"))
    assert info.provenance is None
    assert info.to_json() == {**document, "provenance": None}


def test_not_a_document_at_all(tmp_path: Path) -> None:
    for text, problem in [("[]", "the document: expected an object"), ("{", "not JSON")]:
        (tmp_path / FILE_NAME).write_text(text)
        with pytest.raises(BuildInfoError, match=problem) as raised:
            schema.read_build_info(tmp_path / FILE_NAME)
        assert str(raised.value).startswith(str(tmp_path / FILE_NAME))


def test_verify_names_the_wheel_and_the_field(document: dict[str, Any], tmp_path: Path) -> None:
    from nkibuild.errors import UsageError
    from nkibuild.verify import bundle_of_wheel

    wheel = tmp_path / "acme_kernels-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        broken = changed(document, "kernels.softmax.frontend", None)
        archive.writestr(f"acme_kernels/{FILE_NAME}", json.dumps(broken))
    with pytest.raises(UsageError) as raised:
        bundle_of_wheel(wheel, tmp_path / "scratch")
    assert str(raised.value) == (
        f"{wheel}: acme_kernels/_build.json: kernels.softmax.frontend: expected a string, got null"
    )
