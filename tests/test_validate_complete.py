"""validate reports every problem in one run; a function the source file does not define
is a manifest error (found with `ast`, nothing imported); declared inputs that no variant
takes get a warning (issue 16)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from conftest import run_nkibuild

from nkibuild.cli.scaffold import scaffold
from nkibuild.errors import Diagnostic, ManifestError
from nkibuild.manifest import load_manifest
from nkibuild.manifest.advice import manifest_warnings
from nkibuild.manifest.pysource import module_names


def problems(path: Path) -> list[Diagnostic]:
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    return list(info.value.diagnostics)


def listed(diagnostics: list[Diagnostic]) -> list[tuple[str, str, str | None]]:
    """(file:line:col, message, hint) of each diagnostic."""
    return [(str(d.location), d.message, d.hint) for d in diagnostics]


def edit(path: Path, *replacements: tuple[str, str]) -> None:
    text = path.read_text()
    for old, new in replacements:
        assert old in text, old
        text = text.replace(old, new, 1)
    path.write_text(text)


def init_project(root: Path) -> Path:
    """`nkibuild init`'s project (a JAX kernel with two variants and a reference)."""
    root.mkdir()
    scaffold(root)
    return root


# --------------------------------------------------------- item 1: all at once


def break_six_ways(project: Path) -> None:
    """Three mistakes the schema sees and three only the semantic checks see."""
    edit(
        project / "nkibuild.yaml",
        ("  version: 0.1.0\n", "  version: 0.1.0\n  licence: MIT\n"),
        ("  targets: [trn1, trn2]\n", "  targets: [trn1, trn2]\n  optlevel: 7\n  lnc: 2\n"),
        ("kernels.py:scaled_add", "kernels.py:scaled_ad"),
        ("reference: kernels/reference.py", "reference: kernels/refrence.py"),
        ("    constants:\n", "    auto-cast: sometimes\n    constants:\n"),
        ("large: {x: [1024, 512], y:", "large: {x: [1024, 512], z:"),
    )


def test_schema_and_semantic_problems_are_reported_in_one_run(tmp_path: Path) -> None:
    project = init_project(tmp_path / "demo")
    break_six_ways(project)
    file = str(project / "nkibuild.yaml")
    assert listed(problems(project / "nkibuild.yaml")) == [
        (f"{file}:7:3", "unknown key 'licence'", "did you mean 'license'?"),
        (f"{file}:12:13", "invalid value 7", None),
        (
            f"{file}:13:8",
            "lnc 2 on trn1 (for kernel 'scaled_add')",
            "trn1 supports only lnc 1 (neuronx-cc refuses lnc 2 there with NCC_EARG001): "
            "set lnc: 1 under overrides.trn1, or lnc: 2 only under overrides of trn2/trn3",
        ),
        (
            f"{file}:18:13",
            "'kernels/kernels.py' defines no 'scaled_ad'",
            "did you mean 'scaled_add'?",
        ),
        (
            f"{file}:19:16",
            "'kernels/refrence.py' does not exist",
            "did you mean 'kernels/reference.py'?",
        ),
        (f"{file}:23:16", "invalid value 'sometimes'", None),
        (
            f"{file}:28:31",
            "variant 'large' names 'z', not an input",
            None,
        ),
    ]


def test_the_cli_prints_every_problem_of_the_repro(tmp_path: Path) -> None:
    project = init_project(tmp_path / "demo")
    break_six_ways(project)
    result = run_nkibuild(["validate"], project)
    assert result.returncode == 2, result.stdout
    assert result.stderr.startswith("7 problems in the manifest\n")
    for expected in (
        "nkibuild.yaml:12:13: error: invalid value 7",
        "nkibuild.yaml:18:13: error: 'kernels/kernels.py' defines no 'scaled_ad'",
        "  hint: did you mean 'scaled_add'?",
        "nkibuild.yaml:28:31: error: variant 'large' names 'z', not an input",
        "nkibuild.yaml:13:8: error: lnc 2 on trn1",
    ):
        assert expected in result.stderr
    assert "Traceback" not in result.stderr


KERNEL_J = """\
  j:
    frontend: jax
    source: kernels/jax_kernels.py:scaled_add
    inputs: {x: {shape: [4], dtype: float32}}
    constants: {class: 1}
"""


def manifest(project: Path, text: str) -> Path:
    path = project / "nkibuild.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_a_kernel_the_schema_refuses_is_set_aside_and_the_others_checked(
    example_project: Path,
) -> None:
    path = manifest(
        example_project,
        "format-version: 1\npackage: {name: demo, version: '1.0'}\nkernels:\n"
        "  k:\n    source: kernels/jax_kernels.py:scaled_add\n    inputs: {x: [4]}\n" + KERNEL_J,
    )
    assert [(d.json_path, d.message) for d in problems(path)] == [
        ("$.kernels.k", "missing required key 'frontend'"),
        ("$.kernels.k.inputs.x", "wrong type: got a list"),
        ("$.kernels.j.constants.class", "'class' is a Python keyword"),
    ]


def test_a_broken_package_still_lets_the_kernels_be_checked(example_project: Path) -> None:
    path = manifest(
        example_project,
        "format-version: 3\npackage: {name: demo}\nkernels:\n" + KERNEL_J,
    )
    assert [(d.json_path, d.message) for d in problems(path)] == [
        ("$.format-version", "unsupported value 3"),
        ("$.package", "missing required key 'version'"),
        ("$.kernels.j.constants.class", "'class' is a Python keyword"),
    ]


def test_a_part_replaced_whole_ignores_its_childrens_problems(example_project: Path) -> None:
    # `package` lacks a key (replaced by a stand-in) and has a broken child: removing the
    # child from the stand-in would leave the model a package without a name.
    path = manifest(
        example_project,
        "format-version: 1\npackage: {name: 0}\nkernels:\n" + KERNEL_J,
    )
    assert [(d.json_path, d.message) for d in problems(path)] == [
        ("$.package", "missing required key 'version'"),
        ("$.package.name", "wrong type: got a number (0)"),
        ("$.kernels.j.constants.class", "'class' is a Python keyword"),
    ]


def test_broken_kernels_still_let_the_package_be_checked(example_project: Path) -> None:
    path = manifest(
        example_project,
        "format-version: 1\npackage: {name: demo, version: 1.0.x}\nkernels: [k]\n",
    )
    assert [(d.json_path, d.message) for d in problems(path)] == [
        ("$.package.version", "invalid version '1.0.x'"),
        ("$.kernels", "wrong type: got a list"),
    ]


def test_a_document_that_is_no_mapping_gives_the_schema_error_only(
    example_project: Path,
) -> None:
    path = manifest(example_project, "- format-version: 1\n")
    assert [(d.json_path, d.message) for d in problems(path)] == [
        ("$", "wrong type: got a list"),
    ]


def test_a_bad_dimension_sets_the_shape_aside_not_the_dimension(example_project: Path) -> None:
    # Without the bad dimension the variant would have another rank: no other problem
    # may be reported about a shape nobody wrote.
    path = manifest(
        example_project,
        "format-version: 1\npackage: {name: demo, version: '1.0'}\nkernels:\n"
        "  k:\n    frontend: jax\n    source: kernels/jax_kernels.py:scaled_add\n"
        "    inputs: {x: {shape: [4, 4], dtype: float32}}\n"
        "    variants: {big: {x: [8, 0]}, typo: {y: [4, 4]}}\n",
    )
    assert [(d.json_path, d.message) for d in problems(path)] == [
        ("$.kernels.k.variants.big.x[1]", "0 is too small"),
        ("$.kernels.k.variants.typo.y", "variant 'typo' names 'y', not an input"),
    ]


def test_a_value_the_model_refuses_is_reported_with_the_semantic_problems(
    example_project: Path,
) -> None:
    path = manifest(
        example_project,
        "format-version: 1\npackage: {name: demo, version: '1.0'}\n"
        "defaults: {compile-timeout: .nan}\nkernels:\n" + KERNEL_J,
    )
    assert [d.json_path for d in problems(path)] == [
        "$.defaults.compile-timeout",
        "$.kernels.j.constants.class",
    ]


# ------------------------------------------------ item 2: the function must exist

KERNELS_PY = """\
import numpy as np
from numpy import add as imported_add
import os.path

def softmax(x):
    return x

scaled = softmax
ann: int = 1
if np:
    def conditional(x):
        return x
try:
    from fastmath import fast
except ImportError:
    fast = softmax
with open(__file__) as handle:
    pass
for looped in ():
    pass

class Kernels:
    def method(self):
        global made_global
        made_global = 1

def outer():
    def inner():
        pass
    return [hidden for hidden in ()]
"""


def function_project(root: Path, frontend: str, function: str, code: str = KERNELS_PY) -> Path:
    root.mkdir()
    (root / "kernels").mkdir()
    (root / "kernels" / "k.py").write_text(code)
    return manifest(
        root,
        f"format-version: 1\npackage: {{name: demo, version: '1.0'}}\nkernels:\n"
        f"  k:\n    frontend: {frontend}\n    source: kernels/k.py:{function}\n"
        f"    reference: kernels/k.py:{function}\n"
        f"    inputs: {{x: {{shape: [4], dtype: float32}}}}\n",
    )


@pytest.mark.parametrize("frontend", ["nki", "nkipy", "jax"])
def test_a_misspelled_function_is_a_manifest_error_for_every_frontend(
    tmp_path: Path, frontend: str
) -> None:
    path = function_project(tmp_path / "p", frontend, "softmaxx")
    diagnostics = problems(path)
    assert [(d.json_path, str(d.location)) for d in diagnostics] == [
        ("$.kernels.k.source", f"{path}:6:13"),
        ("$.kernels.k.reference", f"{path}:7:16"),
    ]
    for diagnostic in diagnostics:
        assert diagnostic.message == "'kernels/k.py' defines no 'softmaxx'"
        assert diagnostic.hint == "did you mean 'softmax'?"
        assert diagnostic.expected == (
            "a function of kernels/k.py (it defines: softmax, conditional, Kernels, outer)"
        )


@pytest.mark.parametrize(
    "name",
    [
        "softmax", "scaled", "ann", "conditional", "fast", "handle", "looped", "Kernels",
        "made_global", "np", "imported_add", "os",
    ],
)  # fmt: skip
def test_every_module_level_binding_counts(tmp_path: Path, name: str) -> None:
    load_manifest(function_project(tmp_path / "p", "jax", name))


@pytest.mark.parametrize("name", ["inner", "method", "hidden", "x"])
def test_names_of_inner_scopes_are_not_module_attributes(tmp_path: Path, name: str) -> None:
    diagnostics = problems(function_project(tmp_path / "p", "jax", name))
    assert {d.message for d in diagnostics} == {f"'kernels/k.py' defines no {name!r}"}


@pytest.mark.parametrize(
    "code", ["from helpers import *\n", "def __getattr__(name):\n    return name\n"]
)
def test_a_module_that_may_define_anything_is_trusted(tmp_path: Path, code: str) -> None:
    load_manifest(function_project(tmp_path / "p", "jax", "anything", code))


def test_the_file_is_parsed_not_imported(tmp_path: Path) -> None:
    marker = tmp_path / "imported"
    code = f"open({str(marker)!r}, 'w').close()\nraise SystemExit\n\ndef f(x):\n    return x\n"
    load_manifest(function_project(tmp_path / "p", "nki", "f", code))
    assert not marker.exists()


def test_a_file_that_is_not_python_says_where(tmp_path: Path) -> None:
    path = function_project(tmp_path / "p", "jax", "f", "def f(x):\n    return x +\n")
    (source, reference) = problems(path)
    assert source.message == ("cannot parse 'kernels/k.py': invalid syntax (line 2, column 15)")
    assert source.hint == "the build imports kernels/k.py to find 'f'"
    assert reference.json_path == "$.kernels.k.reference"


def test_no_suggestion_lists_what_the_file_defines(tmp_path: Path) -> None:
    path = function_project(tmp_path / "p", "jax", "zzz")
    diagnostic = problems(path)[0]
    assert diagnostic.hint is None
    assert diagnostic.expected is not None and "softmax, conditional" in diagnostic.expected


def test_module_names_reads_the_file_once_per_validation(tmp_path: Path) -> None:
    names = module_names(Path(__file__))
    assert not isinstance(names, str)
    assert "test_module_names_reads_the_file_once_per_validation" in names.functions


def test_a_renamed_function_is_found_although_the_plan_was_cached(tmp_path: Path) -> None:
    project = init_project(tmp_path / "demo")
    assert run_nkibuild(["validate"], project).returncode == 0
    edit(project / "kernels" / "kernels.py", ("def scaled_add(", "def scaled_addition("))
    result = run_nkibuild(["validate"], project)
    assert result.returncode == 2
    assert "nkibuild.yaml:15:13: error: 'kernels/kernels.py' defines no 'scaled_add'" in (
        result.stderr
    )
    assert "hint: did you mean 'scaled_addition'?" in result.stderr


# -------------------------------------- item 3: declared inputs no variant takes

UNBUILT = (
    "small: {x: [128, 512], y: [128, 512]}",
    "small: {x: [64, 512], y: [64, 512]}",
)


def test_validate_and_plan_warn_about_declared_inputs_no_variant_takes(
    tmp_path: Path,
) -> None:
    project = init_project(tmp_path / "demo")
    edit(project / "nkibuild.yaml", UNBUILT)
    warning = (
        "nkibuild.yaml:13:3: warning: no variant of kernel 'scaled_add' takes its declared "
        "inputs (x: float32[128,512], y: float32[128,512])\n"
        "  at: $.kernels.scaled_add.inputs\n"
        "  hint: the bundle will refuse a call with the declared shapes: add a variant that "
        "keeps them (one that names no input, e.g. `base: {}`), or declare the inputs of one "
        "of the variants\n"
    )
    validate = run_nkibuild(["validate"], project)
    assert validate.returncode == 0
    assert validate.stderr == warning
    assert validate.stdout == "nkibuild.yaml: ok (1 kernel, 4 build units)\n"
    plan = run_nkibuild(["plan", "--json"], project)  # from the plan cache now
    assert plan.returncode == 0
    assert plan.stderr == warning
    assert len(json.loads(plan.stdout)) == 4


def kernel_with(variants: str, padding: str = "") -> str:
    return (
        "format-version: 1\npackage: {name: demo, version: '1.0'}\nkernels:\n"
        "  k:\n    frontend: jax\n    source: kernels/jax_kernels.py:scaled_add\n"
        "    inputs: {x: {shape: [128, 512], dtype: float32}}\n"
        f"    variants: {variants}\n" + padding
    )


@pytest.mark.parametrize(
    ("variants", "padding", "warned"),
    [
        ("{small: {x: [64, 512]}, large: {x: [1024, 512]}}", "", True),
        ("{small: {x: [64, 512]}, base: {}}", "", False),
        ("{small: {x: [64, 512]}, same: {x: [128, 512]}}", "", False),
        ("{half: {x: {dtype: float16}}}", "", True),
        ("{large: {x: [1024, 512]}}", "    padding: {inputs: {x: [0]}}\n", False),
        ("{large: {x: [1024, 1024]}}", "    padding: {inputs: {x: [0]}}\n", True),
        ("{small: {x: [64, 512]}}", "    padding: {inputs: {x: [0]}}\n", True),
    ],
    ids=["none", "empty-variant", "same-shapes", "other-dtype", "padded", "unpadded-axis",
         "smaller"],
)  # fmt: skip
def test_the_warning_follows_what_the_bundle_accepts(
    example_project: Path, variants: str, padding: str, warned: bool
) -> None:
    loaded = load_manifest(manifest(example_project, kernel_with(variants, padding)))
    warnings = manifest_warnings(loaded)
    assert [w.json_path for w in warnings] == (["$.kernels.k.inputs"] if warned else [])
    assert all(w.severity == "warning" for w in warnings)
    assert all(w.render().startswith(f"{loaded.path}:4:3: warning: ") for w in warnings)


def test_a_kernel_without_variants_is_never_warned_about(example_project: Path) -> None:
    assert manifest_warnings(load_manifest(example_project / "nkibuild.yaml")) == []


# ------------------------------------------ values repeated across kernels


def test_a_mistake_repeated_in_many_kernels_is_reported_for_each(tmp_path: Path) -> None:
    """The schema check skips a value it already found valid under the same subschema
    (kernels repeat their inputs); a value it found wrong is checked, and reported,
    wherever it is."""
    good = "{x: {shape: [128, 64], dtype: float32}}"
    bad = "{x: {shape: [128, 64], dtype: float33}}"
    kernels = [
        ("a", good),
        ("b", bad),
        ("c", good),
        ("d", bad),
        ("e", "{x: {shape: [0], dtype: float32}}"),
    ]
    lines = ["format-version: 1", "package: {name: repeats, version: 1.0.0}", "kernels:"]
    for name, inputs in kernels:
        lines += [f"  {name}:", "    frontend: hlo", "    source: k.pb", f"    inputs: {inputs}"]
    (tmp_path / "nkibuild.yaml").write_text("\n".join(lines) + "\n")
    (tmp_path / "k.pb").write_bytes(b"\x08\x01")
    found = [(d.json_path, d.message) for d in problems(tmp_path / "nkibuild.yaml")]
    assert [path for path, _ in found] == [
        "$.kernels.b.inputs.x.dtype",
        "$.kernels.d.inputs.x.dtype",
        "$.kernels.e.inputs.x.shape[0]",
    ]
    assert found[0][1] == found[1][1]
