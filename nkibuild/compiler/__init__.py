"""Compile stage: HloArtifact + BuildUnit -> CompiledNeff.

One orchestrator, `compile_unit`: this build dir (a rerun after a killed build),
then the caches, then an executor (neuronx-cc here, or a Ray cluster). A NEFF is
checked against the unit before it is accepted, from wherever it came; the ones
compiled here are published to the caches; `result.json` is written last and
marks completion. `run(context, unit)` is the stage's entry point for a build.

Modules: `record` (what a finished compile leaves), `job` (an executor's input and
answer, and the cache key), `checks` (is a NEFF the unit's), `neuronxcc` (the compiler
adapter), `local` and `ray_executor` (executors), `process` (one compiler process),
`budget` (admission).
"""

from __future__ import annotations

from nkibuild.exports import lazy_exports

# Each public name and the module that defines it (nkibuild.exports).
_HOMES = {
    "KEY_FILE": "record",
    "RESULT_FILE": "record",
    "CompiledNeff": "record",
    "finished_result": "record",
    "load_result": "record",
    "CompileJob": "job",
    "cache_key": "job",
    "compiler_command": "neuronxcc",
    "CompileOptions": "orchestrator",
    "compile_unit": "orchestrator",
    "run": "orchestrator",
}
__all__ = sorted(_HOMES)

__getattr__ = lazy_exports(__name__, _HOMES)
