"""Frontends end to end: nki and nkipy through the toolchain double, jax and hlo for real;
module choice, relocation, hash stability and signature checks."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import build, write_project

from nkibuild.compiler import CompileOptions, compile_unit
from nkibuild.errors import BuildError
from nkibuild.formats.backend_config import NKI_CUSTOM_CALLS, decode, map_strings
from nkibuild.formats.hlo import read_hlo
from nkibuild.frontends import load_artifact
from nkibuild.frontends.relocation import (
    MARKER,
    materialize,
    normalized_hash,
    relocate,
)
from nkibuild.manifest import load_manifest
from nkibuild.plan import resolve
from nkibuild.toolchain import resolve_toolchain
from nkibuild.toolchain.harvest import DumpedModule, choose_kernel_module, find_modules
from nkibuild.toolchain_double import FAKES_DIR
from nkibuild.toolchain_double.hlo_writer import build_hlo_module


def local_references(data: bytes) -> list[tuple[str, str]]:
    """(instruction, absolute path) pairs still present in NKI custom-calls."""
    found: list[tuple[str, str]] = []

    def note(instruction: str, value: str) -> str:
        if os.path.isabs(value):
            found.append((instruction, value))
        return value

    for call in read_hlo(data).custom_calls:
        config = decode(call.backend_config) if call.target in NKI_CUSTOM_CALLS else None
        if config is not None:
            map_strings(config[0], lambda value, name=call.instruction: note(name, value))
    return found


KERNELS = """\
import nki
import nki.language as nl
import numpy as np



@nki.jit
def add_kernel(a, b):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.add(nl.load(a), nl.load(b)))
    return out


def softplus(x, beta):
    return np.log1p(np.exp(beta * x)) / beta
"""

MANIFEST = """\
format-version: 1
package: {name: frontends, version: 1.0.0}
defaults: {targets: [trn2, trn3]}
kernels:
  add_kernel:
    frontend: nki
    source: k.py:add_kernel
    inputs:
      a: {shape: [128, 512], dtype: float32}
      b: {shape: [128, 512], dtype: float32}
  softplus:
    frontend: nkipy
    source: k.py:softplus
    inputs:
      x: {shape: [64, 32], dtype: float32}
    constants: {beta: 2.0}
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return write_project(tmp_path / "a" / "project", MANIFEST, {"k.py": KERNELS})


def artifact_dir(project: Path, name: str) -> Path:
    return project / "build" / "extract" / name


def test_nki_kernel_is_extracted_per_target_and_made_relocatable(project: Path) -> None:
    summary = build(project)
    assert summary.ok, summary.to_json()
    assert {"extract:add_kernel/default/trn2", "extract:add_kernel/default/trn3"} <= set(
        summary.executed
    )
    artifact = load_artifact(artifact_dir(project, "add_kernel/default/trn2"))
    assert artifact.frontend == "nki"
    assert [t.shape for t in artifact.inputs] == [(128, 512), (128, 512)]
    assert [t.shape for t in artifact.outputs] == [(128, 512)]
    (sidecar,) = artifact.sidecars
    assert (artifact.directory / sidecar).read_bytes().startswith(b"nkibuild toolchain double")
    stored = artifact.portable_hlo()
    assert local_references(stored) == []  # no absolute path left in the artifact
    (call,) = [c for c in read_hlo(stored).custom_calls if c.target in NKI_CUSTOM_CALLS]
    config = json.loads(base64.b64decode(call.backend_config))
    assert config["bir_path"] == MARKER + sidecar
    assert dict(artifact.toolchain)["nki"].endswith("+nkibuild.fake")  # the double, not PyPI nki


PLAIN_NKI = """\
import nki.language as nl


def scale(a, factor):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.multiply(nl.load(a), factor))
    return out
"""


@pytest.mark.parametrize(
    ("nki", "route"),
    # before 0.3 through nki._torch_xla.PyTorchXLAKernel; 0.3 (SDK 2.29) on XLA tensors
    # through nki.jit; from 0.4 through nkipy's NKI op, with the LNC from the environment in 0.7
    [("0.2.0", "torch_xla"), ("0.3.0", "torch_xla"), ("0.5.0", "nkipy"), ("0.7.0", "nkipy")],
)
def test_a_plain_nki_function_builds_by_the_route_of_the_nki_in_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nki: str, route: str
) -> None:
    monkeypatch.setenv("NKIBUILD_FAKE_NKI_VERSION", nki)
    manifest = (
        "format-version: 1\npackage: {name: plain, version: 1.0.0}\n"
        "defaults: {targets: [trn3], lnc: 2}\nkernels:\n  scale:\n    frontend: nki\n"
        "    source: k.py:scale\n    inputs:\n      a: {shape: [128, 64], dtype: float32}\n"
        "    constants: {factor: 3.0}\n"
    )
    project = write_project(tmp_path / "p", manifest, {"k.py": PLAIN_NKI})
    summary = build(project)
    assert summary.ok, summary.to_json()
    artifact = load_artifact(artifact_dir(project, "scale/default/trn3"))
    versions = dict(artifact.toolchain)
    assert versions["nki"] == f"{nki}+nkibuild.fake" and route in versions
    (call,) = [
        c for c in read_hlo(artifact.portable_hlo()).custom_calls if c.target in NKI_CUSTOM_CALLS
    ]
    config = json.loads(base64.b64decode(call.backend_config))
    # The kernel ran with the unit's LNC and target; its compile got the same --lnc.
    assert (config["grid"], config["platform_target"]) == (2, "trn3")
    args = json.loads((project / "build/compile/scale/default/trn3/result.json").read_text())[
        "compile_args"
    ]
    assert args[args.index("--lnc") + 1] == "2"


def test_an_nki_kernel_without_a_route_fails_naming_both(tmp_path: Path) -> None:
    from dataclasses import replace

    from nkibuild.frontends import Tracing, extract
    from nkibuild.frontends.failures import TraceFailures
    from nkibuild.toolchain.nki import detect
    from nkibuild.toolchain.worker_pool import WorkerPool

    host = detect("auto")
    if host.route is not None:
        pytest.skip(f"this host extracts NKI kernels ({host.describe()})")
    project = write_project(tmp_path / "p", MANIFEST, {"k.py": KERNELS})
    manifest = load_manifest(project / "nkibuild.yaml")
    spec = next(u.extract for u in resolve(manifest) if u.kernel == "add_kernel")
    toolchain = replace(resolve_toolchain("fake", tmp_path / "state"), nki=host)
    with pytest.raises(BuildError) as refused:
        extract(spec, project, tmp_path / "out", toolchain, Tracing(WorkerPool(), TraceFailures()))
    message = refused.value.message
    assert "nkipy" in message and "nki >= 0.4" in message and "torch-xla" in message


def test_nkipy_kernel_uses_python_parameter_names_and_constants(project: Path) -> None:
    assert build(project).ok
    artifact = load_artifact(artifact_dir(project, "softplus/default"))
    module = read_hlo(artifact.portable_hlo())
    assert [p.name for p in module.parameters] == ["x"]  # beta is a constant, not a tensor
    assert [str(o) for o in module.outputs()] == ["float32[64,32]"]
    assert not (project / "build" / "extract" / "softplus" / "default" / "trn1").exists()


def test_moved_artifact_still_compiles(project: Path, tmp_path: Path) -> None:
    assert build(project).ok
    moved = tmp_path / "elsewhere" / "artifact"
    shutil.copytree(artifact_dir(project, "add_kernel/default/trn2"), moved)
    shutil.rmtree(project / "build")  # the original location is gone
    artifact = load_artifact(moved)
    text = materialize(artifact.portable_hlo(), moved)
    (path,) = [p for _, p in local_references(text)]
    assert Path(path) == (moved / artifact.sidecars[0]).resolve()
    manifest = load_manifest(project / "nkibuild.yaml")
    unit = next(u for u in resolve(manifest) if u.name == "add_kernel/default/trn2")
    toolchain = resolve_toolchain("fake")
    result = compile_unit(unit, artifact, toolchain, tmp_path / "out", CompileOptions())
    assert result.origin == "compiled" and result.placeholder


def test_same_nki_kernel_hashes_the_same_in_two_checkouts(project: Path, tmp_path: Path) -> None:
    other = write_project(tmp_path / "b" / "elsewhere", MANIFEST, {"k.py": KERNELS})
    assert build(project).ok and build(other).ok
    for name in ("add_kernel/default/trn2", "softplus/default"):
        first = load_artifact(artifact_dir(project, name)).content_hash
        assert first == load_artifact(artifact_dir(other, name)).content_hash, name
    # ...so the second checkout compiled nothing: every NEFF came from the shared cache.


def test_signature_mismatch_names_the_input(tmp_path: Path) -> None:
    hlo = build_hlo_module("m", [("p0", "float32", (4, 8))], [("float32", (4, 8))])
    manifest = MANIFEST.split("kernels:")[0] + (
        "kernels:\n  k:\n    frontend: hlo\n    source: k.pb\n"
        "    inputs: {x: {shape: [8, 4], dtype: float32}}\n"
    )
    project = write_project(tmp_path / "p", manifest, {"k.pb": hlo})
    summary = build(project)
    (failure,) = summary.failures
    assert "signature mismatch" in failure.detail
    assert (
        "input 'x' is declared float32[8,4] but HLO parameter 0 (p0) is float32[4,8]"
        in failure.detail
    )


def bir_module(bir: Path, name: str = "k", target: str = "AwsNeuronCustomNativeKernel") -> bytes:
    config = base64.b64encode(json.dumps({"bir_path": str(bir), "grid": 1}).encode())
    return build_hlo_module(name, [("p0", "float32", (4,))], [("float32", (4,))], (target, config))


@pytest.mark.parametrize("target", sorted(NKI_CUSTOM_CALLS))
def test_relocation_hash_depends_on_content_not_location(tmp_path: Path, target: str) -> None:
    hashes = []
    for place, content in (("one", b"same"), ("two", b"same"), ("three", b"different")):
        bir = tmp_path / place / "kernel.klir"
        bir.parent.mkdir()
        bir.write_bytes(content)
        artifact = tmp_path / place / "artifact"
        data, sidecars = relocate(bir_module(bir, target=target), artifact, [tmp_path / place])
        hashes.append(normalized_hash(data, artifact, sidecars))
    assert hashes[0] == hashes[1] != hashes[2]


def test_relocation_refuses_a_missing_file_and_leaves_other_configs(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="does not exist"):
        relocate(bir_module(tmp_path / "gone.klir"), tmp_path / "artifact", [tmp_path])
    opaque = build_hlo_module(
        "m",
        [("p0", "float32", (4,))],
        [("float32", (4,))],
        ("AwsNeuronCustomNativeKernel", b"{not base64"),
    )
    assert relocate(opaque, tmp_path / "artifact", [tmp_path]) == (opaque, [])


def dump(cache: Path, name: str, module: bytes) -> Path:
    directory = cache / "neuronxcc-2.23" / f"MODULE_{name}+flags"
    directory.mkdir(parents=True)
    (directory / "model.hlo_module.pb").write_bytes(module)
    (directory / "compile_flags.json").write_text('["--target=trn2"]')
    return directory


def test_harvest_chooses_by_content_not_size(tmp_path: Path) -> None:
    bir = tmp_path / "k.klir"
    bir.write_bytes(b"bir")
    glue = build_hlo_module(
        "glue", [(f"p{i}", "float32", (4,)) for i in range(20)], [("float32", (4,))]
    )
    kernel = bir_module(bir)
    assert len(glue) > len(kernel)
    dump(tmp_path / "cache", "glue", glue)
    chosen = choose_kernel_module(find_modules(tmp_path / "cache"), "k")
    assert chosen.directory.name == "MODULE_glue+flags"  # the only module, custom-call or not
    kernel_dir = dump(tmp_path / "cache", "kernel", kernel)
    modules = find_modules(tmp_path / "cache")
    chosen = choose_kernel_module(modules, "k")
    assert chosen.directory == kernel_dir and chosen.flags == ("--target=trn2",)
    assert find_modules(tmp_path / "cache", since={m.directory for m in modules}) == []


def test_harvest_reports_zero_and_ambiguous_candidates(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="no HLO module was dumped for k"):
        choose_kernel_module([], "k")
    plain = DumpedModule(tmp_path / "MODULE_a", b"", (), 0, 10)
    with pytest.raises(BuildError, match="none of the dumped modules of k"):
        choose_kernel_module([plain, DumpedModule(tmp_path / "MODULE_b", b"", (), 0, 20)], "k")
    nki = DumpedModule(tmp_path / "MODULE_c", b"", (), 1, 30)
    with pytest.raises(BuildError, match="ambiguous"):
        choose_kernel_module([nki, DumpedModule(tmp_path / "MODULE_d", b"", (), 1, 40)], "k")


def test_retracing_in_one_worker_gives_identical_artifacts(tmp_path: Path) -> None:
    pytest.importorskip("jax")
    manifest = MANIFEST.split("kernels:")[0] + (
        "kernels:\n  twice:\n    frontend: jax\n    source: j.py:f\n"
        "    inputs: {x: {shape: [4, 4], dtype: float32}}\n"
        "    variants: {a: {x: [4, 4]}, b: {x: [8, 4]}, c: {x: [4, 4]}}\n"
    )
    project = write_project(tmp_path / "p", manifest, {"j.py": "def f(x):\n    return x * 2\n"})
    assert build(project).ok
    first = (artifact_dir(project, "twice/a") / "model.hlo_module.pb").read_bytes()
    assert first == (artifact_dir(project, "twice/c") / "model.hlo_module.pb").read_bytes()


def test_fake_nki_simulate_runs_the_example_matmul(tmp_path: Path) -> None:
    example = Path(__file__).parents[1] / "examples" / "nki-nkipy" / "kernels" / "nki_kernels.py"
    script = (
        "import importlib.util, numpy as np\n"
        f"spec = importlib.util.spec_from_file_location('k', {str(example)!r})\n"
        "k = importlib.util.module_from_spec(spec); spec.loader.exec_module(k)\n"
        "import nki\n"
        "rng = np.random.default_rng(1)\n"
        "lhsT = rng.standard_normal((256, 128), dtype=np.float32)\n"
        "rhs = rng.standard_normal((256, 512), dtype=np.float32)\n"
        "out = nki.simulate(k.matmul_tiled)(lhsT, rhs)\n"
        "np.testing.assert_allclose(out, lhsT.T @ rhs, rtol=1e-4, atol=1e-4)\n"
        "print('ok', out.shape)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(FAKES_DIR)}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok (128, 512)"


def test_workers_remove_their_temp_dirs(project: Path) -> None:
    from nkibuild.toolchain.worker_pool import Worker, WorkerKey

    worker = Worker(WorkerKey(str(project), sys.executable, "nki", "trn2", (str(FAKES_DIR),)))
    scratch = worker.scratch
    assert worker.cache_dir.is_dir()
    worker.close()
    assert not scratch.exists()
