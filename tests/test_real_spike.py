"""Against spike's REAL Python layer (../shared/thirdparty/spike-py, aws-neuron/nkipy):

- nkibuild's CPU core (`spike._spike`) implements the native core's interface exactly as
  `_spike.pyi` declares it;
- the double's own Python layer (what `verify --with-double` uses) has the public
  signatures of the real one;
- a generated bundle runs in neuron mode through spike's real `SpikeModel` /
  `SpikeTensor` on that core, and refuses its placeholder NEFFs on any other core.

spike's files are copied next to the core in a temporary directory at test time (see
`real_spike_runtime`); nothing of spike's is in this repository. Every test skips, saying
why, where ../shared/thirdparty is absent.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import pytest
from helpers import build
from test_fake_spike import FAKE_RUNTIME, REAL_SPIKE, real_spike_runtime

from nkibuild.formats.neff import read_neff
from nkibuild.toolchain_double.neff_writer import NeffTensor, write_neff

REPO = Path(__file__).resolve().parents[1]
RUNTIME = REPO / "nkibuild" / "bundle" / "runtime.py"  # vendored into every bundle
WHEEL = "acme_kernels-0.1.0-py3-none-any.whl"
# spike's `spike-run` command line is not part of the double (bundles never use it).
NOT_IMITATED = frozenset({"cli"})
# Dunder methods that are part of a class's calling interface.
CALLING_DUNDERS = ("__init__", "__call__", "__getattr__", "__enter__", "__exit__")


# --- the core against _spike.pyi ----------------------------------------------------------


def declared_interface(pyi: Path) -> dict[str, Any]:
    """Per class of the stub: each def's (name, parameters with kinds and defaults,
    annotations, return annotation), or "property"."""
    interface: dict[str, Any] = {}
    for node in ast.parse(pyi.read_text()).body:
        if isinstance(node, ast.ClassDef):
            members = {}
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    decorators = {ast.unparse(d) for d in item.decorator_list}
                    members[item.name] = (
                        "property" if "property" in decorators else _stub_signature(item)
                    )
            interface[node.name] = {
                "bases": [ast.unparse(b) for b in node.bases],
                "members": members,
            }
    return interface


def _text(node: ast.expr | None) -> str | None:
    return ast.unparse(node) if node is not None else None


def _stub_signature(function: ast.FunctionDef) -> list[Any]:
    args = function.args
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + [
        ast.unparse(d) for d in args.defaults
    ]
    parameters = [
        [
            a.arg,
            "POSITIONAL_OR_KEYWORD",
            default,
            ast.unparse(a.annotation) if a.annotation else None,
        ]
        for a, default in zip(positional, defaults, strict=True)
    ]
    if args.vararg:
        parameters.append([args.vararg.arg, "VAR_POSITIONAL", None, None])
    returns = ast.unparse(function.returns) if function.returns else None
    return [parameters, returns]


CORE_INTERFACE = """
import inspect, json, sys
sys.path.insert(0, {runtime!r})
from spike import _spike

def signature(function):
    sig = inspect.signature(function)
    parameters = []
    for p in sig.parameters.values():
        default = None if p.default is p.empty else repr(p.default)
        annotation = None if p.annotation is p.empty else str(p.annotation)
        parameters.append([p.name, p.kind.name, default, annotation])
    returns = None if sig.return_annotation is sig.empty else str(sig.return_annotation)
    return [parameters, returns]

interface = {{}}
for name in {classes!r}:
    cls = getattr(_spike, name)
    members = {{}}
    for member, value in vars(cls).items():
        if member.startswith("_") and not (member.startswith("__") and member in {dunders!r}):
            continue
        if isinstance(value, property):
            members[member] = "property"
        elif isinstance(value, staticmethod):
            members[member] = signature(value.__func__)
        elif callable(value):
            members[member] = signature(value)
    if name in {without_constructor!r}:
        # The stub declares no constructor: nanobind then refuses to create one.
        try:
            cls()
        except TypeError as error:
            if "No constructor defined" in str(error):
                members.pop("__init__", None)
    interface[name] = {{"bases": [b.__name__ for b in cls.__bases__ if b is not object],
                       "members": members}}
print(json.dumps(interface))
"""


def test_the_cpu_core_implements_spike_pyi_exactly() -> None:
    stub = REAL_SPIKE / "_spike.pyi"
    if not stub.is_file():
        pytest.skip(f"{stub} is absent (spike's stub lives in ../shared/thirdparty/spike-py)")
    declared = declared_interface(stub)
    dunders = sorted({m for c in declared.values() for m in c["members"] if m.startswith("__")})
    without_constructor = [
        name
        for name, cls in declared.items()
        if not cls["bases"] and "__init__" not in cls["members"]
    ]
    script = CORE_INTERFACE.format(
        runtime=str(FAKE_RUNTIME),
        classes=sorted(declared),
        dunders=dunders,
        without_constructor=without_constructor,
    )
    result = subprocess.run(
        [sys.executable, "-I", "-c", script], capture_output=True, text=True, check=True
    )
    implemented = json.loads(result.stdout)
    # The stub's `__repr__(self) -> str: ...` and the core's match too: names, parameter
    # kinds, defaults and annotations, as text.
    for name, cls in declared.items():
        assert implemented[name]["bases"] == cls["bases"], name
        assert implemented[name]["members"] == cls["members"], name


# --- the double's Python layer against the real one ---------------------------------------

PUBLIC_SIGNATURES = """
import dataclasses, importlib, inspect, json, sys
sys.path.insert(0, {runtime!r})
import spike

def describe(obj):
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    # Names, kinds and defaults: what a caller can pass. (Annotations are not compared:
    # spike writes Dict/Optional, the double `dict`/`X | None`.)
    return [[p.name, p.kind.name, None if p.default is p.empty else repr(p.default)]
            for p in sig.parameters.values()]

def describe_class(cls):
    members = {{"<class>": describe(cls)}}
    for name, value in vars(cls).items():
        if name.startswith("_") and name not in {dunders!r}:
            continue
        if isinstance(value, property):
            members[name] = "property"
        elif isinstance(value, (staticmethod, classmethod)) or callable(value):
            members[name] = describe(getattr(cls, name))
    if dataclasses.is_dataclass(cls):
        members["<fields>"] = [f.name for f in dataclasses.fields(cls)]
    return members

found = {{"__all__": sorted(spike.__all__)}}
for name in spike.__all__:
    obj = getattr(spike, name)
    found["spike." + name] = describe_class(obj) if inspect.isclass(obj) else describe(obj)
for module_name in {modules!r}:
    module = importlib.import_module("spike." + module_name)
    for name, obj in vars(module).items():
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue  # private, or imported from elsewhere
        key = module.__name__ + "." + name
        found[key] = describe_class(obj) if inspect.isclass(obj) else describe(obj)
print(json.dumps(found, sort_keys=True))
"""


def public_signatures(runtime: Path, modules: list[str]) -> dict[str, Any]:
    script = PUBLIC_SIGNATURES.format(
        runtime=str(runtime), modules=modules, dunders=list(CALLING_DUNDERS)
    )
    result = subprocess.run(
        [sys.executable, "-I", "-c", script], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_the_doubles_python_layer_has_spikes_public_signatures(tmp_path: Path) -> None:
    real_runtime = real_spike_runtime(tmp_path)
    modules = sorted(
        p.stem
        for p in REAL_SPIKE.glob("*.py")
        if p.stem != "__init__" and p.stem not in NOT_IMITATED
    )
    # Every module of spike's layer exists in the double, and nothing else is public.
    double_modules = {
        p.stem for p in (FAKE_RUNTIME / "spike").glob("*.py") if not p.stem.startswith("_")
    }
    assert double_modules == set(modules)
    real = public_signatures(real_runtime, modules)
    double = public_signatures(FAKE_RUNTIME, modules)
    assert real["__all__"] == double["__all__"]
    assert sorted(real) == sorted(double)  # the same public classes and functions
    for key, signature in real.items():
        assert double[key] == signature, key


# --- a generated bundle through spike's real layer ------------------------------------------


@pytest.fixture(scope="module")
def bundle_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The examples' wheel (built with the toolchain double) installed into a plain
    directory: no nkibuild, no virtualenv needed."""
    pytest.importorskip("jax")
    root = tmp_path_factory.mktemp("real-spike") / "project"
    shutil.copytree(REPO / "examples", root, ignore=shutil.ignore_patterns("build", "dist"))
    with pytest.MonkeyPatch.context() as env:
        env.setenv("NKIBUILD_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        assert build(root).ok
    site = root / "site"
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index"]
    subprocess.run([*command, "--target", str(site), str(root / "dist" / WHEEL)], check=True)
    return site


@pytest.fixture(scope="module")
def real_runtime(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return real_spike_runtime(tmp_path_factory.mktemp("spike-layer"))


RUN_BUNDLE = """
import json, sys

class RefuseNkibuild:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "nkibuild":
            raise ImportError("a bundle must not need nkibuild")
        return None

sys.meta_path.insert(0, RefuseNkibuild())
sys.path[:0] = [{site!r}, {runtime!r}]
"""


def run_bundle(site: Path, runtime: Path, script: str, cwd: Path, **env: str) -> str:
    code = RUN_BUNDLE.format(site=str(site), runtime=str(runtime)) + textwrap.dedent(script)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("NKIBUILD_", "PYTHON"))}
    result = subprocess.run(
        [sys.executable, "-I", "-c", code],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**clean, "NKIBUILD_TARGET": "trn2", **env},
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def neff_io(site: Path, member: str) -> tuple[list[Any], list[Any]]:
    info = read_neff(site / member)
    return tuple(  # type: ignore[return-value]
        [[t.name, t.dtype, list(t.shape)] for t in tensors]
        for tensors in (info.inputs, info.outputs)
    )


def test_a_bundle_runs_in_neuron_mode_through_spikes_real_layer(
    real_runtime: Path, bundle_site: Path, tmp_path: Path
) -> None:
    log = tmp_path / "spike.jsonl"
    out = run_bundle(
        bundle_site,
        real_runtime,
        """
        import ml_dtypes, numpy as np
        from acme_kernels import matmul_rowsum, scaled_add
        import spike.spike_model
        x = np.ones((1024, 512), np.float32)
        out = scaled_add(x, x, mode="neuron")
        print(json.dumps([out.dtype.name, list(out.shape)]))
        a = np.ones((128, 256), ml_dtypes.bfloat16)
        b = np.ones((128, 512), ml_dtypes.bfloat16)
        outs = matmul_rowsum(a, b, mode="neuron")
        print(json.dumps([[o.dtype.name, list(o.shape)] for o in outs]))
        # The layer that ran is spike's own file, not the double's.
        print(json.dumps(spike.spike_model.__file__))
        """,
        tmp_path,
        NKIBUILD_FAKE_SPIKE_LOG=str(log),
    )
    scaled, matmul, layer_file = (json.loads(line) for line in out.splitlines())
    assert Path(layer_file).parent == real_runtime / "spike"
    events = [json.loads(line) for line in log.read_text().splitlines()]
    loads = [e for e in events if e["event"] == "load"]
    calls = [e for e in events if e["event"] == "call"]
    assert [Path(e["path"]).parts[-3:] for e in loads] == [
        ("trn2", "scaled_add", "large.neff"),  # the variant the shapes select
        ("trn2", "matmul_rowsum", "default.neff"),
    ]
    assert all(e["placeholder"] for e in loads)
    members = ["acme_kernels/neff/trn2/scaled_add/large.neff"]
    members.append("acme_kernels/neff/trn2/matmul_rowsum/default.neff")
    for call, member, returned in zip(calls, members, [[scaled], matmul], strict=True):
        inputs, outputs = neff_io(bundle_site, member)
        received = [[name, spec["dtype"], spec["shape"]] for name, spec in call["inputs"].items()]
        assert received == inputs  # the NEFF's own names, dtypes and shapes, in its order
        assert sorted(call["outputs"]) == sorted(name for name, _, _ in outputs)
        assert returned == [[dtype, shape] for _, dtype, shape in outputs]


def test_placeholder_neffs_are_refused_on_a_core_that_is_not_the_double(
    real_runtime: Path, bundle_site: Path, tmp_path: Path
) -> None:
    # spike's real layer on a core without the double's mark stands for real spike.
    unmarked = tmp_path / "unmarked"
    shutil.copytree(real_runtime, unmarked)
    core = unmarked / "spike"
    (core / "_spike.py").rename(core / "_cpu_core.py")
    (core / "_spike.py").write_text(
        "from ._cpu_core import *  # noqa\nfrom ._cpu_core import _neff  # noqa\n"
        "del IS_TOOLCHAIN_DOUBLE\n"
    )
    log = tmp_path / "spike.jsonl"
    script = """
        import numpy as np
        from acme_kernels import softmax
        from acme_kernels._runtime import KernelError
        try:
            softmax(np.zeros((64, 1024), np.float32), mode="neuron")
        except KernelError as error:
            print(error)
        """
    refused = run_bundle(bundle_site, unmarked, script, tmp_path, NKIBUILD_FAKE_SPIKE_LOG=str(log))
    assert "is a placeholder written by nkibuild's toolchain double" in refused
    assert not log.exists()  # nothing was loaded
    accepted = run_bundle(bundle_site, real_runtime, script, tmp_path)
    assert accepted == ""  # it ran (on the double's core), so nothing was printed


def test_the_wheel_holds_no_spike_code(bundle_site: Path) -> None:
    # spike is the host's runtime: a bundle must never ship (a copy of) it.
    with zipfile.ZipFile(bundle_site.parent / "dist" / WHEEL) as wheel:
        assert not [n for n in wheel.namelist() if n.split("/")[0] == "spike"]


def test_the_runtime_passes_bool_and_fp8_as_the_neff_stores_them(
    real_runtime: Path, tmp_path: Path
) -> None:
    pytest.importorskip("ml_dtypes")
    neff = tmp_path / "stored.neff"
    declared = [("m", "bool"), ("q", "float8_e4m3fn"), ("r", "float8_e4m3")]
    write_neff(
        neff,
        compiler_version="2.23.0.0+nkibuild.fake",
        inputs=[NeffTensor(name, dtype, (4,)) for name, dtype in declared],
        outputs=[NeffTensor("output0", "float32", (4,))],
        num_tpb=1,
        placeholder=True,
    )
    script = f"""
        import importlib.util, json, sys
        import ml_dtypes, numpy as np
        sys.path.insert(0, {str(real_runtime)!r})
        from spike import SpikeModel, SpikeTensor
        spec = importlib.util.spec_from_file_location("bundle_runtime", {str(RUNTIME)!r})
        runtime = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(runtime)
        m = SpikeModel.load_from_neff({str(neff)!r})
        arrays = {{"m": np.ones(4, bool), "q": np.ones(4, ml_dtypes.float8_e4m3fn),
                   "r": np.ones(4, ml_dtypes.float8_e4m3)}}
        for convert in (lambda a: a, runtime.as_neff_storage):
            inputs = {{n: SpikeTensor.from_numpy(convert(a), n) for n, a in arrays.items()}}
            try:
                m(inputs=inputs)
                print(json.dumps("ok"))
            except AssertionError as error:
                print(json.dumps(str(error)))
        print(json.dumps([runtime.as_neff_storage(a).dtype.name for a in arrays.values()]))
        """
    result = subprocess.run(
        [sys.executable, "-I", "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    as_given, converted, dtypes = (json.loads(line) for line in result.stdout.splitlines())
    assert "bool" in as_given  # spike's real layer refuses a bool array for the uint8 tensor
    assert converted == "ok"
    assert dtypes == ["uint8", "int8", "float8_e4m3"]  # e4m3 already passes spike's check
