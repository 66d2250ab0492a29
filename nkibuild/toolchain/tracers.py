"""Tracers: user kernel function + sample signature -> serialized HloModuleProto.

They run only inside frontend worker processes (nkibuild.toolchain.worker), never in
the nkibuild process, and are the only code that imports jax, torch, torch_xla, nki
or nkipy. Each returns the module bytes and the versions of the packages it used.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import inspect
import json
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

Job = dict[str, Any]
Tracer = Callable[[Job], tuple[bytes, dict[str, str]]]


def load_function(root: str, path: str, function: str) -> Callable[..., Any]:
    """Import `function` from the file `path` (relative to the manifest dir `root`).

    Runs inside `project_imports`, which puts the file's directory and the project root
    on sys.path (the file imports its siblings, `import utils`, as a script would).
    """
    file = Path(root, path)
    # The digest keeps `a/b_c.py` and `a_b/c.py` apart.
    digest = hashlib.sha256(path.encode()).hexdigest()[:8]
    stem = "".join(c if c.isalnum() else "_" for c in "_".join(Path(path).with_suffix("").parts))
    module_name = f"nkibuild_user_{stem}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    try:
        return getattr(module, function)
    except AttributeError:
        raise AttributeError(f"{path} defines no function {function!r}") from None


@contextlib.contextmanager
def project_imports(root: str, path: str) -> Iterator[None]:
    """One job's imports: the kernel file's directory and the project root on sys.path,
    and afterwards no module imported from the project left in sys.modules. Two kernel
    folders of one project may hold helpers of the same name (`a/utils.py`,
    `b/utils.py`); each job must import its own. Library modules imported on the way
    (jax's lazily loaded parts) stay."""
    saved_path = list(sys.path)
    before = set(sys.modules)
    sys.path[:0] = [str(Path(root, path).parent), root]
    try:
        yield
    finally:
        sys.path[:] = saved_path
        project = os.path.join(os.path.realpath(root), "")
        for name in set(sys.modules) - before:
            origin = getattr(sys.modules[name], "__file__", None) or ""
            if os.path.realpath(origin).startswith(project):
                del sys.modules[name]


def freeze(value: Any) -> Any:
    """JSON lists back to tuples: static arguments must be hashable."""
    return tuple(freeze(item) for item in value) if isinstance(value, list) else value


def portable_source_paths(root: str) -> str:
    """Regex JAX deletes from HLO source paths: the project root, or any other directory.

    Without it the HLO embeds absolute paths of the checkout and of site-packages,
    so the same kernel hashes (and caches) differently in every directory.
    """
    return f"^{re.escape(root.rstrip('/'))}/|^.*/"


def trace_jax(job: Job) -> tuple[bytes, dict[str, str]]:
    import jax
    import jax.numpy as jnp
    import jaxlib

    jax.config.update(
        "jax_hlo_source_file_canonicalization_regex", portable_source_paths(job["root"])
    )

    function = load_function(job["root"], job["path"], job["function"])
    constants = {name: freeze(value) for name, value in job["constants"]}
    samples = [
        jax.ShapeDtypeStruct(tuple(t["shape"]), jnp.dtype(t["dtype"])) for t in job["inputs"]
    ]
    jitted = jax.jit(function, static_argnames=tuple(constants))
    lowered = jitted.lower(*samples, **constants)
    proto = lowered.compiler_ir("hlo").as_serialized_hlo_module_proto()
    return proto, {"jax": jax.__version__, "jaxlib": jaxlib.__version__}


def sample_arrays(job: Job) -> list[Any]:
    """Zero-filled NumPy arrays of the job's input shapes and dtypes."""
    import ml_dtypes
    import numpy as np

    def dtype(name: str) -> Any:
        return ml_dtypes.bfloat16 if name == "bfloat16" else np.dtype(name)

    return [np.zeros(tuple(t["shape"]), dtype(t["dtype"])) for t in job["inputs"]]


def package_version(module: Any, distribution: str, job: Job) -> str:
    """The installed distribution's version; for a module from the toolchain's own
    additions to the worker's path (`job["own_modules"]`), the version it declares,
    since an installed distribution of the same name is not what ran."""
    from importlib import metadata

    file = os.path.realpath(getattr(module, "__file__", "") or "")
    if any(file.startswith(os.path.join(path, "")) for path in job.get("own_modules", ())):
        return str(getattr(module, "__version__", "unknown"))
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return str(getattr(module, "__version__", "unknown"))


def trace_nkipy(job: Job) -> tuple[bytes, dict[str, str]]:
    function = load_function(job["root"], job["path"], job["function"])
    return _nkipy_module(job, function, {name: freeze(value) for name, value in job["constants"]})


def _nkipy_module(
    job: Job, function: Callable[..., Any], constants: dict[str, Any]
) -> tuple[bytes, dict[str, str]]:
    import nkipy
    from nkipy.core.trace import NKIPyKernel

    kernel = NKIPyKernel.trace(function)
    kernel.specialize(*sample_arrays(job), **constants)
    proto = kernel._code.to_proto().SerializeToString()
    return proto, {"nkipy": package_version(nkipy, "nkipy", job)}


def trace_nki(job: Job) -> tuple[bytes, dict[str, str]]:
    """An NKI kernel into an HLO module by the route the toolchain chose (`nki_route`),
    with the unit's LNC in NEURON_LOGICAL_NC_CONFIG, where NKI reads it (0.7 on) and
    where it must equal the runtime's; before NKI 0.7 (`lnc_grid`) also as `kernel[lnc]`.

    The worker was started with NEURON_PLATFORM_TARGET_OVERRIDE (the unit's target),
    NEURON_EXTRACT_GRAPHS_ONLY=1 and NEURON_COMPILE_CACHE_URL=job["cache_dir"].
    """
    import nki

    os.environ["NEURON_LOGICAL_NC_CONFIG"] = str(job["lnc"] or 1)
    kernel = load_function(job["root"], job["path"], job["function"])
    kernel = nki_launcher(kernel, job["lnc"] if job["lnc_grid"] else None)
    constants = {name: freeze(value) for name, value in job["constants"]}
    route = trace_nki_nkipy if job["nki_route"] == "nkipy" else trace_nki_torch_xla
    proto, versions = route(job, kernel, constants)
    return proto, {"nki": package_version(nki, "nki", job), **versions}


def trace_nki_nkipy(
    job: Job, kernel: Any, constants: dict[str, Any]
) -> tuple[bytes, dict[str, str]]:
    """nkipy's NKI op compiles the kernel for the unit's target (given explicitly: nkipy
    would take the host's) and, called in a function nkipy traces, embeds it as a
    custom-call; the function takes the kernel's parameters, so the module's do too."""
    from nkipy.core.nki_op import wrap_nki_kernel

    function = getattr(kernel, "func", kernel)
    signature = inspect.signature(function)
    bound = signature.bind(*sample_arrays(job), **constants)
    bound.apply_defaults()  # the op maps its operands to the kernel's parameters in order
    target = os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE")
    op = wrap_nki_kernel(
        kernel, list(bound.arguments.values()), is_nki_beta_3_version=True, platform_target=target
    )

    @functools.wraps(function)
    def embedded(*args: Any, **kwargs: Any) -> Any:
        return op(*signature.bind(*args, **kwargs).arguments.values())

    return _nkipy_module(job, embedded, constants)


def trace_nki_torch_xla(
    job: Job, kernel: Any, constants: dict[str, Any]
) -> tuple[bytes, dict[str, str]]:
    """Run the kernel on XLA tensors with graph extraction on, then harvest its module."""
    import torch
    import torch_xla.core.xla_model as xm

    from nkibuild.toolchain.harvest import choose_kernel_module, find_modules, module_dirs

    cache_dir = Path(job["cache_dir"])
    seen = module_dirs(cache_dir)
    device = xm.xla_device()
    tensors = [
        torch.zeros(tuple(t["shape"]), dtype=getattr(torch, t["dtype"])).to(device)
        for t in job["inputs"]
    ]
    kernel(*tensors, **constants)
    xm.mark_step()
    dumped = find_modules(cache_dir, since=seen)
    module = choose_kernel_module(dumped, job["function"])
    # The dump dir is this worker's own: clear it, or tracing the same kernel again
    # lands in the same MODULE_<hash> directory and looks like nothing was dumped.
    for each in dumped:
        shutil.rmtree(each.directory, ignore_errors=True)
    return module.hlo, {
        "torch_xla": package_version(sys.modules["torch_xla"], "torch-xla", job),
        "compile_flags": json.dumps(list(module.flags)),
    }


def nki_launcher(kernel: Any, grid: int | None) -> Callable[..., Any]:
    """The kernel as NKI launches it, on a launch grid of `grid` if above 1. A plain
    function is wrapped as the installed NKI expects, found by probing: before NKI 0.3 as
    `nki._torch_xla.PyTorchXLAKernel(func=f, grid=lnc)`; from 0.3 on (Neuron SDK 2.29),
    which removed that module, with `nki.jit(f)`.
    """
    grid = grid if grid and grid > 1 else None
    if inspect.isfunction(kernel):
        try:
            from nki._torch_xla import PyTorchXLAKernel
        except ImportError:
            import nki

            kernel = nki.jit(kernel)
        else:
            return PyTorchXLAKernel(func=kernel, **({"grid": grid} if grid else {}))
    return kernel[grid] if grid else kernel


TRACERS: dict[str, Tracer] = {"jax": trace_jax, "nkipy": trace_nkipy, "nki": trace_nki}
