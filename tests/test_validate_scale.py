"""What makes validate fast (issue 17) changes no answer: libyaml's parser gives the
positions the pure-Python loader gives, refused documents are worded as before, and the
inlined schema finds the same problems."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_nkibuild

from nkibuild.errors import ManifestError
from nkibuild.manifest import load_manifest, schema, yamlsource
from nkibuild.manifest.schemagen import load_schema

REPO = Path(__file__).resolve().parents[1]

DOCUMENT = """\
# comment
format-version: 1
package: {name: "d\u00e9mo", version: '1.0'}   # non-ASCII before later columns
base: &base
  shape: [4, 4]
  dtype: float32
kernels:
  k:
    frontend: jax
    inputs:
      x: *base
      y: {<<: *base, dtype: bfloat16}
      z:
        - 1
        - - 2
          - "\u20ac3"
    text: |
      block
      scalar
    when: 2024-01-01
    none: ~
"""


def parsed(monkeypatch: pytest.MonkeyPatch, text: str, fast: bool) -> yamlsource.YamlDocument:
    if not fast:
        monkeypatch.setattr(yamlsource, "_FAST_LOADER", None)
    try:
        return yamlsource.parse_yaml(text.encode(), "m.yaml")
    finally:
        monkeypatch.undo()


@pytest.mark.skipif(yamlsource._FAST_LOADER is None, reason="PyYAML without libyaml")
def test_libyaml_gives_the_data_and_positions_of_the_pure_loader(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fast = parsed(monkeypatch, DOCUMENT, fast=True)
    pure = parsed(monkeypatch, DOCUMENT, fast=False)
    assert fast.data == pure.data
    assert fast.values == pure.values
    assert fast.keys == pure.keys
    # An alias is located where it is used, not at its anchor.
    assert str(fast.location(("kernels", "k", "inputs", "x"))) == "m.yaml:11:10"
    assert fast.data["kernels"]["k"]["when"] == "2024-01-01"


@pytest.mark.skipif(yamlsource._FAST_LOADER is None, reason="PyYAML without libyaml")
@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a:\n\t- b\n", "YAML: found character '\\t' that cannot start any token"),
        ("a: \x07\n", "character U+0007 is not allowed in YAML"),
        ("a: [1\n", "YAML: expected ',' or ']', but got '<stream end>'"),
        ("a: 1\n---\nb: 2\n", "a second YAML document starts here"),
    ],
)
def test_documents_libyaml_refuses_are_worded_by_the_pure_loader(
    monkeypatch: pytest.MonkeyPatch, text: str, message: str
) -> None:
    def diagnostics(fast: bool) -> list[str]:
        with pytest.raises(ManifestError) as info:
            parsed(monkeypatch, text, fast)
        return [d.render() for d in info.value.diagnostics]

    assert diagnostics(fast=True) == diagnostics(fast=False)
    assert message in diagnostics(fast=True)[0]


def test_deep_nesting_is_refused_without_crashing_the_process(tmp_path: Path) -> None:
    # libyaml's own composer recurses in C without a limit: this would kill Python.
    (tmp_path / "nkibuild.yaml").write_text("a: " + "[" * 200_000 + "]" * 200_000 + "\n")
    code = (
        "from nkibuild.manifest import load_manifest\n"
        "from nkibuild.errors import ManifestError\n"
        "try:\n    load_manifest('nkibuild.yaml')\n"
        "except ManifestError as error:\n    print(error.diagnostics[0].message)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "YAML: nesting deeper than 32 levels"


BROKEN = """\
format-version: 2
package: {name: -demo, version: 1.0, licence: MIT}
defaults: {optlevel: 9, targets: [trn1, trn9], compile-memory: lots}
kernels:
  k:
    frontend: jaxx
    source: 3
    inputs: {x: {shape: [0, -1], dtype: f32}, 1y: [4]}
    variants: {big: {x: {shape: [8], dtype: nope}}, small: {x: [2.0]}}
    overrides: {trn1: {optlevel: 0, unknown: 1}}
    constants: {alpha: [1, [2, {}]]}
  j: {source: x.py:f}
"""


def test_the_inlined_schema_finds_what_the_generated_one_finds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    doc = yamlsource.parse_yaml(BROKEN.encode(), "m.yaml")
    inlined = [p.diagnostic.render() for p in schema.schema_problems(doc)]
    strict = type(schema._validator())  # the same type checks, on the schema as generated
    monkeypatch.setattr(schema, "_validator", lambda: strict(load_schema()))
    assert "'$ref': '#/$defs/compileSettings'" in str(schema._validator().schema)
    assert [p.diagnostic.render() for p in schema.schema_problems(doc)] == inlined
    assert len(inlined) >= 15


def test_validate_where_the_plan_cannot_be_cached_still_validates(
    example_project: Path,
) -> None:
    (example_project / "build").write_text("not a directory")
    result = run_nkibuild(["validate"], example_project)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "nkibuild.yaml: ok (3 kernels, 7 build units)\n"


def load_benchmark(monkeypatch: pytest.MonkeyPatch) -> object:
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))  # the benchmark's own helpers
    spec = importlib.util.spec_from_file_location(
        "validate_scale", REPO / "benchmarks" / "validate_scale.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_benchmark_manifest_has_10000_valid_units(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nkibuild.plan import resolve

    benchmark = load_benchmark(monkeypatch)
    units = benchmark.write_project(tmp_path)  # type: ignore[attr-defined]
    assert units == 10_000
    assert len(resolve(load_manifest(tmp_path / "nkibuild.yaml"))) == units
