"""Tracers: user kernel function + sample signature -> serialized HloModuleProto.

They run only inside frontend worker processes (nkibuild.toolchain.worker), never in
the nkibuild process, and are the only code that imports jax, torch, torch_xla, nki
or nkipy. Each returns the module bytes and the versions of the packages it used.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

Job = dict[str, Any]
Tracer = Callable[[Job], tuple[bytes, dict[str, str]]]


def load_function(root: str, path: str, function: str) -> Callable[..., Any]:
    """Import `function` from the file `path` (relative to the manifest dir `root`)."""
    if root not in sys.path:
        sys.path.insert(0, root)  # so kernel files can import their siblings
    file = Path(root, path)
    module_name = "nkibuild_user_" + "_".join(Path(path).with_suffix("").parts)
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {file}")
    module = sys.modules.get(module_name)
    if module is None:
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    try:
        return getattr(module, function)
    except AttributeError:
        raise AttributeError(f"{path} defines no function {function!r}") from None


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


TRACERS: dict[str, Tracer] = {"jax": trace_jax}
