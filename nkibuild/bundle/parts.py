"""Each kernel's share of the bundle, and the memo that spares an unchanged kernel its
recomputation.

A bundle is assembled from one `KernelPart` per kernel: its entry of `_build.json`
(already encoded), its generated loader module, its NEFF files, and what the
package-wide files take from it (runtime requirements, compiler versions, provenance).
Editing one kernel of a project of thousands changes one part, yet computing every part
means reading every compile record and extraction record again (seconds at 10,000
units). So the bundle stage keeps the parts of its last run in `build/state/` and takes
a kernel's part from there while the kernel's manifest entry (`Kernel.config`, what the
bundle takes from it) and the stats of its units' compile and extraction records are
as recorded; the records are written atomically, so a rewritten one has a new stat.
The memo also keeps the sha256 of each project file the provenance summary lists, by
stat. A bundle that changed a few parts appends them to the memo file (`save`) rather
than writing 18 MB anew; a load stops at an update cut short, and the next save writes
the memo whole. It is a hint, like the plan cache: a missing, damaged or foreign memo
only means every part is computed again, and it never outlives a change of nkibuild,
the bundle generator, the package or where the build directory is.
"""

from __future__ import annotations

import contextlib
import json
import marshal
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from nkibuild import __version__, plaindata
from nkibuild.cache.key import file_sha256
from nkibuild.compiler import RESULT_FILE, CompiledNeff
from nkibuild.compiler.record import recorded_result
from nkibuild.frontends import METADATA_FILE, load_extracted
from nkibuild.fsutil import atomic_write_bytes, stat_stamp

if TYPE_CHECKING:
    from nkibuild.context import BuildContext, Layout
    from nkibuild.manifest.model import Kernel, Manifest
    from nkibuild.plan import BuildUnit

MEMO_FILE = "bundle-parts.pickle"
STAT_FIELDS = 4  # of a record, in a key: size, mtime and ctime (ns), inode
MAX_UPDATES = 100  # appended to a snapshot before it is written anew: each costs a load


# A NEFF the bundle's tree takes from a compile directory: its path in the tree, the
# compiled NEFF, the sha256 its compile recorded (the bytes copied must hash to it) and
# its unit. A plain tuple, as the memo keeps it: none made per NEFF at each bundle.
NeffRow = tuple[str, str, str, str]


class KernelPart(NamedTuple):
    """Everything the bundle takes from one kernel and its compiled units.

    A tuple, not a dataclass: a bundle of 10,000 units takes 5,000 of them from the
    memo, where a frozen dataclass costs several times a tuple to make."""

    name: str
    info_text: str  # its entry of `_build.json`'s "kernels", encoded as the file has it
    module: bytes  # its generated loader
    module_sha256: str
    neffs: tuple[NeffRow, ...]
    targets: tuple[str, ...]  # those it has NEFFs for, sorted (as the tuples below)
    dtypes: tuple[str, ...]  # of its NEFFs' inputs and outputs
    compiler_versions: tuple[str, ...]
    tools: tuple[tuple[str, str], ...]  # its extractions' frontend packages and versions
    placeholder: bool  # a NEFF of the toolchain double among them


PartMaker = Callable[["Kernel", Sequence[CompiledNeff], frozenset[tuple[str, str]]], KernelPart]


Key = bytes  # the kernel's config, its units and their records' stats (`_keys`)


def _kept_part(entry: object, key: Key | None, name: str) -> KernelPart | None:
    """The memo's part of kernel `name` if it was made from what `key` says; None if
    not, or if the entry is not a part of that kernel (a damaged memo: made again)."""
    if key is None or type(entry) is not tuple or len(entry) != 2 or entry[0] != key:
        return None
    row = entry[1]
    if type(row) is not tuple or len(row) != len(KernelPart._fields):
        return None
    part = KernelPart._make(row)
    return part if part.name == name and _well_typed(part) else None


_GROUPS = (tuple,) * 5  # the types of a part's neffs, targets, dtypes, versions and tools


def _well_typed(part: KernelPart) -> bool:
    """Whether every value of a part read from the memo has the type the bundle reads:
    the pickle holds plain data, but not necessarily of these shapes. Tests inline,
    no call per value: it runs for every kept kernel (5,000 at 10,000 units)."""
    name, info_text, module, module_sha256, neffs, targets, dtypes, versions, tools, flag = part
    groups = (type(neffs), type(targets), type(dtypes), type(versions), type(tools))
    if type(module) is not bytes or type(flag) is not bool or groups != _GROUPS:
        return False
    texts = [name, info_text, module_sha256, *targets, *dtypes, *versions]
    for neff in neffs:
        if type(neff) is not tuple or len(neff) != 4:
            return False
        texts += neff
    for tool in tools:
        if type(tool) is not tuple or len(tool) != 2:
            return False
        texts += tool
    try:  # one join in C checks that every one is a string
        "".join(texts)
    except TypeError:
        return False
    return True


@dataclass
class _Memo:
    scope: tuple[str, ...]
    kernels: dict[str, tuple[Key | None, tuple[Any, ...]]]  # name -> (key, part's fields)
    digests: dict[str, tuple[str, str]]  # path -> (stat, sha256)
    # Of the file it was read from: the bytes read whole (appending after anything else
    # would hide the update), the snapshot's own and the number of updates after it.
    length: int = 0
    snapshot_length: int = 0
    updates: int = 0

    def to_state(self) -> tuple[object, ...]:
        return (self.scope, self.kernels, self.digests)


class PartsMemo:
    """The parts and file digests of the last bundle, and those of this one (saved by
    `save` once the bundle stage took what it needs)."""

    def __init__(self, context: BuildContext) -> None:
        self.context = context
        self.file = context.layout.state_dir / MEMO_FILE
        scope = _scope(context)
        self.previous = _load(self.file, scope)
        self.current = _Memo(scope, {}, {})

    def kernel_parts(self, make_part: PartMaker) -> list[KernelPart]:
        """Every kernel's part, in manifest order: from the memo where its inputs are as
        recorded, else made by `make_part` from its compile records."""
        context = self.context
        layout = context.layout
        units: dict[str, list[BuildUnit]] = {}
        for unit in context.units:
            units.setdefault(unit.kernel, []).append(unit)
        kernels = context.manifest.kernels
        parts = []
        for kernel, key in zip(kernels, _keys(layout, kernels, units), strict=True):
            own = units.get(kernel.name, [])
            entry = self.previous.kernels.get(kernel.name)
            part = _kept_part(entry, key, kernel.name)
            if part is None:
                compiled = [recorded_result(layout.compile_dir(u), u.name) for u in own]
                extracted = {layout.extract_dir(u.extract): u.name for u in own}
                tools = frozenset(
                    pair
                    for directory, unit in extracted.items()
                    for pair in load_extracted(directory, unit).toolchain
                )
                part = make_part(kernel, compiled, tools)
                entry = (key, part[:])
            self.current.kernels[kernel.name] = entry
            parts.append(part)
        return parts

    def file_sha256(self, path: Path) -> str:
        """The sha256 of a project file, hashed again only if its stat changed."""
        name = os.fspath(path)
        stat = stat_stamp(name)
        known = self.previous.digests.get(name)
        sha256 = known[1] if known and stat and known[0] == stat else file_sha256(path)
        self.current.digests[name] = (stat or "", sha256)
        return sha256

    def save(self) -> None:
        """Append what changed since the last bundle to the memo file (a kilobyte for a
        one-kernel edit, where the whole memo is 18 MB at 10,000 units), or write it anew
        once the updates would cost a load more than the snapshot does."""
        previous, current = self.previous, self.current
        # An unchanged kernel's entry is the very object loaded: compared by identity.
        changed = {
            name: entry
            for name, entry in current.kernels.items()
            if previous.kernels.get(name) is not entry
        }
        removed = [name for name in previous.kernels if name not in current.kernels]
        if not changed and not removed and current.digests == previous.digests:
            return
        update = plaindata.dumps((changed, removed, current.digests))
        with contextlib.suppress(OSError):  # a hint: without it the next bundle computes all
            if previous.updates >= MAX_UPDATES or not plaindata.append(
                self.file, previous.length, previous.snapshot_length, update
            ):
                # Not fsync'ed: one lost to a power cut only costs the next bundle its time.
                state = plaindata.dumps(current.to_state())
                atomic_write_bytes(self.file, state, durable=False)


def _scope(context: BuildContext) -> tuple[str, ...]:
    from nkibuild.bundle import generator_digest, split_targets

    manifest: Manifest = context.manifest
    return (
        __version__,
        generator_digest(),
        str(context.layout.build_dir),
        json.dumps(vars(manifest.package), sort_keys=True),
        ",".join(split_targets(manifest)),
    )


def _keys(
    layout: Layout, kernels: Sequence[Kernel], units: Mapping[str, Sequence[BuildUnit]]
) -> list[Key | None]:
    """What each kernel's part is made from: its config, its units and their records'
    stats, as one marshal (format 0 writes no back-references, so equal values give
    equal bytes however they share objects); None while a record is missing (a part
    is kept only once made from all of them). The records of all kernels are stat'ed
    in one loop, no call per kernel: 15,000 at 10,000 units."""
    records: list[str] = []
    spans = []
    for kernel in kernels:
        own = units.get(kernel.name, ())
        start = len(records)
        records += [f"{layout.compile_path(unit)}/{RESULT_FILE}" for unit in own]
        # An extraction serves every target of its variant: stat'ed once.
        extractions = {unit.extract.name: unit.extract for unit in own}.values()
        records += [f"{layout.extract_path(spec)}/{METADATA_FILE}" for spec in extractions]
        spans.append((kernel, [unit.name for unit in own], start, len(records)))
    # Four numbers a record, in one flat list: no tuple a record kept alive (15,000
    # objects more for the garbage collector to go through).
    stats: list[int | None] = []
    for record in records:
        try:
            info = os.stat(record)
        except (OSError, ValueError):  # ValueError: a NUL in the path
            stats += (None,) * STAT_FIELDS
            continue
        stats += (info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino)
    keys = []
    for kernel, names, start, end in spans:
        own = stats[start * STAT_FIELDS : end * STAT_FIELDS]
        keys.append(None if None in own else marshal.dumps((kernel.config(), names, own), 0))
    return keys


def _load(memo_file: Path, scope: tuple[str, ...]) -> _Memo:
    """The memo's snapshot with the updates appended after it applied in order, up to
    the first that is torn or damaged (a killed append: the next save writes anew)."""
    memo = None
    try:
        for value, end in plaindata.read_records(memo_file):
            if memo is None:
                memo = _snapshot(value, scope, end)
            elif not _updated(memo, value, end):
                break
    except (OSError, ValueError, TypeError):  # none yet, damaged, another layout
        return _Memo(scope, {}, {})
    return memo if memo is not None else _Memo(scope, {}, {})


def _snapshot(value: Any, scope: tuple[str, ...], end: int) -> _Memo:
    saved_scope, kernels, digests = value
    if saved_scope != scope or not isinstance(kernels, dict) or not _digests(digests):
        raise ValueError("another build's memo")
    return _Memo(scope, kernels, digests, end, end)


def _updated(memo: _Memo, value: Any, end: int) -> bool:
    """Apply an update appended to the memo; False if it is not one (what follows is
    not trusted)."""
    try:
        changed, removed, digests = value
    except (TypeError, ValueError):
        return False
    if not (isinstance(changed, dict) and _names(removed) and _digests(digests)):
        return False
    memo.kernels.update(changed)
    for name in removed:
        memo.kernels.pop(name, None)
    memo.digests = digests
    memo.length = end
    memo.updates += 1
    return True


def _names(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(name, str) for name in value)


def _digests(value: object) -> bool:
    """path -> (stat, sha256), all strings: what `file_sha256` reads without checking."""
    return isinstance(value, dict) and all(
        isinstance(path, str)
        and isinstance(known, tuple)
        and len(known) == 2
        and all(isinstance(part, str) for part in known)
        for path, known in value.items()
    )
