"""The fake nki / torch / torch_xla / nkipy modules and the tracers that drive them.

The fakes are importable only where nkibuild puts them (a fake-toolchain worker's
PYTHONPATH), so everything that imports them runs in a subprocess here.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nkibuild.formats.backend_config import NKI_CUSTOM_CALLS
from nkibuild.formats.hlo import HloModuleInfo, read_hlo
from nkibuild.toolchain_double import FAKE_NKIPY_DIR, FAKES_DIR, fake_nki_version

KERNELS = Path(__file__).resolve().parents[1] / "examples" / "nki-nkipy" / "kernels"

ELEMENTWISE = """\
import nki
import nki.language as nl


@nki.jit
def exp_scale_add(a, b, scale):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(a.shape[0] // nl.tile_size.pmax):
        rows = slice(i * nl.tile_size.pmax, (i + 1) * nl.tile_size.pmax)
        tile = nl.add(nl.multiply(nl.exp(nl.load(a[rows])), scale), nl.load(b[rows]))
        nl.store(out[rows], value=tile)
    return out
"""


def run_python(
    script: str, env: dict[str, str] | None = None, fakes: bool = True, stdin: str | None = None
) -> str:
    """Run `script` in a fresh interpreter (with the fakes importable); return its stdout."""
    base = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("NEURON")}
    if fakes:
        base["PYTHONPATH"] = os.pathsep.join([str(FAKES_DIR), str(FAKE_NKIPY_DIR)])
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        env={**base, **(env or {})},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def extraction_env(cache: Path, target: str = "trn2") -> dict[str, str]:
    return {
        "NEURON_EXTRACT_GRAPHS_ONLY": "1",
        "NEURON_COMPILE_CACHE_URL": str(cache),
        "NEURON_PLATFORM_TARGET_OVERRIDE": target,
    }


def dumped_modules(cache: Path) -> dict[Path, HloModuleInfo]:
    return {
        pb.parent: read_hlo(pb.read_bytes())
        for pb in sorted(cache.glob("neuronxcc-*/MODULE_*/model.hlo_module.pb"))
    }


def kernel_modules(cache: Path) -> dict[Path, HloModuleInfo]:
    return {
        directory: module
        for directory, module in dumped_modules(cache).items()
        if any(call.target in NKI_CUSTOM_CALLS for call in module.custom_calls)
    }


def nki_config(module: HloModuleInfo) -> dict:
    (call,) = [c for c in module.custom_calls if c.target in NKI_CUSTOM_CALLS]
    return json.loads(base64.b64decode(call.backend_config))


# --- import isolation ------------------------------------------------------------------


def test_fakes_are_not_importable_without_their_directory() -> None:
    # The real nkipy may be installed (CI installs it); the doubles must never be found.
    script = """
        import importlib.util
        for name in ("nki", "nkipy", "torch_xla"):
            spec = importlib.util.find_spec(name)
            print(spec.origin if spec else None)
    """
    origins = run_python(script, fakes=False).split()
    assert len(origins) == 3
    assert [origin for origin in origins if origin.startswith(str(FAKES_DIR))] == []
    assert str(FAKES_DIR) not in sys.path
    assert not (FAKES_DIR / "__init__.py").exists()  # not a package of nkibuild
    assert not (FAKE_NKIPY_DIR / "__init__.py").exists()


def test_every_fake_module_says_it_is_the_toolchain_double() -> None:
    for path in [*FAKES_DIR.rglob("*.py"), *FAKE_NKIPY_DIR.rglob("*.py")]:
        assert "toolchain double" in path.read_text().split('"""')[1], path


# --- nki.simulate ----------------------------------------------------------------------


def test_simulate_runs_the_example_tiled_matmul_and_an_elementwise_kernel(tmp_path: Path) -> None:
    # NKI 0.3: the launch grid as matmul[2] (NKI 0.7 takes it from the environment)
    (tmp_path / "elementwise.py").write_text(ELEMENTWISE)
    script = f"""
        import sys
        import numpy as np, ml_dtypes, nki
        sys.path[:0] = [{str(KERNELS)!r}, {str(tmp_path)!r}]
        from nki_kernels import matmul_tiled as matmul
        from elementwise import exp_scale_add

        rng = np.random.default_rng(0)
        lhsT = rng.standard_normal((512, 256), dtype=np.float32)
        rhs = rng.standard_normal((512, 1024), dtype=np.float32)
        out = nki.simulate(matmul)(lhsT, rhs)
        np.testing.assert_allclose(out, lhsT.T @ rhs, rtol=1e-4, atol=1e-3)

        bf16 = ml_dtypes.bfloat16
        half = nki.simulate(matmul[2])(lhsT.astype(bf16), rhs.astype(bf16))
        assert half.dtype == ml_dtypes.bfloat16 and half.shape == (256, 1024)

        a, b = rng.standard_normal((2, 256, 64), dtype=np.float32)
        out = nki.simulate(exp_scale_add)(a, b, scale=0.5)
        np.testing.assert_allclose(out, np.exp(a) * 0.5 + b, rtol=1e-6)
        try:
            matmul(lhsT, rhs)
        except RuntimeError as error:
            print(error)
    """
    assert "cannot run matmul_tiled on a device" in run_python(
        script, {"NKIBUILD_FAKE_NKI_VERSION": "0.3.0"}
    )


LNC_PROBE = """
    import nki, nki.language as nl

    @nki.jit
    def probe(a):
        return a * nl.num_programs()

    def grid(make):
        try:
            return int(nki.simulate(make())(1))
        except TypeError as error:
            return "refused: " + str(error)

    print(grid(lambda: probe), "|", grid(lambda: probe[2]))
"""


@pytest.mark.parametrize(
    ("version", "config", "expected"),
    [
        ("0.3.0", None, ["1", "2"]),  # NKI 0.3-0.6: the bracket grid, 1 by default
        ("0.3.0", "2", ["1", "2"]),  # ... and the variable is the runtime's only
        ("0.7.0", "2", ["2", "refused: probe[2]: NKI 0.7.0 takes the launch grid from"]),
    ],
)
def test_the_fake_nki_takes_the_lnc_where_its_release_does(
    version: str, config: str | None, expected: list[str]
) -> None:
    env = {"NKIBUILD_FAKE_NKI_VERSION": version}
    env.update({"NEURON_LOGICAL_NC_CONFIG": config} if config else {})
    found = [part.strip() for part in run_python(LNC_PROBE, env).split("|")]
    assert [part[: len(want)] for part, want in zip(found, expected, strict=True)] == expected


def test_the_fake_nki_refuses_platform_target_from_0_3_and_ignores_mode() -> None:
    script = """
        import numpy as np, nki
        kernel = nki.jit(lambda a: a + 1, mode="simulation")
        try:
            print(kernel(np.zeros(2)))
        except RuntimeError as error:
            print("ignored:", error)
        try:
            nki.jit(lambda a: a, platform_target="trn2")
        except TypeError as error:
            print(error)
    """
    old = run_python(script, {"NKIBUILD_FAKE_NKI_VERSION": "0.2.0"})
    assert old.startswith("[1. 1.]")  # before 0.3, mode="simulation" ran it on NumPy
    new = run_python(script, {"NKIBUILD_FAKE_NKI_VERSION": "0.3.0"})
    assert new.startswith("ignored: nkibuild's toolchain double cannot run")
    assert "unexpected keyword argument 'platform_target'" in new


def test_isa_instructions_of_the_nki_tutorials_simulate() -> None:
    script = """
        import numpy as np, nki, nki.isa as nisa, nki.language as nl

        def matmul(lhsT, rhs):
            shape = (lhsT.shape[1], rhs.shape[1])
            result = nl.ndarray(shape, dtype=lhsT.dtype, buffer=nl.shared_hbm)
            psum = nl.ndarray(result.shape, dtype=nl.float32, buffer=nl.psum)
            for k in nl.affine_range(lhsT.shape[0] // 128):
                a = nl.ndarray((128, lhsT.shape[1]), dtype=lhsT.dtype, buffer=nl.sbuf)
                b = nl.ndarray((128, rhs.shape[1]), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=a, src=lhsT[k * 128 : (k + 1) * 128])
                nisa.dma_copy(dst=b, src=rhs[k * 128 : (k + 1) * 128])
                nisa.nc_matmul(dst=psum, stationary=a, moving=b)
            nisa.tensor_copy(dst=result, src=psum, dtype=lhsT.dtype)
            return result

        lhsT, rhs = np.ones((256, 128), np.float32), np.ones((256, 64), np.float32)
        print(float(nki.simulate(matmul)(lhsT, rhs).max()))
    """
    assert run_python(script).strip() == "256.0"


# --- torch_xla graph extraction ----------------------------------------------------------

EXTRACT = f"""
    import sys
    import torch
    import torch_xla.core.xla_model as xm
    sys.path.insert(0, {str(KERNELS)!r})
    from nki_kernels import matmul_tiled as matmul

    device = xm.xla_device()
    lhsT = torch.zeros((256, 128), dtype=torch.bfloat16).to(device)
    rhs = torch.zeros((256, 512), dtype=torch.bfloat16).to(device)
    out = matmul(lhsT, rhs)  # an nki.jit kernel dispatches on XLA tensors (NKI 0.3)
    print(out.shape, out.dtype)
    xm.mark_step()
"""


def test_mark_step_dumps_glue_and_kernel_modules_like_torch_xla(tmp_path: Path) -> None:
    cache = tmp_path / "neuron-cache"
    stdout = run_python(EXTRACT, extraction_env(cache, "trn1"))
    assert stdout.strip() == "(128, 512) torch.bfloat16"

    modules = dumped_modules(cache)
    assert len(modules) >= 2
    (compiler_dir,) = {directory.parent.name for directory in modules}
    assert compiler_dir.startswith("neuronxcc-")
    ((kernel_dir, kernel),) = kernel_modules(cache).items()
    assert [(p.shape.dtype, p.shape.dims) for p in kernel.parameters] == [
        ("bfloat16", (256, 128)),
        ("bfloat16", (256, 512)),
    ]
    assert [str(o) for o in kernel.outputs()] == ["bfloat16[128,512]"]

    # Choosing the largest module would pick runtime glue, as it can for real.
    sizes = {d: (d / "model.hlo_module.pb").stat().st_size for d in modules}
    assert max(sizes, key=sizes.__getitem__) != kernel_dir

    config = nki_config(kernel)
    compiled = Path(config["bir_path"])
    assert compiled.is_absolute() and compiled.is_file()
    assert cache.resolve() not in compiled.resolve().parents
    assert config["func_name"] == "matmul_tiled" and config["platform_target"] == "trn1"
    for directory in modules:
        flags = json.loads((directory / "compile_flags.json").read_text())
        assert "--target=trn1" in flags and "--framework=XLA" in flags


def test_dumps_are_deterministic_though_compiled_files_move(tmp_path: Path) -> None:
    first, second = tmp_path / "one", tmp_path / "two"
    run_python(EXTRACT, extraction_env(first))
    run_python(EXTRACT, extraction_env(second))
    names = [sorted(d.name for d in dumped_modules(cache)) for cache in (first, second)]
    assert names[0] == names[1]
    paths = [
        nki_config(m)["bir_path"]
        for cache in (first, second)
        for m in kernel_modules(cache).values()
    ]
    assert paths[0] != paths[1]
    assert Path(paths[0]).read_bytes() == Path(paths[1]).read_bytes()


def test_mark_step_refuses_to_execute_without_graph_extraction() -> None:
    script = """
        import torch_xla.core.xla_model as xm
        try:
            xm.mark_step()
        except RuntimeError as error:
            print(error)
    """
    assert "cannot execute on a device" in run_python(script)


# --- nkipy -------------------------------------------------------------------------------


def test_nkipy_trace_names_parameters_after_the_python_arguments(tmp_path: Path) -> None:
    output = tmp_path / "rmsnorm.pb"
    script = f"""
        import sys
        import numpy as np
        from nkipy.core.trace import NKIPyKernel
        sys.path.insert(0, {str(KERNELS)!r})
        from nkipy_kernels import rmsnorm

        kernel = NKIPyKernel.trace(rmsnorm)
        kernel.specialize(np.zeros((64, 256), np.float32), np.zeros(256, np.float32), eps=1e-6)
        open({str(output)!r}, "wb").write(kernel._code.to_proto().SerializeToString())
    """
    run_python(script)
    module = read_hlo(output.read_bytes())
    assert [p.name for p in module.parameters] == ["x", "weight"]
    assert [str(o) for o in module.outputs()] == ["float32[64,256]"]
    assert module.custom_calls == ()


# --- tracers end to end in a worker --------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "route", "grid"), [("0.3.0", "torch-xla", True), ("0.7.0", "nkipy", False)]
)
def test_tracers_run_in_a_fake_toolchain_worker(
    tmp_path: Path, version: str, route: str, grid: bool
) -> None:
    cache = tmp_path / "worker-cache"
    cache.mkdir()
    matmul = {
        "frontend": "nki",
        "root": str(KERNELS),
        "path": "nki_kernels.py",
        "function": "matmul_tiled",
        "inputs": [
            {"name": "lhsT", "shape": [256, 128], "dtype": "float32"},
            {"name": "rhs", "shape": [256, 512], "dtype": "float32"},
        ],
        "constants": [],
        "lnc": 2,
        "nki_route": route,
        "lnc_grid": grid,
        "cache_dir": str(cache),
        "own_modules": [str(FAKES_DIR), str(FAKE_NKIPY_DIR)],  # as a Toolchain value says
    }
    rmsnorm = {
        **matmul,
        "frontend": "nkipy",
        "path": "nkipy_kernels.py",
        "function": "rmsnorm",
        "inputs": [
            {"name": "x", "shape": [8, 32], "dtype": "bfloat16"},
            {"name": "weight", "shape": [32], "dtype": "bfloat16"},
        ],
        "constants": [["eps", 1e-6]],
    }
    # The same kernel twice: the second trace must find its (identical) dump again.
    jobs = [
        {**matmul, "output": str(tmp_path / "first.pb")},
        {**matmul, "output": str(tmp_path / "again.pb")},
        {**rmsnorm, "output": str(tmp_path / "rmsnorm.pb")},
    ]
    stdout = run_python(
        "import sys; from nkibuild.toolchain.worker import main; main(['--serve'])",
        {**extraction_env(cache), "NKIBUILD_FAKE_NKI_VERSION": version},
        stdin="".join(json.dumps(job) + "\n" for job in jobs),
    )
    results = [json.loads(line) for line in stdout.splitlines()]
    assert [r["ok"] for r in results] == [True, True, True], results

    first, again = (tmp_path / "first.pb").read_bytes(), (tmp_path / "again.pb").read_bytes()
    module = read_hlo(first)
    # The LNC reached the kernel: kernel[2] before NKI 0.7, NEURON_LOGICAL_NC_CONFIG from 0.7.
    assert nki_config(module)["grid"] == 2 and nki_config(module)["platform_target"] == "trn2"
    assert [str(o) for o in module.outputs()] == ["float32[128,512]"]
    assert read_hlo(again).parameters == module.parameters
    versions = results[0]["versions"]
    # Versions the double's modules declare, not those of a same-named installed package.
    assert versions["nki"] == f"{version}+nkibuild.fake"
    if route == "torch-xla":
        assert versions["torch_xla"].endswith("+nkibuild.fake")
        assert json.loads(versions["compile_flags"]) == ["--target=trn2", "--framework=XLA"]
    else:  # nkipy's NKI op: the module's parameters are the kernel's, by name
        assert versions["nkipy"].endswith("+nkibuild.fake") and "torch_xla" not in versions
        assert [p.name for p in module.parameters] == ["lhsT", "rhs"]

    norm = read_hlo((tmp_path / "rmsnorm.pb").read_bytes())
    assert [(p.name, str(p.shape)) for p in norm.parameters] == [
        ("x", "bfloat16[8,32]"),
        ("weight", "bfloat16[32]"),
    ]
    assert results[2]["versions"]["nkipy"].endswith("+nkibuild.fake")


@pytest.mark.parametrize("lnc", [None, 1])
def test_nki_launcher_leaves_single_core_kernels_alone(lnc: int | None) -> None:
    from nkibuild.toolchain.tracers import nki_launcher

    class Kernel:
        def __getitem__(self, grid: int) -> str:
            return f"grid {grid}"

    kernel = Kernel()
    assert nki_launcher(kernel, lnc) is kernel
    assert nki_launcher(kernel, 2) == "grid 2"


@pytest.mark.parametrize(
    ("layout", "wrapper"),
    [("0.2.0", "PyTorchXLAKernel"), ("0.3.0", "JitKernel")],  # NKI 0.3 removed nki._torch_xla
)
def test_nki_launcher_wraps_plain_functions_as_the_installed_nki_expects(
    layout: str, wrapper: str
) -> None:
    script = """
        from nkibuild.toolchain.tracers import nki_launcher

        def kernel(a):
            return a

        launched = nki_launcher(kernel, 2)
        print(type(launched).__name__, getattr(launched, "kernel", launched).grid)
    """
    env = {"NKIBUILD_FAKE_NKI_VERSION": layout}
    assert run_python(script, env).strip() == f"{wrapper} 2"


def test_the_nki_0_3_and_later_double_has_no_torch_xla_module() -> None:
    script = """
        import nki
        try:
            import nki._torch_xla
        except ImportError as error:
            print(nki.__version__, "|", error)
    """
    version, _, error = run_python(script).strip().partition(" | ")
    # The release the toolchain value reports for the double is the fake's.
    assert version == f"{fake_nki_version()}+nkibuild.fake" and "removed in NKI 0.3" in error
