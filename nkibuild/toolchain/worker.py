"""Frontend worker: runs user kernel code in its own process and writes HLO protos.

Run as `python -m nkibuild.toolchain.worker REQUEST.json RESULT.json`. The
request holds a list of jobs, so one process (one import of jax/torch) can
serve many kernels. User code never runs inside the nkibuild process: a crash,
a hang or `sys.exit` here only fails this worker.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

Job = dict[str, Any]


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


TRACERS: dict[str, Callable[[Job], tuple[bytes, dict[str, str]]]] = {"jax": trace_jax}


def run_job(job: Job) -> dict[str, Any]:
    try:
        proto, versions = TRACERS[job["frontend"]](job)
        Path(job["output"]).write_bytes(proto)
        return {"ok": True, "versions": versions}
    except BaseException as error:
        if isinstance(error, KeyboardInterrupt):
            raise
        return {
            "ok": False,
            "error": f"{type(error).__name__}: {error}",
            "traceback": traceback.format_exc(),
        }


def main(argv: list[str]) -> int:
    request_path, result_path = argv
    jobs: list[Job] = json.loads(Path(request_path).read_text())["jobs"]
    results = [run_job(job) for job in jobs]
    Path(result_path).write_text(json.dumps({"results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
