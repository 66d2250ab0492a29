"""End to end: build the examples, pip install the wheel into a fresh virtualenv that has
only NumPy, ml_dtypes and torch (no nkibuild, no jax), and use the kernels there:
reference mode against NumPy, torch in/torch out, errors, and neuron mode through the
toolchain double's nrtpy and spike with the exact names, dtypes and shapes they receive."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import venv
import zipfile
from pathlib import Path

import pytest
from helpers import build, softmax_manifest, softmax_project

from nkibuild.formats.neff import read_neff

pytest.importorskip("jax")

REPO = Path(__file__).resolve().parents[1]
FAKE_SPIKE = REPO / "nkibuild" / "toolchain_double" / "fake_runtime"
WHEEL = "acme_kernels-0.1.0-py3-none-any.whl"
RUNTIME_PACKAGES = ["numpy", "ml_dtypes", "torch==2.13.0"]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("e2e") / "project"
    shutil.copytree(REPO / "examples", root, ignore=shutil.ignore_patterns("build", "dist"))
    with pytest.MonkeyPatch.context() as env:
        env.setenv("NKIBUILD_CACHE_DIR", str(tmp_path_factory.mktemp("e2e-cache")))
        assert build(root).ok
    return root


@pytest.fixture(scope="module")
def python(project: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv with the bundle and its runtime dependencies, and nothing of nkibuild's."""
    env_dir = tmp_path_factory.mktemp("venv") / "env"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    interpreter = env_dir / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(interpreter), "install", "-q"]
    # torch 2.13.0 comes from the machine's local wheel (pip's configured find-links).
    # --no-compile: pip's bytecode pass over torch's files was half the fixture's time;
    # the few modules the tests import are compiled as they load.
    installing = [*pip, "--no-compile", *RUNTIME_PACKAGES]
    subprocess.run(installing, check=True, capture_output=True, timeout=900)
    wheel = project / "dist" / WHEEL
    subprocess.run([*pip, "--no-deps", "--no-index", str(wheel)], check=True, timeout=300)
    return interpreter


def run_in_venv(
    python: Path, script: str, cwd: Path, **env: str
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("NKIBUILD_", "PYTHON"))}
    return subprocess.run(
        [str(python), "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**clean, **env},
        timeout=300,
        check=False,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_importing_the_bundle_loads_nothing_and_needs_no_nkibuild(
    python: Path, tmp_path: Path
) -> None:
    out = ok(
        run_in_venv(
            python,
            """
            import importlib.metadata, importlib.util, sys
            import acme_kernels
            assert importlib.util.find_spec("nkibuild") is None, "nkibuild is installed"
            loaded = {"spike", "numpy", "torch", "acme_kernels._runtime"} & set(sys.modules)
            assert not loaded, loaded
            groups = importlib.metadata.entry_points(group="nkibuild.bundles")
            print([entry.name for entry in groups])
            print(sorted(acme_kernels.KERNELS))
            """,
            tmp_path,
        )
    )
    assert out.splitlines() == [
        "['acme_kernels']",
        "['matmul_rowsum', 'scaled_add', 'softmax']",
    ]


def test_reference_mode_matches_numpy_for_every_kernel_and_variant(
    python: Path, tmp_path: Path
) -> None:
    ok(
        run_in_venv(
            python,
            """
            import ml_dtypes, numpy as np
            from acme_kernels import matmul_rowsum, scaled_add, softmax
            rng = np.random.default_rng(0)
            for rows in (128, 1024):  # the small and large variants
                x = rng.standard_normal((rows, 512)).astype(np.float32)
                y = rng.standard_normal((rows, 512)).astype(np.float32)
                np.testing.assert_allclose(scaled_add(x, y), 0.5 * x + y, rtol=1e-6)
                np.testing.assert_allclose(scaled_add(y=y, x=x), 0.5 * x + y, rtol=1e-6)
            lhsT = rng.standard_normal((128, 256)).astype(ml_dtypes.bfloat16)
            rhs = rng.standard_normal((128, 512)).astype(ml_dtypes.bfloat16)
            product, rowsum = matmul_rowsum(lhsT, rhs)
            expected = lhsT.astype(np.float32).T @ rhs.astype(np.float32)
            assert product.shape == (256, 512) and rowsum.shape == (256,)
            np.testing.assert_allclose(product.astype(np.float32), expected, rtol=2e-2, atol=0.5)
            logits = rng.standard_normal((64, 1024)).astype(np.float32)
            e = np.exp(logits - logits.max(axis=-1, keepdims=True))
            np.testing.assert_allclose(softmax(logits), e / e.sum(-1, keepdims=True), rtol=1e-5)
            print(scaled_add.signature, sorted(scaled_add.variants), scaled_add.targets)
            """,
            tmp_path,
        )
    )


def test_torch_tensors_in_give_torch_tensors_out(python: Path, tmp_path: Path) -> None:
    out = ok(
        run_in_venv(
            python,
            """
            import torch
            from acme_kernels import matmul_rowsum, scaled_add
            x, y = torch.randn(128, 512), torch.randn(128, 512)
            out = scaled_add(x, y)
            assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
            torch.testing.assert_close(out, 0.5 * x + y)
            lhsT = torch.randn(128, 256, dtype=torch.bfloat16)
            rhs = torch.randn(128, 512, dtype=torch.bfloat16)
            product, rowsum = matmul_rowsum(lhsT, rhs)  # bf16 in; the kernel returns fp32
            print(type(product).__name__, product.dtype, tuple(product.shape), rowsum.dtype)
            expected = lhsT.float().T @ rhs.float()
            torch.testing.assert_close(product, expected, rtol=1e-5, atol=1e-4)
            # A bfloat16 result goes back to torch as bfloat16, bit for bit.
            import ml_dtypes, numpy as np
            from acme_kernels._runtime import _as_torch
            array = np.array([1.5, -2.25, 65536.0], dtype=ml_dtypes.bfloat16)
            tensor = _as_torch(array, torch.device("cpu"))
            assert tensor.dtype == torch.bfloat16 and tensor.tolist() == [1.5, -2.25, 65536.0]
            """,
            tmp_path,
        )
    )
    assert out.strip() == "Tensor torch.float32 (256, 512) torch.float32"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            "scaled_add(np.zeros((64, 512), np.float32), np.zeros((64, 512), np.float32))",
            "scaled_add() has no variant for shapes ([64,512], [64,512]); built variants: "
            "large: ([1024,512], [1024,512]); small: ([128,512], [128,512])",
        ),
        (
            "scaled_add(np.zeros((128, 512)), np.zeros((128, 512)))",
            "scaled_add() expects dtypes (float32, float32), got (float64, float64)",
        ),
        (
            "scaled_add(np.zeros((128, 512), np.float32), np.zeros((128, 512), np.float32), "
            "mode='fast')",
            "unknown mode 'fast'; choose one of auto, neuron, simulate, reference",
        ),
        ("scaled_add(np.zeros(1), z=1)", "scaled_add() got an unexpected keyword argument 'z'"),
        (
            "softmax(np.zeros((64, 1024), np.float32), mode='simulate')",
            "softmax: simulate mode runs NKI kernels under nki.simulate; this is a hlo kernel",
        ),
    ],
)
def test_bad_calls_are_clear_errors(python: Path, tmp_path: Path, call: str, message: str) -> None:
    script = f"""
        import numpy as np
        from acme_kernels import scaled_add, softmax
        from acme_kernels._runtime import KernelError
        try:
            {call}
        except (KernelError, TypeError) as error:  # TypeError: Python's own argument check
            print(error)
        """
    assert message in ok(run_in_venv(python, script, tmp_path))


def test_a_placeholder_neff_is_never_run_by_a_real_runtime(python: Path, tmp_path: Path) -> None:
    # A stand-in for the real spike: its core imports, it is not the double, and it must
    # not be used.
    (tmp_path / "spike").mkdir()
    (tmp_path / "spike" / "_spike.py").write_text("IS_NATIVE = True\n")
    (tmp_path / "spike" / "__init__.py").write_text(
        "class SpikeModel:\n"
        "    @staticmethod\n"
        "    def load_from_neff(*args, **kwargs):\n"
        "        raise AssertionError('a placeholder NEFF reached the runtime')\n"
    )
    script = """
        import numpy as np
        from acme_kernels import softmax
        from acme_kernels._runtime import KernelError
        logits = np.zeros((64, 1024), np.float32)
        print(softmax(logits).shape)  # auto: the NEFFs are placeholders, so reference
        try:
            softmax(logits, mode="neuron")
        except KernelError as error:
            print(error)
        """
    result = run_in_venv(python, script, tmp_path, PYTHONPATH=str(tmp_path), NKIBUILD_TARGET="trn2")
    lines = ok(result).splitlines()
    assert lines[0] == "(64, 1024)"
    assert "the NEFF for trn2/default is a placeholder written by nkibuild's toolchain" in lines[1]
    assert "runs in reference mode on the CPU: the NEFFs are placeholders" in result.stderr


def neff_io(project: Path, member: str) -> tuple[list, list]:
    with zipfile.ZipFile(project / "dist" / WHEEL) as archive:
        data = archive.read(member)
    scratch = project / "build" / "e2e-neff.neff"
    scratch.write_bytes(data)
    info = read_neff(scratch)
    pairs = [
        [[t.name, t.dtype, list(t.shape)] for t in tensors]
        for tensors in (info.inputs, info.outputs)
    ]
    return pairs[0], pairs[1]


@pytest.mark.parametrize("binding", ["nrtpy", "spike"])
def test_neuron_mode_through_the_double_passes_exact_names_dtypes_and_shapes(
    python: Path, project: Path, tmp_path: Path, binding: str
) -> None:
    log = tmp_path / "spike.jsonl"
    script = """
        import json, numpy as np, ml_dtypes
        from acme_kernels import matmul_rowsum, scaled_add
        x = np.ones((1024, 512), np.float32)
        out = scaled_add(x, x, mode="neuron")
        print(json.dumps([out.dtype.name, list(out.shape)]))
        a = np.ones((128, 256), ml_dtypes.bfloat16)
        b = np.ones((128, 512), ml_dtypes.bfloat16)
        outs = matmul_rowsum(a, b, mode="neuron")
        print(json.dumps([[o.dtype.name, list(o.shape)] for o in outs]))
        print(type(scaled_add.load("trn2", "large")).__name__)
        """
    result = run_in_venv(
        python,
        script,
        tmp_path,
        PYTHONPATH=str(FAKE_SPIKE),
        NKIBUILD_TARGET="trn2",
        NKIBUILD_FAKE_SPIKE_LOG=str(log),
        NKIBUILD_RUNTIME=binding,
    )
    *lines, model = ok(result).splitlines()
    assert model == f"{binding.title()}Model"
    events = [json.loads(line) for line in log.read_text().splitlines()]
    loads = [e for e in events if e["event"] == "load"]
    calls = [e for e in events if e["event"] == "call"]
    assert [Path(e["path"]).parts[-3:] for e in loads] == [
        ("trn2", "scaled_add", "large.neff"),  # the variant the shapes select
        ("trn2", "matmul_rowsum", "default.neff"),
    ]
    for call, member, printed in zip(
        calls,
        [
            "acme_kernels/neff/trn2/scaled_add/large.neff",
            "acme_kernels/neff/trn2/matmul_rowsum/default.neff",
        ],
        lines,
        strict=True,
    ):
        inputs, outputs = neff_io(project, member)
        received = [[name, spec["dtype"], spec["shape"]] for name, spec in call["inputs"].items()]
        assert received == inputs  # the NEFF's own names, dtypes and shapes, in its order
        returned = json.loads(printed)
        returned = returned if isinstance(returned[0], list) else [returned]
        assert returned == [[dtype, shape] for _, dtype, shape in outputs]


@pytest.mark.parametrize("binding", ["nrtpy", "spike"])
def test_the_runtime_lnc_setting_must_match_the_neff(
    python: Path, tmp_path: Path, binding: str
) -> None:
    script = """
        import numpy as np
        from acme_kernels import softmax
        from acme_kernels._runtime import KernelError
        try:
            softmax(np.zeros((64, 1024), np.float32), mode="neuron")
        except KernelError as error:
            print(error)
        """
    result = run_in_venv(
        python,
        script,
        tmp_path,
        PYTHONPATH=str(FAKE_SPIKE),
        NKIBUILD_TARGET="trn2",
        NEURON_LOGICAL_NC_CONFIG="1",
        NKIBUILD_RUNTIME=binding,
    )
    assert "compiled for lnc=2 but the Neuron runtime is set to NEURON_LOGICAL_NC_CONFIG=1" in ok(
        result
    )


SPLIT_MANIFEST = softmax_manifest(
    "{name: split-kernels, version: 0.2.0, split-targets: true}", reference=True
)


def test_split_targets_install_only_the_hosts_neffs(python: Path, tmp_path: Path) -> None:
    root = softmax_project(tmp_path / "split", SPLIT_MANIFEST)
    assert build(root).ok
    wheels = sorted(p.name for p in (root / "dist").iterdir())
    assert wheels == [f"split_kernels{t}-0.2.0-py3-none-any.whl" for t in ("", "_trn1", "_trn2")]
    with zipfile.ZipFile(root / "dist" / wheels[0]) as archive:
        metadata = archive.read("split_kernels-0.2.0.dist-info/METADATA").decode()
        assert not [n for n in archive.namelist() if n.endswith(".neff")]
    assert 'Requires-Dist: split-kernels-trn2==0.2.0; extra == "trn2"' in metadata
    assert "Provides-Extra: trn1\nProvides-Extra: trn2\nProvides-Extra: all" in metadata
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps"]
    subprocess.run(
        [*pip, str(root / "dist" / wheels[0]), str(root / "dist" / wheels[2])], check=True
    )
    log = tmp_path / "spike.jsonl"
    script = """
        import numpy as np
        from split_kernels import softmax
        from split_kernels._runtime import KernelError
        logits = np.zeros((64, 1024), np.float32)
        print(softmax(logits, mode="reference").shape)
        try:
            print(softmax(logits, mode="neuron").shape)
        except KernelError as error:
            print(error)
        """
    common = {"PYTHONPATH": str(FAKE_SPIKE), "NKIBUILD_FAKE_SPIKE_LOG": str(log)}
    on_trn2 = ok(run_in_venv(python, script, tmp_path, NKIBUILD_TARGET="trn2", **common))
    assert on_trn2.splitlines() == ["(64, 1024)", "(64, 1024)"]
    (load, *_) = [json.loads(line) for line in log.read_text().splitlines()]
    assert "split_kernels_trn2/neff/trn2/softmax/default.neff" in load["path"]
    on_trn1 = ok(run_in_venv(python, script, tmp_path, NKIBUILD_TARGET="trn1", **common))
    assert "pip install 'split-kernels[trn1]'" in on_trn1.splitlines()[1]
