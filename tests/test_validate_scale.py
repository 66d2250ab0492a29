"""validate at scale: the YAML loader's positions and wording of refused documents, the
schema's diagnostics, and the benchmark's 10,000-unit manifest."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_nkibuild

from nkibuild.errors import ManifestError
from nkibuild.manifest import load_manifest, schema, yamlsource

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


def parsed(text: str) -> yamlsource.YamlDocument:
    return yamlsource.parse_yaml(text.encode(), "m.yaml")


def test_the_loader_gives_data_and_positions() -> None:
    doc = parsed(DOCUMENT)
    # An alias is located where it is used, not at its anchor.
    assert str(doc.location(("kernels", "k", "inputs", "x"))) == "m.yaml:11:10"
    assert str(doc.location(("kernels", "k", "inputs", "z", 1, 1))) == "m.yaml:16:13"
    assert doc.data["kernels"]["k"]["when"] == "2024-01-01"
    assert doc.data["kernels"]["k"]["inputs"]["y"] == {"shape": [4, 4], "dtype": "bfloat16"}
    assert doc.data["package"]["name"] == "d\u00e9mo"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a:\n\t- b\n", "YAML: found character '\\t' that cannot start any token"),
        ("a: \x07\n", "character U+0007 is not allowed in YAML"),
        ("a: [1\n", "YAML: expected ',' or ']', but got '<stream end>'"),
        ("a: 1\n---\nb: 2\n", "a second YAML document starts here"),
    ],
)
def test_refused_documents_are_worded(text: str, message: str) -> None:
    with pytest.raises(ManifestError) as info:
        parsed(text)
    assert message in info.value.diagnostics[0].render()


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


def test_the_schema_finds_every_problem() -> None:
    doc = yamlsource.parse_yaml(BROKEN.encode(), "m.yaml")
    found = [p.diagnostic.render() for p in schema.schema_problems(doc)]
    assert len(found) >= 15
    assert len(set(found)) == len(found)


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
