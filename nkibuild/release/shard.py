"""Split a release's compile units into N balanced shards for a CI matrix.

Deterministic: every job of the matrix computes the same assignment from the same
repository, with no coordination. Balanced by estimated compile time, longest
first onto the least-loaded shard (LPT scheduling). The estimate is the unit's last
compile time, from its build directory or from the local cache's metadata; failing
both, a guess from the size of its inputs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from nkibuild.context import BuildContext
from nkibuild.errors import UsageError

# Seconds per million input elements when a unit has never been compiled: a guess
# that only has to order unknown units sensibly among themselves.
SECONDS_PER_MILLION_ELEMENTS = 10.0
MINIMUM_SECONDS = 1.0


@dataclass(frozen=True)
class ShardUnit:
    task: str  # the release graph's task name, "<distribution>/compile:<unit>"
    cost: float  # estimated seconds


def parse_shard(text: str) -> tuple[int, int]:
    """`I/N` (1-based) as (index, count)."""
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise UsageError(f"--shard {text!r}: expected I/N, e.g. 2/4") from None
    if not 1 <= index <= count:
        raise UsageError(f"--shard {text!r}: I must be between 1 and N")
    return index, count


def assign(units: Sequence[ShardUnit], count: int) -> list[list[ShardUnit]]:
    """LPT: the costliest unit first, each onto the shard with the least work so far."""
    shards: list[list[ShardUnit]] = [[] for _ in range(count)]
    loads = [0.0] * count
    for unit in sorted(units, key=lambda u: (-u.cost, u.task)):
        lightest = min(range(count), key=lambda i: (loads[i], i))
        shards[lightest].append(unit)
        loads[lightest] += unit.cost
    return shards


def balance(shards: Sequence[Sequence[ShardUnit]]) -> float:
    """Largest shard's work over the mean shard's (1.0 is perfect)."""
    loads = [sum(u.cost for u in shard) for shard in shards]
    mean = sum(loads) / len(loads)
    return max(loads) / mean if mean else 1.0


def shard_units(projects: Sequence[BuildContext], cache_dir: Path | None) -> list[ShardUnit]:
    from nkibuild.compiler.record import last_result

    known = _cached_compile_times(cache_dir)
    units = []
    for project in projects:
        prefix = project.manifest.package.name
        for unit in project.units:
            last = last_result(project.layout.compile_dir(unit))
            elements = sum(math.prod(t.shape) for t in unit.extract.inputs)
            guess = elements / 1e6 * SECONDS_PER_MILLION_ELEMENTS
            cost = (last and last.compile_seconds) or known.get(unit.name) or guess
            units.append(ShardUnit(f"{prefix}/compile:{unit.name}", max(cost, MINIMUM_SECONDS)))
    return units


def _cached_compile_times(cache_dir: Path | None) -> dict[str, float]:
    """Unit name -> the longest compile time recorded in the local cache."""
    if cache_dir is None:
        return {}
    from nkibuild.cache import LocalCache
    from nkibuild.cache.store import ENTRY_FILE

    times: dict[str, float] = {}
    for entry in LocalCache(cache_dir).entries():
        try:
            meta = json.loads((entry.directory / ENTRY_FILE).read_text())
            name, seconds = str(meta["unit"]), float(meta["compile_seconds"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        times[name] = max(times.get(name, 0.0), seconds)
    return times
