"""nkibuild.yaml: YAML loading, schema, semantic checks, the model and the generated docs."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nkibuild import dtypes
from nkibuild.errors import Diagnostic, Location, ManifestError
from nkibuild.manifest import docgen, generate, load_manifest, yamlsource
from nkibuild.manifest.model import (
    AUTO_CAST,
    AUTO_CAST_TYPES,
    DEFAULT_SETTINGS,
    DEFAULT_TARGETS,
    FRONTENDS,
    TARGETS,
    CompileSettings,
    SourceRef,
    TensorSpec,
)
from nkibuild.manifest.schemagen import inline_ref, manifest_schema

REPO = Path(__file__).resolve().parents[1]
SCHEMA_FILE = REPO / "schemas" / "nkibuild.schema.json"

HEADER = """\
format-version: 1
package:
  name: demo
  version: "1.0"
"""


def kernel_doc(
    extra: str = "",
    *,
    frontend: str = "jax",
    source: str = "kernels/jax_kernels.py:scaled_add",
    inputs: str = "x: {shape: [4], dtype: float32}",
) -> str:
    """A one-kernel manifest; `extra` starts on line 11 (kernel keys are indented by 4)."""
    lines = [
        HEADER.rstrip("\n"),
        "kernels:",
        "  k:",
        f"    frontend: {frontend}",
        f"    source: {source}",
        "    inputs:",
        f"      {inputs}",
    ]
    return "\n".join(lines) + "\n" + (extra.rstrip("\n") + "\n" if extra else "")


def write(project: Path, text: str) -> Path:
    path = project / "nkibuild.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def problems(path: Path) -> list[Diagnostic]:
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    diagnostics = list(info.value.diagnostics)
    assert diagnostics
    for diagnostic in diagnostics:
        assert diagnostic.location is not None, diagnostic
    return diagnostics


def problem(path: Path) -> Diagnostic:
    diagnostics = problems(path)
    assert len(diagnostics) == 1, "\n".join(d.render() for d in diagnostics)
    return diagnostics[0]


def at(diagnostic: Diagnostic) -> tuple[int, int]:
    assert diagnostic.location is not None
    return diagnostic.location.line, diagnostic.location.column


# ------------------------------------------------------------------- the model


def test_example_loads_into_the_expected_model(example_project: Path) -> None:
    path = example_project / "nkibuild.yaml"
    manifest = load_manifest(path)

    assert manifest.path == path.absolute()
    assert manifest.root == example_project.absolute()
    assert manifest.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    package = manifest.package
    assert (package.name, package.version, package.import_name) == (
        "acme-kernels",
        "0.1.0",
        "acme_kernels",
    )
    assert package.description == "Example NKI-era kernels built with nkibuild"
    assert (package.license, package.requires_python) == ("Apache-2.0", ">=3.10")
    assert manifest.default_targets == ("trn1", "trn2")
    assert manifest.defaults == DEFAULT_SETTINGS
    assert [k.name for k in manifest.kernels] == ["scaled_add", "matmul_rowsum", "softmax"]

    scaled_add, matmul, softmax = manifest.kernels
    assert scaled_add.frontend == "jax"
    assert scaled_add.source == SourceRef(
        "kernels/jax_kernels.py", "scaled_add", Location(str(path), 21, 13)
    )
    assert scaled_add.reference == SourceRef(
        "kernels/reference.py", "scaled_add", Location(str(path), 22, 16)
    )
    assert scaled_add.inputs == (
        TensorSpec("x", (128, 512), "float32"),
        TensorSpec("y", (128, 512), "float32"),
    )
    assert scaled_add.constants == (("alpha", 0.5),)
    assert [(v.name, v.inputs[0].shape, v.inputs[1].shape) for v in scaled_add.variants] == [
        ("small", (128, 512), (128, 512)),
        ("large", (1024, 512), (1024, 512)),
    ]
    assert scaled_add.variants[1].location == Location(str(path), 30, 7)
    assert scaled_add.targets is None
    assert scaled_add.settings == CompileSettings()
    assert scaled_add.overrides == (("trn1", CompileSettings(optlevel=1)),)
    assert scaled_add.deps == ()
    assert scaled_add.location == Location(str(path), 19, 3)

    assert matmul.settings == CompileSettings(auto_cast="matmult", auto_cast_type="bf16")
    assert [v.name for v in matmul.variants] == ["default"]
    assert matmul.variants[0].inputs == matmul.inputs

    assert (softmax.source.path, softmax.source.function) == ("kernels/softmax.hlo.pb", None)
    assert softmax.targets == ("trn2",)
    assert softmax.constants == ()


def test_the_example_in_the_repository_loads() -> None:
    assert load_manifest(REPO / "examples" / "nkibuild.yaml").package.name == "acme-kernels"


def test_manifest_survives_pickling(example_project: Path) -> None:
    # The plan cache pickles the manifest.
    manifest = load_manifest(example_project / "nkibuild.yaml")
    assert pickle.loads(pickle.dumps(manifest)) == manifest


def test_defaults_are_filled_in(example_project: Path) -> None:
    manifest = load_manifest(write(example_project, kernel_doc()))
    assert manifest.defaults == CompileSettings(2, "none", "bf16", None, False, ())
    assert manifest.default_targets == DEFAULT_TARGETS == ("trn2",)
    assert manifest.package.import_name == "demo"
    assert manifest.package.description == ""
    assert manifest.package.license is None
    assert manifest.package.requires_python == ">=3.10"
    kernel = manifest.kernels[0]
    assert kernel.settings == CompileSettings()
    assert kernel.targets is None
    assert kernel.reference is None
    assert [(v.name, v.inputs) for v in kernel.variants] == [("default", kernel.inputs)]
    assert manifest.verify is False


def test_verify_is_a_top_level_boolean(example_project: Path) -> None:
    assert load_manifest(write(example_project, "verify: true\n" + kernel_doc())).verify is True
    found = problem(write(example_project, "verify: 1\n" + kernel_doc()))
    assert (found.message, found.json_path, at(found)) == (
        "wrong type: got a number (1)",
        "$.verify",
        (1, 9),
    )


@pytest.mark.parametrize(
    ("name", "import_name"),
    [("acme-kernels", "acme_kernels"), ("Acme.Kernels--x", "acme_kernels_x"), ("a_-.b", "a_b")],
)
def test_import_name_is_derived_from_the_name(
    example_project: Path, name: str, import_name: str
) -> None:
    text = kernel_doc().replace("name: demo", f"name: {name}")
    assert load_manifest(write(example_project, text)).package.import_name == import_name


def test_explicit_package_fields(example_project: Path) -> None:
    text = kernel_doc().replace(
        "  name: demo\n",
        "  name: demo\n  import-name: demo_pkg\n  description: D\n  license: MIT\n"
        '  requires-python: ">=3.11"\n',
    )
    package = load_manifest(write(example_project, text)).package
    assert (package.import_name, package.description, package.license) == ("demo_pkg", "D", "MIT")
    assert package.requires_python == ">=3.11"


def test_settings_layers_and_overrides_in_manifest_order(example_project: Path) -> None:
    text = kernel_doc(
        """\
    targets: [trn3, trn1, trn2]
    optlevel: 3
    lnc: auto
    fast-loading: true
    compiler-args: [--verbose, info]
    overrides:
      trn3: {lnc: 2, auto-cast: all, auto-cast-type: fp8_e4m3}
      trn1: {lnc: 1, compiler-args: []}
defaults:
  targets: [trn2]
  optlevel: 1
  auto-cast: matmult
  auto-cast-type: fp16
  lnc: 1
  fast-loading: true
  compiler-args: [-O]
"""
    )
    manifest = load_manifest(write(example_project, text))
    assert manifest.defaults == CompileSettings(1, "matmult", "fp16", 1, True, ("-O",))
    assert manifest.default_targets == ("trn2",)
    kernel = manifest.kernels[0]
    assert kernel.targets == ("trn3", "trn1", "trn2")
    assert kernel.settings == CompileSettings(
        optlevel=3, lnc=None, fast_loading=True, compiler_args=("--verbose", "info")
    )
    assert kernel.overrides == (
        ("trn3", CompileSettings(lnc=2, auto_cast="all", auto_cast_type="fp8_e4m3")),
        ("trn1", CompileSettings(lnc=1, compiler_args=())),
    )


def test_variants_resolve_to_full_inputs_in_declared_order(example_project: Path) -> None:
    text = kernel_doc(
        """\
      y: {shape: [2, 3], dtype: bfloat16}
      z: {shape: [4], dtype: int32}
    variants:
      a: {z: [1], x: [8]}
      b:
        y: {dtype: float16}
      c:
        y: {shape: [5], dtype: int8}
      d: {}
"""
    )
    kernel = load_manifest(write(example_project, text)).kernels[0]
    x, y, z = kernel.inputs
    assert z == TensorSpec("z", (4,), "int32")
    by_name = {v.name: v.inputs for v in kernel.variants}
    assert list(by_name) == ["a", "b", "c", "d"]
    assert by_name["a"] == (TensorSpec("x", (8,), "float32"), y, TensorSpec("z", (1,), "int32"))
    assert by_name["b"] == (x, TensorSpec("y", (2, 3), "float16"), z)
    assert by_name["c"] == (x, TensorSpec("y", (5,), "int8"), z)
    assert by_name["d"] == (x, y, z)


def test_constants_keep_order_and_lists_become_tuples(example_project: Path) -> None:
    text = kernel_doc(
        """\
    constants:
      n: 3
      scale: 0.5
      flag: false
      mode: fast
      tiles: [[1, 2], [3, [4]]]
      empty: []
"""
    )
    constants = load_manifest(write(example_project, text)).kernels[0].constants
    assert constants == (
        ("n", 3),
        ("scale", 0.5),
        ("flag", False),
        ("mode", "fast"),
        ("tiles", ((1, 2), (3, (4,)))),
        ("empty", ()),
    )


def test_source_paths_are_normalized(example_project: Path) -> None:
    text = kernel_doc(
        "    reference: ./kernels/../kernels//reference.py:scaled_add\n"
        "    deps: [kernels/*.py, '**/*.py']\n",
        source="./kernels/jax_kernels.py:scaled_add",
    )
    kernel = load_manifest(write(example_project, text)).kernels[0]
    assert str(kernel.source) == "kernels/jax_kernels.py:scaled_add"
    assert str(kernel.reference) == "kernels/reference.py:scaled_add"
    assert kernel.deps == ("kernels/*.py", "**/*.py")


def test_a_symlink_inside_the_project_is_fine(example_project: Path) -> None:
    (example_project / "kernels" / "alias.py").symlink_to("jax_kernels.py")
    text = kernel_doc(source="kernels/alias.py:scaled_add")
    assert load_manifest(write(example_project, text)).kernels[0].source.path == "kernels/alias.py"


def test_yaml_extras_anchors_merge_keys_and_dates(example_project: Path) -> None:
    text = kernel_doc(
        """\
      y: &tensor {shape: [4], dtype: float32}
      z: {<<: *tensor, dtype: int8}
    constants:
      when: 2024-01-01
      eq: =
      hexa: 0x10
""",
    )
    kernel = load_manifest(write(example_project, text)).kernels[0]
    assert kernel.inputs[1:] == (TensorSpec("y", (4,), "float32"), TensorSpec("z", (4,), "int8"))
    assert kernel.constants == (("when", "2024-01-01"), ("eq", "="), ("hexa", 16))


# ------------------------------------------------------------------ the schema


def test_schema_is_valid_draft_2020_12() -> None:
    from jsonschema import Draft202012Validator

    schema = json.loads(SCHEMA_FILE.read_text())
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"] and schema["title"] and schema["description"]


def test_packaged_schema_is_a_relative_symlink_to_the_source() -> None:
    link = REPO / "nkibuild" / "manifest" / "nkibuild.schema.json"
    assert link.is_symlink()
    assert os.readlink(link) == "../../schemas/nkibuild.schema.json"
    assert manifest_schema() == json.loads(SCHEMA_FILE.read_text())


def test_shipped_schema_is_the_one_generated_from_the_model() -> None:
    actual = SCHEMA_FILE.read_text(encoding="utf-8")
    assert actual == generate.schema_text(), "run: python -m nkibuild.manifest.generate"


def test_generate_check_reports_nothing_stale(capsys: pytest.CaptureFixture[str]) -> None:
    assert generate.main(["--check"]) == 0, capsys.readouterr().out


def test_defaults_come_from_the_documented_defaults() -> None:
    # One source: the model's documented defaults are what an absent key means.
    from nkibuild.manifest.keys import effective_defaults

    assert effective_defaults(CompileSettings) == DEFAULT_SETTINGS
    assert CompileSettings(2, "none", "bf16", None, False, ()) == DEFAULT_SETTINGS


def test_every_model_key_is_in_the_schema() -> None:
    # The schema is generated, so this guards the generator: no YAML key is dropped.
    from nkibuild.manifest.keys import keyed_fields
    from nkibuild.manifest.model import Kernel, Manifest, Package

    defs = manifest_schema()["$defs"]
    expected = {
        "root": [i.name for _, i in keyed_fields(Manifest) if i.section is None],
        "package": [i.name for _, i in keyed_fields(Package)],
        "kernel": [i.name for _, i in keyed_fields(Kernel) if not i.inline],
        "compileSettings": [i.name for _, i in keyed_fields(CompileSettings)],
    }
    found = {
        "root": [k for k in manifest_schema()["properties"] if k not in ("defaults", "compiler")],
        "package": list(defs["package"]["properties"]),
        "kernel": list(defs["kernel"]["properties"]),
        "compileSettings": list(defs["compileSettings"]["properties"]),
    }
    assert found == expected


def _objects(node: Any, path: str = "#") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema in the document that declares properties, with its JSON pointer."""
    if isinstance(node, dict):
        if "properties" in node:
            yield path, node
        for key, sub in node.items():
            yield from _objects(sub, f"{path}/{key}")
    elif isinstance(node, list):
        for index, sub in enumerate(node):
            yield from _objects(sub, f"{path}/{index}")


def test_every_property_has_a_title_and_description() -> None:
    properties = [
        (f"{path}/{key}", sub)
        for path, node in _objects(manifest_schema())
        for key, sub in node["properties"].items()
    ]
    assert len(properties) >= 25
    for path, schema in properties:
        assert schema.get("title") and schema.get("description"), path


def test_every_object_rejects_unknown_keys() -> None:
    for path, schema in _objects(manifest_schema()):
        if path == "#/$defs/compileSettings":
            continue  # a mixin: closed where it is used
        closed = schema.get("additionalProperties") is False
        assert closed or schema.get("unevaluatedProperties") is False, path


def test_schema_enums_and_defaults_match_the_code() -> None:
    defs = manifest_schema()["$defs"]
    settings = defs["compileSettings"]["properties"]
    assert tuple(defs["target"]["enum"]) == TARGETS
    assert tuple(defs["kernel"]["properties"]["frontend"]["enum"]) == FRONTENDS
    assert tuple(settings["auto-cast"]["enum"]) == AUTO_CAST
    assert tuple(settings["auto-cast-type"]["enum"]) == AUTO_CAST_TYPES
    assert tuple(defs["dtype"]["enum"]) == dtypes.NAMES
    assert tuple(defs["defaults"]["properties"]["targets"]["default"]) == DEFAULT_TARGETS
    documented = {key.replace("-", "_"): value.get("default") for key, value in settings.items()}
    filled = {**vars(DEFAULT_SETTINGS), "lnc": "auto", "compiler_args": []}
    assert documented == filled


# ---------------------------------------------------------- schema violations

SCHEMA_CASES = [
    # (id, manifest, (line, column), message, json_path, expected, hint)
    pytest.param(
        kernel_doc().replace("format-version: 1", "format-version: 2"),
        (1, 17), "unsupported value 2", "$.format-version", "exactly 1", None,
        id="format-version",
    ),
    pytest.param(
        kernel_doc().replace('version: "1.0"', "version: 0.1"),
        (4, 12), "wrong type: got a number (0.1)", "$.package.version", "string", "quote it",
        id="version-as-float",
    ),
    pytest.param(
        kernel_doc().replace("  name: demo\n", "  name: demo\n  licence: MIT\n"),
        (4, 3), "unknown key 'licence'", "$.package.licence", "license", "did you mean 'license'?",
        id="unknown-package-key",
    ),
    pytest.param(
        kernel_doc().replace('  version: "1.0"\n', ""),
        (3, 3), "missing required key 'version'", "$.package", "string", None,
        id="missing-version",
    ),
    pytest.param(
        HEADER,
        (1, 1), "missing required key 'kernels'", "$", "a mapping", None,
        id="missing-kernels",
    ),
    pytest.param(
        HEADER + "kernels: {}\n",
        (5, 10), "empty mapping", "$.kernels", "a mapping", None,
        id="no-kernels",
    ),
    pytest.param(
        kernel_doc("    optlvl: 1\n"),
        (11, 5), "unknown key 'optlvl'", "$.kernels.k.optlvl", "optlevel",
        "did you mean 'optlevel'?",
        id="unknown-kernel-key",
    ),
    pytest.param(
        kernel_doc("    auto_cast: all\n"),
        (11, 5), "unknown key 'auto_cast'", "$.kernels.k.auto_cast", "auto-cast",
        "did you mean 'auto-cast'?",
        id="snake-case-key",
    ),
    pytest.param(
        kernel_doc("    targets: [trn1, trn4]\n"),
        (11, 21), "invalid value 'trn4'", "$.kernels.k.targets[1]", "one of trn1, trn2, trn3",
        "did you mean",
        id="unknown-target",
    ),
    pytest.param(
        kernel_doc("    targets: [trn1, trn1]\n"),
        (11, 14), "'trn1' is listed twice", "$.kernels.k.targets", "unique", None,
        id="duplicate-target",
    ),
    pytest.param(
        kernel_doc("    targets: []\n"),
        (11, 14), "empty list", "$.kernels.k.targets", "a non-empty list", None,
        id="no-targets",
    ),
    pytest.param(
        kernel_doc("    optlevel: 2.0\n"),
        (11, 15), "wrong type: got a number (2.0)", "$.kernels.k.optlevel", "one of 1, 2, 3", None,
        id="float-optlevel",
    ),
    pytest.param(
        kernel_doc("    optlevel: true\n"),
        (11, 15), "invalid value true", "$.kernels.k.optlevel", "one of 1, 2, 3", None,
        id="bool-optlevel",
    ),
    pytest.param(
        kernel_doc('    lnc: "2"\n'),
        (11, 10), "invalid value '2'", "$.kernels.k.lnc", "one of auto, 1, 2",
        "write the number without quotes",
        id="quoted-lnc",
    ),
    pytest.param(
        kernel_doc("    fast-loading: yes please\n"),
        (11, 19), "wrong type", "$.kernels.k.fast-loading", "a boolean", None,
        id="fast-loading",
    ),
    pytest.param(
        kernel_doc("    compiler-args: --verbose\n"),
        (11, 20), "wrong type", "$.kernels.k.compiler-args", "a list, each a string", None,
        id="compiler-args-not-a-list",
    ),
    pytest.param(
        kernel_doc(frontend="jaxx"),
        (7, 15), "invalid value 'jaxx'", "$.kernels.k.frontend", "one of nki, nkipy, jax, hlo",
        "did you mean 'jax'?",
        id="frontend",
    ),
    pytest.param(
        kernel_doc(inputs="x: {shape: [4, 0], dtype: float32}"),
        (10, 22), "0 is too small", "$.kernels.k.inputs.x.shape[1]", "an integer >= 1", None,
        id="zero-dimension",
    ),
    pytest.param(
        kernel_doc(inputs="x: {shape: [-1.5], dtype: float32}"),
        (10, 19), "wrong type: got a number (-1.5)", "$.kernels.k.inputs.x.shape[0]",
        "an integer >= 1", None,
        id="float-dimension",
    ),
    pytest.param(
        kernel_doc(inputs="x: {shape: [4], dtype: float33}"),
        (10, 30), "invalid value 'float33'", "$.kernels.k.inputs.x.dtype", "bfloat16",
        "did you mean 'float32'?",
        id="unknown-dtype",
    ),
    pytest.param(
        kernel_doc(inputs="x: {shape: [4]}"),
        (10, 10), "missing required key 'dtype'", "$.kernels.k.inputs.x", "one of bool", None,
        id="missing-dtype",
    ),
    pytest.param(
        kernel_doc(inputs="2x: {shape: [4], dtype: float32}"),
        (10, 7), "invalid name '2x'", "$.kernels.k.inputs['2x']", "[A-Za-z_]", None,
        id="input-name",
    ),
    pytest.param(
        kernel_doc(inputs="ñ: {shape: [4], dtype: float32}"),
        (10, 7), "invalid name 'ñ'", "$.kernels.k.inputs['ñ']", "[A-Za-z_]", None,
        id="non-ascii-name",
    ),
    pytest.param(
        kernel_doc(inputs=f"{'x' * 65}: {{shape: [4], dtype: float32}}"),
        (10, 7), "invalid name", f"$.kernels.k.inputs.{'x' * 65}", "at most 64 characters", None,
        id="long-name",
    ),
    pytest.param(
        kernel_doc("    variants:\n      v: {x: oops}\n"),
        (12, 14), "wrong type: got a string ('oops')", "$.kernels.k.variants.v.x",
        "a list (shape) or a mapping (tensor change)", None,
        id="variant-entry-type",
    ),
    pytest.param(
        kernel_doc("    variants:\n      v: {x: [4, 0]}\n"),
        (12, 18), "0 is too small", "$.kernels.k.variants.v.x[1]", "an integer >= 1", None,
        id="variant-shape",
    ),
    pytest.param(
        kernel_doc("    variants:\n      v: {x: {shape: [4], dtyp: int8}}\n"),
        (12, 27), "unknown key 'dtyp'", "$.kernels.k.variants.v.x.dtyp", "shape, dtype",
        "did you mean 'dtype'?",
        id="variant-unknown-key",
    ),
    pytest.param(
        kernel_doc("    overrides:\n      trn5: {optlevel: 1}\n"),
        (12, 7), "invalid name 'trn5'", "$.kernels.k.overrides.trn5", "one of trn1, trn2, trn3",
        "did you mean",
        id="override-target",
    ),
    pytest.param(
        kernel_doc("    overrides:\n      trn2: {targets: [trn2]}\n"),
        (12, 14), "unknown key 'targets'", "$.kernels.k.overrides.trn2.targets", "optlevel", None,
        id="targets-in-override",
    ),
    pytest.param(
        kernel_doc("    constants:\n      c: {a: 1}\n"),
        (12, 10), "wrong type: got a mapping", "$.kernels.k.constants.c", "list of such values",
        None,
        id="constant-mapping",
    ),
    pytest.param(
        kernel_doc("    constants:\n      c: [1, null]\n"),
        (12, 14), "wrong type: got a null", "$.kernels.k.constants.c[1]", "a number", None,
        id="constant-null-item",
    ),
    pytest.param(
        kernel_doc("    deps: kernels/*.py\n"),
        (11, 11), "wrong type", "$.kernels.k.deps", "a list", None,
        id="deps-not-a-list",
    ),
    pytest.param(
        kernel_doc(source="''"),
        (8, 13), "empty string", "$.kernels.k.source", "a non-empty string", None,
        id="empty-source",
    ),
    pytest.param(
        "- format-version: 1\n",
        (1, 1), "wrong type: got a list", "$", "a mapping", None,
        id="top-level-list",
    ),
    pytest.param(
        "just a string\n",
        (1, 1), "wrong type: got a string ('just a string')", "$", "a mapping", None,
        id="top-level-scalar",
    ),
    pytest.param(
        "---\n",
        (2, 1), "wrong type: got a null", "$", "a mapping", None,
        id="top-level-null",
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "position", "message", "json_path", "expected", "hint"), SCHEMA_CASES
)
def test_schema_violations(
    example_project: Path,
    text: str,
    position: tuple[int, int],
    message: str,
    json_path: str,
    expected: str,
    hint: str | None,
) -> None:
    diagnostic = problem(write(example_project, text))
    assert at(diagnostic) == position, diagnostic.render()
    assert message in diagnostic.message
    assert diagnostic.json_path == json_path
    assert expected in (diagnostic.expected or "")
    if hint is None:
        assert diagnostic.hint is None, diagnostic.hint
    else:
        assert hint in (diagnostic.hint or ""), diagnostic.hint


def test_all_schema_errors_are_reported_at_once_in_document_order(example_project: Path) -> None:
    text = """\
        format-version: 2
        package:
          name: demo
          version: 1.0
          licence: MIT
        defaults:
          optlevel: 9
        kernels:
          k:
            frontend: jaxx
            source: kernels/jax_kernels.py:scaled_add
            inputs:
              x: {shape: [0], dtype: f32}
          j:
            source: x.py:f
        """
    diagnostics = problems(write(example_project, text))
    assert [(at(d), d.json_path) for d in diagnostics] == [
        ((1, 17), "$.format-version"),
        ((4, 12), "$.package.version"),
        ((5, 3), "$.package.licence"),
        ((7, 13), "$.defaults.optlevel"),
        ((10, 15), "$.kernels.k.frontend"),
        ((13, 19), "$.kernels.k.inputs.x.shape[0]"),
        ((13, 30), "$.kernels.k.inputs.x.dtype"),
        ((15, 5), "$.kernels.j"),
        ((15, 5), "$.kernels.j"),
    ]
    assert {d.message for d in diagnostics[-2:]} == {
        "missing required key 'frontend'",
        "missing required key 'inputs'",
    }
    rendered = ManifestError(diagnostics).render()
    assert rendered.startswith("9 problems in the manifest")
    assert "nkibuild.yaml:4:12: error: wrong type" in rendered


def test_semantic_checks_run_beside_schema_errors(example_project: Path) -> None:
    # A missing source file is reported in the same run as the kernel's bad optlevel.
    text = kernel_doc("    optlevel: 7\n", source="kernels/missing.py:f")
    diagnostics = problems(write(example_project, text))
    assert [(d.json_path, d.message) for d in diagnostics] == [
        ("$.kernels.k.source", "'kernels/missing.py' does not exist"),
        ("$.kernels.k.optlevel", "invalid value 7"),
    ]


# -------------------------------------------------------------- semantic checks

SEMANTIC_CASES = [
    # (manifest, (line, column), message, hint)
    pytest.param(
        kernel_doc(inputs="class: {shape: [4], dtype: float32}"),
        (10, 7), "'class' is a Python keyword", None,
        id="keyword-input",
    ),
    pytest.param(
        kernel_doc().replace("  k:", "  lambda:"),
        (6, 3), "'lambda' is a Python keyword", None,
        id="keyword-kernel",
    ),
    pytest.param(
        kernel_doc("    constants: {None: 1}\n"),
        (11, 17), "'None' is a Python keyword", None,
        id="keyword-constant",
    ),
    pytest.param(
        kernel_doc("    variants: {for: {}}\n"),
        (11, 16), "'for' is a Python keyword", None,
        id="keyword-variant",
    ),
    pytest.param(
        kernel_doc(inputs="__x: {shape: [4], dtype: float32}"),
        (10, 7), "'__x' starts with '__'", None,
        id="dunder-name",
    ),
    pytest.param(
        kernel_doc(inputs='"x\\n": {shape: [4], dtype: float32}'),
        (10, 7), "is not an ASCII Python identifier", None,
        id="name-with-newline",
    ),
    pytest.param(
        kernel_doc().replace("  name: demo\n", "  name: demo\n  import-name: import\n"),
        (4, 16), "'import' is a Python keyword", None,
        id="import-name-keyword",
    ),
    pytest.param(
        kernel_doc().replace("name: demo", "name: 1-kernels"),
        (3, 9), "gives the import name '1_kernels'", "set package.import-name",
        id="derived-import-name",
    ),
    pytest.param(
        kernel_doc().replace("name: demo", 'name: "demo\\n"'),
        (3, 9), "invalid distribution name", None,
        id="distribution-name-newline",
    ),
    pytest.param(
        kernel_doc().replace('version: "1.0"', "version: one.two"),
        (4, 12), "invalid version 'one.two'", None,
        id="pep440-version",
    ),
    pytest.param(
        kernel_doc().replace('  version: "1.0"\n', '  version: "1.0"\n  requires-python: ">>3"\n'),
        (5, 20), "invalid version specifier '>>3'", None,
        id="requires-python",
    ),
    pytest.param(
        kernel_doc("    targets: [trn1, trn2]\n    lnc: 2\n"),
        (12, 10), "lnc 2 on trn1 (for kernel 'k')", "NCC_EARG001",
        id="lnc2-kernel",
    ),
    pytest.param(
        kernel_doc("    targets: [trn1]\n    overrides:\n      trn1: {lnc: 2}\n"),
        (13, 19), "lnc 2 on trn1", "overrides.trn1",
        id="lnc2-override",
    ),
    pytest.param(
        kernel_doc(
            "    lnc: 2\n    overrides:\n      trn1: {lnc: auto}\ndefaults:\n  targets: [trn1]\n"
        ),
        (11, 10), "lnc 2 on trn1", "trn1 supports only lnc 1",
        id="lnc-auto-override-inherits",
    ),
    pytest.param(
        kernel_doc("    overrides:\n      trn1: {optlevel: 1}\n"),
        (12, 7), "override for trn1, which kernel 'k' does not target",
        "add trn1 to the targets",
        id="override-not-a-target",
    ),
    pytest.param(
        kernel_doc("    variants:\n      v: {xx: [2]}\n"),
        (12, 11), "variant 'v' names 'xx', not an input", "did you mean 'x'?",
        id="variant-unknown-input",
    ),
    pytest.param(
        kernel_doc("    constants: {x: 1}\n"),
        (11, 17), "constant 'x' has the name of an input", "rename one",
        id="constant-shadows-input",
    ),
    pytest.param(
        kernel_doc("    constants: {a: 1}\n", frontend="hlo", source="kernels/softmax.hlo.pb"),
        (11, 5), "the hlo frontend takes no constants", None,
        id="hlo-constants",
    ),
    pytest.param(
        kernel_doc("    variants: {v: {}}\n", frontend="hlo", source="kernels/softmax.hlo.pb"),
        (11, 5), "the hlo frontend takes no variants", "one kernel per shape",
        id="hlo-variants",
    ),
    pytest.param(
        kernel_doc(frontend="hlo", source="kernels/softmax.hlo.pb:f"),
        (8, 13), "names a function, but hlo sources are files", None,
        id="hlo-function",
    ),
    pytest.param(
        kernel_doc(source="kernels/jax_kernels.py"),
        (8, 13), "names no function", None,
        id="no-function",
    ),
    pytest.param(
        kernel_doc(source="kernels/jax_kernels.py:1f"),
        (8, 13), "'1f' is not an ASCII Python identifier", None,
        id="function-not-identifier",
    ),
    pytest.param(
        kernel_doc(source="kernels/jax_kernels.py:def"),
        (8, 13), "'def' is a Python keyword", None,
        id="function-keyword",
    ),
    pytest.param(
        kernel_doc(source="kernels/jax_kernel.py:scaled_add"),
        (8, 13), "'kernels/jax_kernel.py' does not exist", "did you mean 'kernels/jax_kernels.py'?",
        id="missing-source",
    ),
    pytest.param(
        kernel_doc(source="kernels/softmax.hlo.pb:f"),
        (8, 13), "is not a Python file", ".py",
        id="python-source-not-py",
    ),
    pytest.param(
        kernel_doc(source="/abs/k.py:f"),
        (8, 13), "'/abs/k.py' is absolute", "relative to the directory",
        id="absolute-source",
    ),
    pytest.param(
        kernel_doc(source="C:/k.py:f"),
        (8, 13), "is absolute", None,
        id="windows-drive-source",
    ),
    pytest.param(
        kernel_doc(source="kernels/../../k.py:f"),
        (8, 13), "points outside the manifest's directory", None,
        id="dotdot-source",
    ),
    pytest.param(
        kernel_doc(source="kernels\\jax_kernels.py:scaled_add"),
        (8, 13), "use '/' as the separator", None,
        id="backslash-source",
    ),
    pytest.param(
        kernel_doc(source="dir.py:f"),
        (8, 13), "'dir.py' is not a file", None,
        id="directory-source",
    ),
    pytest.param(
        kernel_doc(source="kernels/evil.py:f"),
        (8, 13), "leads outside the manifest's directory through a symlink", None,
        id="symlink-escape",
    ),
    pytest.param(
        kernel_doc(source="kernels/loop.py:f"),
        (8, 13), "cannot access 'kernels/loop.py'", None,
        id="symlink-loop",
    ),
    pytest.param(
        kernel_doc("    reference: kernels/softmax.hlo.pb:softmax\n"),
        (11, 16), "is not a Python file", None,
        id="reference-not-py",
    ),
    pytest.param(
        kernel_doc("    reference: kernels/reference.py\n"),
        (11, 16), "names no function", None,
        id="reference-without-function",
    ),
    pytest.param(
        kernel_doc("    deps: [kernels/*.py, /usr/lib/*.py]\n"),
        (11, 26), "'/usr/lib/*.py' is absolute", None,
        id="absolute-dep",
    ),
    pytest.param(
        kernel_doc("    deps: [kernels/../kernels/*.py]\n"),
        (11, 12), "contains '..'", None,
        id="dotdot-dep",
    ),
    pytest.param(
        kernel_doc("    deps: ['kernels\\\\*.py']\n"),
        (11, 12), "use '/' as the separator", None,
        id="backslash-dep",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("text", "position", "message", "hint"), SEMANTIC_CASES)
def test_semantic_checks(
    example_project: Path,
    tmp_path: Path,
    text: str,
    position: tuple[int, int],
    message: str,
    hint: str | None,
) -> None:
    (example_project / "dir.py").mkdir()
    outside = tmp_path / "outside.py"
    outside.write_text("def f(): pass\n")
    (example_project / "kernels" / "evil.py").symlink_to(outside)
    (example_project / "kernels" / "loop.py").symlink_to("loop.py")
    diagnostic = problem(write(example_project, text))
    assert at(diagnostic) == position, diagnostic.render()
    assert message in diagnostic.message, diagnostic.render()
    assert diagnostic.json_path and diagnostic.json_path.startswith("$.")
    if hint is not None:
        assert hint in (diagnostic.hint or ""), diagnostic.render()


def test_lnc2_in_defaults_is_reported_once_for_all_trn1_kernels(example_project: Path) -> None:
    text = """\
        format-version: 1
        package: {name: demo, version: "1"}
        defaults:
          targets: [trn1, trn2]
          lnc: 2
        kernels:
          a:
            frontend: jax
            source: kernels/jax_kernels.py:scaled_add
            inputs: {x: {shape: [1], dtype: float32}}
          b:
            frontend: jax
            source: kernels/jax_kernels.py:scaled_add
            inputs: {x: {shape: [1], dtype: float32}}
          only_trn2:
            frontend: jax
            source: kernels/jax_kernels.py:scaled_add
            inputs: {x: {shape: [1], dtype: float32}}
            targets: [trn2]
          fixed:
            frontend: jax
            source: kernels/jax_kernels.py:scaled_add
            inputs: {x: {shape: [1], dtype: float32}}
            overrides: {trn1: {lnc: 1}}
        """
    diagnostic = problem(write(example_project, text))
    assert at(diagnostic) == (5, 8)
    assert diagnostic.message == "lnc 2 on trn1 (for kernels 'a', 'b')"


@pytest.mark.parametrize(
    "extra",
    [
        "    targets: [trn2, trn3]\n    lnc: 2\n",
        "    targets: [trn1, trn2]\n    overrides:\n      trn2: {lnc: 2}\n      trn1: {lnc: 1}\n",
        "    targets: [trn1]\n    lnc: 2\n    overrides:\n      trn1: {lnc: 1}\n",
    ],
)
def test_lnc2_is_fine_where_trn1_does_not_get_it(example_project: Path, extra: str) -> None:
    load_manifest(write(example_project, kernel_doc(extra)))


def test_all_semantic_problems_are_reported_at_once(example_project: Path) -> None:
    text = kernel_doc(
        "    constants: {x: 1}\n    reference: nope.py:f\n",
        inputs="class: {shape: [4], dtype: float32}",
        source="kernels/jax_kernels.py",
    )
    diagnostics = problems(write(example_project, text))
    assert [at(d) for d in diagnostics] == [(8, 13), (10, 7), (12, 16)]


# ------------------------------------------------------------------------ YAML


def test_duplicate_keys_name_both_positions(example_project: Path) -> None:
    text = kernel_doc("    frontend: nki\n")
    diagnostic = problem(write(example_project, text))
    assert at(diagnostic) == (11, 5)
    assert diagnostic.message == "duplicate key 'frontend' (first at line 7, column 5)"
    assert diagnostic.json_path == "$.kernels.k.frontend"


def test_yaml_problems_are_all_reported(example_project: Path) -> None:
    text = "a: 1\nb: !!binary aGk=\na: 2\n1: x\non: y\nc: !custom [1]\n"
    diagnostics = problems(write(example_project, text))
    assert [at(d) for d in diagnostics] == [(2, 4), (3, 1), (4, 1), (5, 1), (6, 4)]
    assert "not allowed" in diagnostics[0].message
    assert "keys must be plain strings" in diagnostics[2].message
    assert "quote it" in (diagnostics[3].hint or "")


def test_python_tags_are_refused_not_executed(example_project: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    text = f"a: !!python/object/apply:os.system ['touch {marker}']\n"
    diagnostic = problem(write(example_project, text))
    assert "is not allowed" in diagnostic.message
    assert not marker.exists()


def test_anchor_bomb_is_stopped(example_project: Path) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
    diagnostic = problem(write(example_project, "\n".join(lines) + "\n"))
    assert "expands to more than 100000 values" in diagnostic.message
    assert diagnostic.location is not None and diagnostic.location.line >= 1


def test_recursive_alias_is_refused(example_project: Path) -> None:
    diagnostic = problem(write(example_project, "a: &a [1, *a]\n"))
    assert "refers to a value that contains it" in diagnostic.message
    assert at(diagnostic) == (1, 11)


def test_deep_nesting_is_refused(example_project: Path) -> None:
    diagnostic = problem(write(example_project, "a: " + "[" * 200 + "]" * 200 + "\n"))
    assert "nesting deeper than" in diagnostic.message


def test_nesting_through_aliases_is_refused(example_project: Path) -> None:
    lines = ["a0: &a0 [1]"] + [f"a{i}: &a{i} [*a{i - 1}]" for i in range(1, 40)]
    diagnostic = problem(write(example_project, "\n".join(lines) + "\n"))
    assert "nesting deeper than" in diagnostic.message


def test_huge_file_is_refused(example_project: Path) -> None:
    path = example_project / "nkibuild.yaml"
    path.write_text("# padding\n" * (yamlsource.MAX_BYTES // 10 + 1))
    diagnostic = problem(path)
    assert f"more than the {yamlsource.MAX_BYTES} allowed" in diagnostic.message
    assert at(diagnostic) == (1, 1)


@pytest.mark.parametrize(
    ("text", "position", "message"),
    [
        ("format-version: 1\npackage: [a\n", (3, 1), "expected ',' or ']'"),
        ("a: b: c\n", (1, 5), "mapping values are not allowed here"),
        ("a:\n\t- b\n", (2, 1), "'\\t'"),
        ("a: *nope\n", (1, 4), "undefined alias"),
        ("a: &x 1\nb: &x 2\n", (2, 4), "duplicate anchor"),
        ("a: 1\n---\nb: 2\n", (2, 1), "a second YAML document starts here"),
        ("a: \x07\n", (1, 4), "U+0007"),
        ("a: 1\nb: \xff\n".encode("latin-1").decode("utf-8", "surrogateescape"), (2, 4), "UTF-8"),
    ],
)
def test_syntax_errors_have_positions(
    example_project: Path, text: str, position: tuple[int, int], message: str
) -> None:
    path = example_project / "nkibuild.yaml"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    diagnostic = problem(path)
    assert at(diagnostic) == position, diagnostic.render()
    assert message in diagnostic.message + (diagnostic.hint or "")
    assert "Traceback" not in diagnostic.render()


@pytest.mark.parametrize("text", ["", "\n\n", "# nothing yet\n"])
def test_empty_manifest(example_project: Path, text: str) -> None:
    diagnostic = problem(write(example_project, text) if text else _empty(example_project))
    assert diagnostic.message == "the manifest is empty"


def _empty(project: Path) -> Path:
    path = project / "nkibuild.yaml"
    path.write_bytes(b"")
    return path


def test_huge_integer_is_a_diagnostic(example_project: Path) -> None:
    diagnostic = problem(write(example_project, "a: 1" + "0" * 5000 + "\n"))
    assert "cannot read" in diagnostic.message
    assert at(diagnostic) == (1, 4)


def test_error_inside_an_alias_points_at_the_alias(example_project: Path) -> None:
    text = (
        kernel_doc(inputs="x: {shape: &s [4], dtype: float32}")
        + "      y: {shape: [4], dtype: *s}\n"
    )
    diagnostic = problem(write(example_project, text))
    assert diagnostic.json_path == "$.kernels.k.inputs.y.dtype"
    assert at(diagnostic) == (11, 30)


def test_missing_manifest(tmp_path: Path) -> None:
    diagnostic = problem(tmp_path / "nkibuild.yaml")
    assert diagnostic.message.startswith("cannot read the manifest")


def test_directory_instead_of_manifest(tmp_path: Path) -> None:
    assert problem(tmp_path).message.startswith("cannot read the manifest")


# ------------------------------------------------------------------------ docs


def test_docs_are_generated_from_the_schema() -> None:
    example = (REPO / "examples" / "nkibuild.yaml").read_text(encoding="utf-8")
    expected = docgen.render(manifest_schema(), example)
    actual = (REPO / "docs" / "manifest.md").read_text(encoding="utf-8")
    assert actual == expected, "run: python -m nkibuild.manifest.generate"


def test_docs_cover_every_key_with_a_description() -> None:
    entries = list(docgen._entries(manifest_schema(), "", docgen._shared_defs(manifest_schema())))
    paths = {entry.path for entry in entries}
    assert {
        "format-version",
        "package.import-name",
        "defaults.targets",
        "kernels.<kernel>.inputs.<input>.shape",
        "kernels.<kernel>.variants.<variant>.<input>.dtype",
        "kernels.<kernel>.overrides.<target>",
        "kernels.<kernel>.deps",
    } <= paths
    for entry in entries:
        assert inline_ref(entry.schema).get("description"), entry.path
    text = (REPO / "docs" / "manifest.md").read_text(encoding="utf-8")
    for key in manifest_schema()["$defs"]["compileSettings"]["properties"]:
        assert f"### `{key}`" in text


@pytest.mark.parametrize(
    ("kernel", "inputs", "message", "position"),
    [
        ("build_info", "x: {shape: [4], dtype: float32}", "name 'build_info' is reserved", (6, 3)),
        ("reference", "x: {shape: [4], dtype: float32}", "name 'reference' is reserved", (6, 3)),
        ("_hidden", "x: {shape: [4], dtype: float32}", "name '_hidden' is reserved", (6, 3)),
        ("k", "mode: {shape: [4], dtype: float32}", "'mode' is reserved", (10, 7)),
    ],
)
def test_names_the_generated_bundle_uses_are_refused(
    example_project: Path, kernel: str, inputs: str, message: str, position: tuple[int, int]
) -> None:
    text = kernel_doc(inputs=inputs).replace("\n  k:\n", f"\n  {kernel}:\n")
    (diagnostic,) = problems(write(example_project, text))
    assert message in diagnostic.message
    assert diagnostic.location is not None
    assert (diagnostic.location.line, diagnostic.location.column) == position


def test_nkipy_64_bit_inputs_are_refused_with_the_dtype_it_traces(tmp_path: Path) -> None:
    # The real nkipy traces float64 as float32 and int64 as int32 (../shared/testdata).
    (tmp_path / "k.py").write_text("def f(x, n, y):\n    return x\n")
    path = tmp_path / "nkibuild.yaml"
    path.write_text(
        "format-version: 1\npackage: {name: n64, version: 1.0.0}\nkernels:\n  k:\n"
        "    frontend: nkipy\n    source: k.py:f\n    inputs:\n"
        "      x: {shape: [4], dtype: float64}\n      n: {shape: [4], dtype: int64}\n"
        "      y: {shape: [4], dtype: float32}\n"
    )
    found = problems(path)
    assert [(d.message, d.json_path, at(d)) for d in found] == [
        ("nkipy traces float64 inputs as float32", "$.kernels.k.inputs.x.dtype", (8, 30)),
        ("nkipy traces int64 inputs as int32", "$.kernels.k.inputs.n.dtype", (9, 30)),
    ]
    path.write_text(path.read_text().replace("nkipy", "jax"))  # jax keeps 64-bit types
    assert load_manifest(path).kernels[0].inputs[0].dtype == "float64"
