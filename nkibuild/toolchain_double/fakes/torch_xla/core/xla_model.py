"""nkibuild toolchain double: fake `torch_xla.core.xla_model`.

Like the real one under `NEURON_EXTRACT_GRAPHS_ONLY=1`, `mark_step()` dumps the
pending graphs to `$NEURON_COMPILE_CACHE_URL/neuronxcc-<version>/MODULE_<hash>+<hash>/`
as `model.hlo_module.pb` + `compile_flags.json`, several modules per step: runtime
glue (parameter loading, often the largest) next to the kernel's module. Hashes are
deterministic. It cannot execute anything on a device.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from nkibuild.toolchain_double.hlo_writer import build_hlo_module

COMPILER_DIR = "neuronxcc-2.23.0.0+nkibuild.fake"
GLUE_REPEATS = 8  # enough for the glue module to outweigh a small kernel module


@dataclass(frozen=True)
class Device:
    index: int = 0

    def __str__(self) -> str:
        return f"xla:{self.index}"


@dataclass
class Graph:
    """What one traced step contains: tensors in, tensors out, optional custom-call.

    `identity` stands for the graph in its MODULE hash; without it the module bytes
    do. The kernel's module embeds a random temp path, so it needs one to hash stably.
    """

    name: str
    inputs: list[tuple[str, str, tuple[int, ...]]]
    outputs: list[tuple[str, tuple[int, ...]]]
    custom_call: tuple[str, bytes] | None = None
    identity: str | None = None


_PENDING: list[Graph] = []  # recorded since the last mark_step()


def xla_device() -> Device:
    return Device()


def target() -> str:
    return os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")


def record(graph: Graph) -> None:
    _PENDING.append(graph)


def mark_step() -> None:
    if os.environ.get("NEURON_EXTRACT_GRAPHS_ONLY") != "1":
        raise RuntimeError(
            "nkibuild's toolchain double cannot execute on a device: "
            "set NEURON_EXTRACT_GRAPHS_ONLY=1 to dump graphs instead"
        )
    cache = Path(os.environ["NEURON_COMPILE_CACHE_URL"]) / COMPILER_DIR
    flags = json.dumps([f"--target={target()}", "--framework=XLA"])
    graphs, _PENDING[:] = list(_PENDING), []
    for graph in graphs:
        name = f"SyncTensorsGraph.{graph.name}"
        # Parameter loading: touches every input several times, so it is often the
        # largest module of the step although it holds no kernel.
        loads = [(dtype, dims) for _, dtype, dims in graph.inputs] * GLUE_REPEATS
        _dump(cache, build_hlo_module(f"{name}.params", graph.inputs, loads), None, flags)
        kernel = build_hlo_module(name, graph.inputs, graph.outputs, graph.custom_call)
        _dump(cache, kernel, graph.identity, flags)


def _dump(cache: Path, module: bytes, identity: str | None, flags: str) -> None:
    graph_hash = hashlib.sha256(identity.encode() if identity else module).hexdigest()[:20]
    directory = cache / f"MODULE_{graph_hash}+{hashlib.sha256(flags.encode()).hexdigest()[:8]}"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "model.hlo_module.pb").write_bytes(module)
    (directory / "compile_flags.json").write_text(flags)
