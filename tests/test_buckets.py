"""Padding to shape buckets (`padding` in the manifest): the manifest's checks, the
bundle stage's check against the compiled outputs, and padded calls against the
reference on random shapes."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import ml_dtypes
import numpy as np
import pytest
from helpers import build, imported_bundle, write_project

from nkibuild.errors import ManifestError
from nkibuild.manifest import load_manifest

pytest.importorskip("jax")

EXAMPLE_KERNELS = Path(__file__).resolve().parents[1] / "examples" / "kernels"
PACKAGE = "bucket_kernels"

# The reference records what it is called with: padding is observable in the shapes
# and the pad values the kernel receives.
REFERENCE = """\
import numpy as np

CALLS = []


def scaled_add(x, y, alpha):
    CALLS.append(("scaled_add", x.copy(), y.copy()))
    return alpha * x + y


def matmul_rowsum(lhsT, rhs):
    CALLS.append(("matmul_rowsum", lhsT.copy(), rhs.copy()))
    product = np.matmul(lhsT.T.astype(np.float32), rhs.astype(np.float32))
    return product, product.sum(axis=1)


def softmax(logits):
    CALLS.append(("softmax", logits.copy()))
    shifted = logits - logits.max(axis=-1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=-1, keepdims=True)


def exact(x, y, alpha):
    return alpha * x + y
"""

KERNELS = """\
  scaled_add:
    frontend: jax
    source: kernels/jax_kernels.py:scaled_add
    reference: kernels/reference.py:scaled_add
    inputs:
      x: {shape: [128, 512], dtype: float32}
      y: {shape: [128, 512], dtype: float32}
    constants: {alpha: 0.5}
    variants:
      small: {x: [128, 512], y: [128, 512]}
      large: {x: [1024, 512], y: [1024, 512]}
      wide: {x: [128, 2048], y: [128, 2048]}
    padding:
      inputs: {x: [0, 1], y: [0, 1]}
      outputs:
        - {output: 0, axis: 0, follows: x.0}
        - {output: 0, axis: 1, follows: x.1}
  matmul_rowsum:
    frontend: jax
    source: kernels/jax_kernels.py:matmul_rowsum
    reference: kernels/reference.py:matmul_rowsum
    inputs:
      lhsT: {shape: [128, 128], dtype: bfloat16}
      rhs: {shape: [128, 256], dtype: bfloat16}
    variants:
      small: {lhsT: [128, 128], rhs: [128, 256]}
      large: {lhsT: [256, 256], rhs: [256, 512]}
    padding:
      # zero rows of the contraction axis add nothing; M and N are cut back
      inputs: {lhsT: [0, 1], rhs: [0, 1]}
      outputs:
        - {output: 0, axis: 0, follows: lhsT.1}
        - {output: 0, axis: 1, follows: rhs.1}
        - {output: 1, axis: 0, follows: lhsT.1}
  softmax:
    frontend: jax
    source: kernels/jax_kernels.py:softmax
    reference: kernels/reference.py:softmax
    inputs:
      logits: {shape: [64, 1024], dtype: float32}
    padding:
      # exp(-inf) is 0: padded columns change no sum
      inputs: {logits: [0, 1]}
      value: -.inf
      outputs:
        - {output: 0, axis: 0, follows: logits.0}
        - {output: 0, axis: 1, follows: logits.1}
  exact:
    frontend: jax
    source: kernels/jax_kernels.py:scaled_add
    reference: kernels/reference.py:exact
    inputs:
      x: {shape: [128, 512], dtype: float32}
      y: {shape: [128, 512], dtype: float32}
    constants: {alpha: 0.5}
"""


def manifest(kernels: str, name: str = "bucket-kernels") -> str:
    head = f"format-version: 1\npackage: {{name: {name}, version: 0.1.0}}\n"
    return head + "defaults: {targets: [trn1, trn2]}\nkernels:\n" + kernels


def project(root: Path, kernels: str, name: str = "bucket-kernels") -> Path:
    files = {
        "kernels/jax_kernels.py": (EXAMPLE_KERNELS / "jax_kernels.py").read_text(),
        "kernels/reference.py": REFERENCE,
    }
    return write_project(root, manifest(kernels, name), files)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    root = project(tmp_path_factory.mktemp("buckets") / "project", KERNELS)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("NKIBUILD_CACHE_DIR", str(tmp_path_factory.mktemp("buckets-cache")))
        assert build(root).ok
    with imported_bundle(root / "build" / "bundle" / "bucket-kernels", PACKAGE) as package:
        yield package


@pytest.fixture
def calls(bundle: ModuleType) -> list[tuple]:
    recorded = importlib.import_module(f"{PACKAGE}.reference.kernels_reference").CALLS
    recorded.clear()
    return recorded


def test_padded_calls_match_the_reference_on_random_shapes(
    bundle: ModuleType, calls: list[tuple]
) -> None:
    rng = np.random.default_rng(18)
    for _ in range(25):
        rows, columns = int(rng.integers(1, 1025)), int(rng.integers(1, 2049))
        if rows > 128 and columns > 512:  # fits no variant: checked below
            continue
        x = rng.standard_normal((rows, columns), dtype=np.float32)
        y = rng.standard_normal((rows, columns), dtype=np.float32)
        out = bundle.scaled_add(x, y, mode="reference")
        np.testing.assert_allclose(out, 0.5 * x + y, rtol=1e-6)
        # The reference ran on the smallest variant that fits, padded with zeros.
        _, padded_x, padded_y = calls.pop()
        bucket = (128, 512) if rows <= 128 and columns <= 512 else None
        bucket = bucket or ((1024, 512) if columns <= 512 else (128, 2048))
        assert padded_x.shape == padded_y.shape == bucket
        assert not padded_x[rows:].any() and not padded_x[:, columns:].any()
        np.testing.assert_array_equal(padded_y[:rows, :columns], y)


def test_several_outputs_are_cut_back_along_the_axes_they_follow(
    bundle: ModuleType, calls: list[tuple]
) -> None:
    rng = np.random.default_rng(7)
    for _ in range(10):
        k, m, n = (int(v) for v in rng.integers(1, 257, size=3))
        lhsT = rng.standard_normal((k, m)).astype(ml_dtypes.bfloat16)
        rhs = rng.standard_normal((k, n * 2)).astype(ml_dtypes.bfloat16)
        product, rowsum = bundle.matmul_rowsum(lhsT, rhs, mode="reference")
        expected = lhsT.T.astype(np.float32) @ rhs.astype(np.float32)
        assert product.shape == (m, n * 2) and rowsum.shape == (m,)
        np.testing.assert_allclose(product, expected, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(rowsum, expected.sum(axis=1), rtol=1e-4, atol=1e-3)
        small = k <= 128 and m <= 128 and n * 2 <= 256
        assert calls.pop()[1].shape == ((128, 128) if small else (256, 256))


# Padded rows are all -inf: the reference's max-subtraction makes them NaN (cut off).
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_the_pad_value_is_what_the_kernel_sees(bundle: ModuleType, calls: list[tuple]) -> None:
    rng = np.random.default_rng(3)
    for rows, columns in [(1, 1), (17, 1000), (64, 1023), (5, 3)]:
        logits = rng.standard_normal((rows, columns), dtype=np.float32)
        probabilities = bundle.softmax(logits, mode="reference")
        exp = np.exp(logits - logits.max(axis=-1, keepdims=True))
        np.testing.assert_allclose(probabilities, exp / exp.sum(-1, keepdims=True), rtol=1e-5)
        (padded,) = calls.pop()[1:]
        assert padded.shape == (64, 1024)
        assert np.isneginf(padded[:, columns:]).all() and np.isneginf(padded[rows:]).all()


def test_an_exact_match_is_not_padded(bundle: ModuleType, calls: list[tuple]) -> None:
    x = np.ones((1024, 512), np.float32)
    out = bundle.scaled_add(x, x, mode="reference")
    assert out.shape == (1024, 512) and calls.pop()[1].shape == (1024, 512)


def test_a_call_no_variant_fits_names_the_padding_rule(bundle: ModuleType) -> None:
    too_big = np.ones((129, 513), np.float32)
    with pytest.raises(RuntimeError) as error:
        bundle.scaled_add(too_big, too_big, mode="reference")
    assert str(error.value) == (
        "scaled_add() has no variant for shapes ([129,513], [129,513]) (even padded: x axes "
        "0,1; y axes 0,1 may be shorter, every other axis equal); built variants: large: "
        "([1024,512], [1024,512]); small: ([128,512], [128,512]); wide: ([128,2048], [128,2048])"
    )
    with pytest.raises(RuntimeError, match=r"no variant for shapes \(\[128\], \[128\]\)"):
        bundle.scaled_add(np.ones(128, np.float32), np.ones(128, np.float32))


def test_without_padding_a_call_must_match_exactly(bundle: ModuleType) -> None:
    x = np.ones((100, 512), np.float32)
    with pytest.raises(RuntimeError) as error:
        bundle.exact(x, x, mode="reference")
    assert str(error.value) == (
        "exact() has no variant for shapes ([100,512], [100,512]); built variants: default: "
        "([128,512], [128,512])"
    )


def test_the_docstring_says_how_calls_are_padded(bundle: ModuleType) -> None:
    assert "a call that fits no variant is padded with 0.0\n" in bundle.scaled_add.__doc__
    assert "may be shorter than the variant's:\n        x: 0, 1\n        y: 0, 1\n" in (
        bundle.scaled_add.__doc__
    )
    assert "padded" not in bundle.exact.__doc__


def test_neuron_mode_hands_the_padded_inputs_to_the_neff(
    bundle: ModuleType, tmp_path: Path
) -> None:
    """Through the toolchain double's spike: the NEFF of the smallest fitting variant is
    loaded and receives the bucket's shapes; the caller gets the outputs cut back."""
    log = tmp_path / "spike.jsonl"
    script = (
        "import numpy as np\n"
        f"from {PACKAGE} import scaled_add\n"
        "x = np.ones((300, 500), np.float32)\n"
        "print(scaled_add(x, x, mode='neuron').shape)\n"
    )
    fake_spike = (
        Path(__file__).resolve().parents[1] / "nkibuild" / "toolchain_double" / "fake_runtime"
    )
    environment = {k: v for k, v in os.environ.items() if not k.startswith("NKIBUILD_")}
    bundle_dir = Path(bundle.__file__).parents[1]
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={
            **environment,
            "PYTHONPATH": f"{fake_spike}{os.pathsep}{bundle_dir}",
            "NKIBUILD_TARGET": "trn2",
            "NKIBUILD_FAKE_SPIKE_LOG": str(log),
        },
    )
    assert result.stdout == "(300, 500)\n", result.stderr
    events = [json.loads(line) for line in log.read_text().splitlines()]
    [load] = [e for e in events if e["event"] == "load"]
    assert Path(load["path"]).parts[-3:] == ("trn2", "scaled_add", "large.neff")
    [call] = [e for e in events if e["event"] == "call"]
    assert [spec["shape"] for spec in call["inputs"].values()] == [[1024, 512], [1024, 512]]


# --- the manifest's checks -------------------------------------------------------


def manifest_problems(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, padding: str, dtype: str = "float32"
) -> list[str]:
    kernel = f"""\
  k:
    frontend: jax
    source: kernels/jax_kernels.py:scaled_add
    inputs:
      x: {{shape: [128, 512], dtype: {dtype}}}
      y: {{shape: [128], dtype: {dtype}}}
    variants:
      small: {{x: [128, 512]}}
      flat: {{x: [128]}}
    padding:
{padding}"""
    monkeypatch.chdir(project(tmp_path, kernel))
    with pytest.raises(ManifestError) as error:
        load_manifest("nkibuild.yaml")
    return [d.render() for d in error.value.diagnostics]


def test_padded_inputs_and_axes_must_exist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    found = manifest_problems(tmp_path, monkeypatch, "      inputs: {x: [0, 1], z: [0], y: [1]}\n")
    assert found == [
        "nkibuild.yaml:15:23: error: 'x' has no axis 1: it has 1 in variant 'flat'\n"
        "  at: $.kernels.k.padding.inputs.x[1]\n  expected: an axis from 0 to 0",
        "nkibuild.yaml:15:27: error: padding names 'z', not an input of 'k'\n"
        "  at: $.kernels.k.padding.inputs.z\n  expected: one of x, y",
        "nkibuild.yaml:15:39: error: 'y' has no axis 1: it has 1 in variant 'small'\n"
        "  at: $.kernels.k.padding.inputs.y[0]\n  expected: an axis from 0 to 0",
    ]


def test_output_axes_follow_padded_input_axes_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    padding = (
        "      inputs: {x: [0]}\n"
        "      outputs:\n"
        "        - {output: 0, axis: 0, follows: y.0}\n"
        "        - {output: 0, axis: 0, follows: x.0}\n"
    )
    found = manifest_problems(tmp_path, monkeypatch, padding)
    assert found == [
        "nkibuild.yaml:17:41: error: output 0 axis 0 follows 'y.0', which is not a padded "
        "input axis\n  at: $.kernels.k.padding.outputs[0].follows\n  expected: one of x.0",
        "nkibuild.yaml:18:11: error: output 0 axis 0 is listed twice\n"
        "  at: $.kernels.k.padding.outputs[1]\n  hint: an output axis follows one input axis",
    ]


def test_an_integer_input_cannot_be_padded_with_infinity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = manifest_problems(
        tmp_path, monkeypatch, "      inputs: {y: [0]}\n      value: -.inf\n", "int32"
    )
    assert found == [
        "nkibuild.yaml:16:14: error: pad value -inf cannot be held exactly by 'y' (int32)\n"
        "  at: $.kernels.k.padding.value\n  expected: a value int32 holds exactly"
    ]


def test_the_schema_refuses_malformed_declarations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = manifest_problems(
        tmp_path,
        monkeypatch,
        "      inputs: {x: []}\n      outputs: [{output: 0, axis: 0, follows: x}]\n",
    )
    assert found == [
        "nkibuild.yaml:15:19: error: empty list\n  at: $.kernels.k.padding.inputs.x\n"
        "  expected: a non-empty list of unique items, each an integer >= 0",
        "nkibuild.yaml:16:47: error: invalid value 'x'\n"
        "  at: $.kernels.k.padding.outputs[0].follows\n"
        "  expected: a string matching ^[A-Za-z_][A-Za-z0-9_]*\\.[0-9]+$ of at most 80 characters",
    ]


# --- the bundle stage's check against the compiled outputs -------------------------


@pytest.mark.parametrize(
    ("outputs", "message"),
    [
        (
            "{output: 0, axis: 1, follows: x.0}",
            "kernels.k.padding.outputs[0]: output 0 axis 1 should follow x.0 (128 in "
            "variant 'small'), but in the trn1 NEFF of 'small' it is 512 long (shape "
            "[128, 512])",
        ),
        (
            "{output: 1, axis: 0, follows: x.0}",
            "kernels.k.padding.outputs[0]: output 1 axis 0 should follow x.0 (128 in "
            "variant 'small'), but in the trn1 NEFF of 'small' the kernel has 1 output",
        ),
    ],
)
def test_declared_output_axes_must_fit_the_compiled_outputs(
    tmp_path: Path, outputs: str, message: str
) -> None:
    from conftest import run_nkibuild

    kernel = f"""\
  k:
    frontend: jax
    source: kernels/jax_kernels.py:scaled_add
    inputs:
      x: {{shape: [128, 512], dtype: float32}}
      y: {{shape: [128, 512], dtype: float32}}
    constants: {{alpha: 0.5}}
    variants:
      small: {{x: [128, 512], y: [128, 512]}}
      large: {{x: [1024, 512], y: [1024, 512]}}
    padding:
      inputs: {{x: [0], y: [0]}}
      outputs: [{outputs}]
"""
    root = project(tmp_path / "project", kernel)
    result = run_nkibuild(["build", "--toolchain", "fake"], root)
    assert result.returncode == 1, result.stderr
    assert f"the padding of kernel 'k' does not fit its compiled outputs:\n  {message}" in (
        result.stdout + result.stderr
    )
    assert not (root / "dist").exists() or not list((root / "dist").glob("*.whl"))


def test_a_changed_declaration_regenerates_the_loader(tmp_path: Path) -> None:
    kernel = """\
  k:
    frontend: jax
    source: kernels/jax_kernels.py:scaled_add
    inputs:
      x: {shape: [128, 512], dtype: float32}
      y: {shape: [128, 512], dtype: float32}
    constants: {alpha: 0.5}
    padding:
      inputs: {x: [0], y: [0]}
      value: 0
"""
    root = project(tmp_path / "project", kernel, name="regen-kernels")
    loader = root / "build" / "bundle" / "regen-kernels" / "regen_kernels" / "_kernels" / "k.py"
    assert build(root).ok
    assert '"value": "0.0"' in loader.read_text()
    (root / "nkibuild.yaml").write_text(
        manifest(kernel.replace("value: 0", "value: 7"), "regen-kernels")
    )
    summary = build(root)
    assert summary.ok
    assert '"value": "7.0"' in loader.read_text()
    # Padding is the loader's business: nothing is extracted or compiled again.
    assert [name.partition(":")[0] for name in summary.executed] == ["bundle", "wheel"]


def test_torch_ops_is_no_kernel_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = """\
  torch_ops:
    frontend: jax
    source: kernels/jax_kernels.py:scaled_add
    inputs:
      x: {shape: [8], dtype: float32}
"""
    monkeypatch.chdir(project(tmp_path, kernel))
    with pytest.raises(ManifestError) as error:
        load_manifest("nkibuild.yaml")
    assert [d.render() for d in error.value.diagnostics] == [
        "nkibuild.yaml:5:3: error: kernel name 'torch_ops' is reserved by the generated bundle "
        "(or private)\n  at: $.kernels.torch_ops\n  expected: a Python identifier"
    ]
