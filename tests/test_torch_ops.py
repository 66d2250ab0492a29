"""A bundle's kernels as torch custom ops (`<package>.torch_ops`): traced without graph
breaks by torch.compile and torch.export, fake (meta) outputs from the NEFFs' output
signatures (cut back when a call is padded), eager calls dispatched by the kernel, and
torch imported only when the ops are asked for."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from helpers import build, imported_bundle, write_project

pytest.importorskip("jax")
torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")

EXAMPLE_KERNELS = Path(__file__).resolve().parents[1] / "examples" / "kernels"
PACKAGE = "torch_kernels"
DISTRIBUTION = "torch-kernels"

MANIFEST = f"""\
format-version: 1
package: {{name: {DISTRIBUTION}, version: 0.1.0}}
defaults: {{targets: [trn1, trn2]}}
kernels:
  scaled_add:
    frontend: jax
    source: kernels/jax_kernels.py:scaled_add
    reference: kernels/reference.py:scaled_add
    inputs:
      x: {{shape: [128, 512], dtype: float32}}
      y: {{shape: [128, 512], dtype: float32}}
    constants: {{alpha: 0.5}}
    variants:
      small: {{x: [128, 512], y: [128, 512]}}
      large: {{x: [1024, 512], y: [1024, 512]}}
    padding:
      inputs: {{x: [0], y: [0]}}
      outputs: [{{output: 0, axis: 0, follows: x.0}}]
  matmul_rowsum:
    frontend: jax
    source: kernels/jax_kernels.py:matmul_rowsum
    reference: kernels/reference.py:matmul_rowsum
    inputs:
      lhsT: {{shape: [128, 256], dtype: float32}}
      rhs: {{shape: [128, 512], dtype: float32}}
    variants:
      default: {{}}
      wide: {{rhs: [128, 1024]}}
  doubled:
    frontend: jax
    source: kernels/jax_kernels.py:scaled_add
    reference: kernels/reference.py:float64_result
    inputs:
      x: {{shape: [8, 8], dtype: float32}}
      y: {{shape: [8, 8], dtype: float32}}
    constants: {{alpha: 2.0}}
  aliased:
    frontend: jax
    source: kernels/jax_kernels.py:scaled_add
    reference: kernels/reference.py:first_argument
    inputs:
      x: {{shape: [8, 8], dtype: float32}}
      y: {{shape: [8, 8], dtype: float32}}
    constants: {{alpha: 1.0}}
"""

REFERENCES = """\
import numpy as np


def scaled_add(x, y, alpha):
    return alpha * x + y


def matmul_rowsum(lhsT, rhs):
    product = np.matmul(lhsT.T, rhs)
    return product, product.sum(axis=1)


def float64_result(x, y, alpha):
    return (alpha * x + y).astype(np.float64)  # not what the NEFF returns


def first_argument(x, y, alpha):
    return x  # the very input array: the op's result must not share its memory
"""


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    files = {
        "kernels/jax_kernels.py": (EXAMPLE_KERNELS / "jax_kernels.py").read_text(),
        "kernels/reference.py": REFERENCES,
    }
    root = write_project(tmp_path_factory.mktemp("torch-ops") / "project", MANIFEST, files)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("NKIBUILD_CACHE_DIR", str(tmp_path_factory.mktemp("torch-ops-cache")))
        assert build(root).ok
    return root / "build" / "bundle" / DISTRIBUTION


@pytest.fixture(scope="module")
def bundle(bundle_dir: Path) -> Iterator[ModuleType]:
    with imported_bundle(bundle_dir, PACKAGE) as package:
        yield package


@pytest.fixture(scope="module")
def ops(bundle: ModuleType) -> ModuleType:
    return bundle.torch_ops


class Model(torch.nn.Module):
    """A module mixing the bundle's ops with torch's own."""

    def __init__(self, ops: ModuleType) -> None:
        super().__init__()
        self.ops = ops

    def forward(self, x: torch.Tensor, y: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
        added = self.ops.scaled_add(torch.relu(x), y)
        product, rowsum = self.ops.matmul_rowsum(added[:128, :256], rhs)
        return product.sum() + rowsum.mean() + added.sum()


def inputs(rows: int = 300) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 512, generator=generator)
    y = torch.randn(rows, 512, generator=generator)
    return x, y, torch.randn(128, 512, generator=generator)


def test_the_ops_are_registered_under_the_package_namespace(ops: ModuleType) -> None:
    assert ops.scaled_add is torch.ops.torch_kernels.scaled_add
    schema = str(torch.ops.torch_kernels.matmul_rowsum.default._schema)
    assert schema == "torch_kernels::matmul_rowsum(Tensor lhsT, Tensor rhs) -> (Tensor, Tensor)"
    assert str(torch.ops.torch_kernels.scaled_add.default._schema) == (
        "torch_kernels::scaled_add(Tensor x, Tensor y) -> Tensor"
    )


def test_compile_fullgraph_runs_the_reference_eagerly_inside(ops: ModuleType) -> None:
    torch._dynamo.reset()
    model = Model(ops)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    x, y, rhs = inputs()
    expected = model(x, y, rhs)  # eager: the op dispatches to the kernel (reference)
    x_np, y_np, rhs_np = (t.numpy() for t in (x, y, rhs))
    added = 0.5 * x_np.clip(min=0) + y_np
    product = added[:128, :256].T @ rhs_np
    by_hand = product.sum() + product.sum(axis=1).mean() + added.sum()
    assert expected.item() == pytest.approx(float(by_hand), rel=1e-4)
    assert compiled(x, y, rhs).item() == pytest.approx(expected.item(), rel=1e-6)


def test_a_compiled_function_takes_every_shape_padding_fits(ops: ModuleType) -> None:
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, y: ops.scaled_add(x, y) * 2, fullgraph=True, backend="eager")
    for rows in (300, 200, 1024, 1):  # recompiles; dynamo's second guess makes rows dynamic
        x, y = torch.randn(rows, 512), torch.randn(rows, 512)
        torch.testing.assert_close(compiled(x, y), (0.5 * x + y) * 2)


def test_padded_axes_stay_dynamic_when_compiled(ops: ModuleType) -> None:
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    frames = CompileCounter()
    compiled = torch.compile(
        lambda x, y: ops.scaled_add(x, y) + 1, fullgraph=True, dynamic=True, backend=frames
    )
    for rows in (300, 200, 1000, 129):
        x, y = torch.randn(rows, 512), torch.randn(rows, 512)
        torch.testing.assert_close(compiled(x, y), 0.5 * x + y + 1)
    assert frames.frame_count == 1  # one graph for every length padding fits
    with pytest.raises(Exception, match=r"no variant for shapes \(\[2000,512\], \[2000,512\]\)"):
        compiled(torch.ones(2000, 512), torch.ones(2000, 512))


def test_export_with_a_dynamic_padded_axis(ops: ModuleType) -> None:
    class Add(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return ops.scaled_add(x, y)

    rows = torch.export.Dim("rows", max=1024)
    dynamic = {"x": {0: rows}, "y": {0: rows}}
    exported = torch.export.export(Add(), inputs(300)[:2], dynamic_shapes=dynamic)
    assert [str(n.target) for n in exported.graph.nodes if n.op == "call_function"] == [
        "torch_kernels.scaled_add.default"
    ]
    for count in (7, 1000):
        x, y, _ = inputs(count)
        torch.testing.assert_close(exported.module()(x, y), 0.5 * x + y)
    # Longer than the largest variant, or dynamic where a NEFF's length is fixed: refused.
    too_long = torch.export.Dim("rows", max=4096)
    with pytest.raises(Exception, match=r"rows = Dim\('rows', max=1024\)"):
        torch.export.export(
            Add(), inputs(300)[:2], dynamic_shapes={"x": {0: too_long}, "y": {0: too_long}}
        )
    columns = torch.export.Dim("columns", max=512)
    with pytest.raises(Exception, match="specialized it to be a constant"):
        torch.export.export(
            Add(), inputs(300)[:2], dynamic_shapes={"x": {1: columns}, "y": {1: columns}}
        )


def test_export_keeps_the_ops_in_the_graph(ops: ModuleType) -> None:
    exported = torch.export.export(Model(ops), inputs(128))
    targets = [str(n.target) for n in exported.graph.nodes if n.op == "call_function"]
    assert "torch_kernels.scaled_add.default" in targets
    assert "torch_kernels.matmul_rowsum.default" in targets
    x, y, rhs = inputs(128)
    assert exported.module()(x, y, rhs).item() == pytest.approx(
        Model(ops)(x, y, rhs).item(), rel=1e-6
    )


@pytest.mark.parametrize(
    ("shapes", "expected"),
    [
        ([(128, 512), (128, 512)], [(128, 512)]),  # variant small
        ([(1024, 512), (1024, 512)], [(1024, 512)]),  # variant large
        ([(300, 512), (300, 512)], [(300, 512)]),  # padded to large, cut back
        ([(1, 512), (1, 512)], [(1, 512)]),  # padded to small
    ],
)
def test_fake_outputs_follow_each_variant(
    ops: ModuleType, shapes: list[tuple[int, ...]], expected: list[tuple[int, ...]]
) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        result = ops.scaled_add(*(torch.empty(s) for s in shapes))
    assert [tuple(result.shape)] == expected and result.dtype == torch.float32
    # torch's own check: fake and real outputs agree (shapes, dtypes, strides, aliasing).
    torch.library.opcheck(ops.scaled_add, tuple(torch.randn(s) for s in shapes))


def test_fake_outputs_of_a_kernel_with_two_outputs(ops: ModuleType, bundle: ModuleType) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    outputs = bundle.build_info()["kernels"]["matmul_rowsum"]["neffs"]["trn1"]
    for variant, rhs in [("default", (128, 512)), ("wide", (128, 1024))]:
        with FakeTensorMode():
            product, rowsum = ops.matmul_rowsum(torch.empty(128, 256), torch.empty(rhs))
        assert [list(product.shape), list(rowsum.shape)] == [
            t["shape"] for t in outputs[variant]["outputs"]
        ]
        torch.library.opcheck(ops.matmul_rowsum, (torch.randn(128, 256), torch.randn(rhs)))


def test_wrong_shapes_are_refused_while_tracing(ops: ModuleType) -> None:
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, y: ops.scaled_add(x, y), fullgraph=True, backend="eager")
    wrong = torch.ones(2048, 512)
    with pytest.raises(Exception, match=r"scaled_add\(\) has no variant for shapes") as error:
        compiled(wrong, wrong)
    assert "([2048,512], [2048,512]) (even padded: x axes 0; y axes 0 may be shorter" in str(
        error.value
    )

    class Wrong(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return ops.matmul_rowsum(x, y)[0]

    with pytest.raises(Exception, match=r"matmul_rowsum\(\) has no variant for shapes"):
        torch.export.export(Wrong(), (torch.ones(128, 256), torch.ones(128, 7)))
    with pytest.raises(Exception, match=r"expects dtypes \(float32, float32\), got \(float16"):
        torch.export.export(Wrong(), (torch.ones(128, 256).half(), torch.ones(128, 512)))


def test_an_eager_result_unlike_the_neffs_is_an_error(ops: ModuleType) -> None:
    x = torch.ones(8, 8)
    with pytest.raises(RuntimeError) as error:
        ops.doubled(x, x)
    assert str(error.value) == (
        "doubled returned float64[8,8] in reference mode, but its NEFFs return float32[8,8]; "
        "as a torch op its results must match the NEFFs' (fix the reference)"
    )


def test_a_reference_returning_its_input_does_not_alias_it(ops: ModuleType) -> None:
    x, y = torch.randn(8, 8), torch.ones(8, 8)
    out = ops.aliased(x, y)
    assert torch.equal(out, x)
    assert out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    torch.library.opcheck(ops.aliased, (x, y))


def run_python(bundle_dir: Path, script: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("NKIBUILD_")}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=bundle_dir,
        capture_output=True,
        text=True,
        timeout=300,
        env={**environment, "NKIBUILD_MODE": "reference"},
        check=False,
    )


def test_the_bundle_imports_torch_only_for_the_ops(bundle_dir: Path) -> None:
    result = run_python(
        bundle_dir,
        """
        import sys
        import numpy as np
        import torch_kernels
        x = np.ones((128, 512), np.float32)
        torch_kernels.scaled_add(x, x)
        assert "torch" not in sys.modules, "imported torch"
        torch_kernels.torch_ops.scaled_add
        assert "torch" in sys.modules
        print("ok")
        """,
    )
    assert result.stdout == "ok\n", result.stderr


def test_without_torch_the_ops_say_what_to_install(bundle_dir: Path) -> None:
    result = run_python(
        bundle_dir,
        """
        import sys
        sys.modules["torch"] = None  # as if torch were not installed
        import numpy as np
        import torch_kernels
        x = np.ones((1, 512), np.float32)
        print(torch_kernels.scaled_add(x, x).shape)
        try:
            torch_kernels.torch_ops
        except RuntimeError as error:
            print(error)
        """,
    )
    assert result.stdout == "(1, 512)\ntorch_kernels.torch_ops needs torch: pip install torch\n", (
        result.stderr
    )
