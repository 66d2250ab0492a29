"""Each kernel's share of the bundle, and the memo that spares an unchanged kernel its
recomputation.

A bundle is assembled from one `KernelPart` per kernel: its entry of `_build.json`
(already encoded), its generated loader module, its NEFF files, and what the
package-wide files take from it (runtime requirements, compiler versions, provenance).
Editing one kernel of a project of thousands changes one part, yet computing every part
means reading every compile record and extraction record again (seconds at 10,000
units). So the bundle stage keeps the parts of its last run in `build/state/` and takes
a kernel's part from there while the kernel's manifest entry (`Kernel.config`, what the
bundle takes from it), the paths of its units' compile and extraction records and those
records' stamps (size, mtime, ctime, inode: `fsutil.stamp_of`) are as recorded; the
records are written atomically, so a rewritten one has a new inode and ctime, and the
stamps are taken before any record is read, so a part is never kept under a stamp older
than the content it was made of. A record the build's up-to-date decision found as it
was, and that no task of this build wrote since, is taken with the stamp it was seen
with (`fsutil.SeenStats`): not stat'ed again (a later change leaves the file with
another stamp, which the next bundle sees). The memo keeps the parts as columns (one
list per field, kernels in manifest order) with each kernel's config and its records'
stamps: when the kernels and their records are those of the memo, in its order (any edit
that adds no kernel), they are compared a column at a time, and only a difference costs
a lookup; otherwise each kernel is matched by name. Given the bundle task's definition
(its fingerprint, which covers every unit's compile record path and every kernel's
config) as when the memo was saved, the memo's record paths and configs are taken as
this bundle's: only the records' stamps are taken again. The memo also keeps the sha256
of each project file the provenance summary lists, by stat. A bundle that made a few
parts appends them to the memo file (`save`) rather than writing 12 MB anew; a load
stops at an update cut short, and the next save writes the memo whole. It is a hint,
like the plan cache: a missing, damaged or foreign memo (any value not of the type the
bundle reads) only means every part is computed again, and it never outlives a change of
nkibuild, the bundle generator, the package or where the build directory is.
"""

from __future__ import annotations

import contextlib
import json
import marshal
import os
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate, chain, compress, count, repeat
from operator import is_, methodcaller, ne
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from nkibuild import __version__, plaindata
from nkibuild.bundle.tree import NEFF_FIELDS
from nkibuild.cache.key import file_sha256
from nkibuild.compiler import RESULT_FILE, CompiledNeff
from nkibuild.compiler.record import recorded_result
from nkibuild.frontends import METADATA_FILE, load_extracted
from nkibuild.fsutil import SeenStats, atomic_write_bytes, stat_stamp

if TYPE_CHECKING:
    from nkibuild.context import BuildContext, Layout
    from nkibuild.manifest.model import Kernel, Manifest
    from nkibuild.plan import BuildUnit

MEMO_FILE = "bundle-parts.pickle"
# Of the saved state: a memo of another layout lends nothing.
MEMO_FORMAT = "columns, stamps, definition, entries in bytes, packed NEFFs, no modules"
MAX_UPDATES = 100  # appended to a snapshot before it is written anew: each costs a load


class KernelPart(NamedTuple):
    """Everything the bundle takes from one kernel and its compiled units.

    A tuple, not a dataclass: a bundle of 10,000 units takes 5,000 of them from the
    memo, where a frozen dataclass costs several times a tuple to make."""

    name: str
    info_json: bytes  # its entry of `_build.json`'s "kernels", encoded as the file has it
    # Its generated loader; None in a part the memo lent, which keeps its sha256 only
    # (6.5 MB of modules at 10,000 units, all to unpickle at each bundle): the tree makes
    # it again if it lacks the file (nkibuild.bundle.LoaderModules).
    module: bytes | None
    module_sha256: str
    neffs: str  # its NEFFs' rows, packed (nkibuild.bundle.tree.packed_neffs)
    targets: tuple[str, ...]  # those it has NEFFs for, sorted (as the tuples below)
    dtypes: tuple[str, ...]  # of its NEFFs' inputs and outputs
    compiler_versions: tuple[str, ...]
    tools: tuple[tuple[str, str], ...]  # its extractions' frontend packages and versions
    placeholder: bool  # a NEFF of the toolchain double among them


PartMaker = Callable[["Kernel", Sequence[CompiledNeff], frozenset[tuple[str, str]]], KernelPart]


# The memo keeps the parts as columns, one list per field of `KernelPart`, kernels in
# manifest order: unpickled, checked and compared a column at a time (a `map` or a
# join in C), with no Python call per kernel (5,000 at 10,000 units) but for the
# kernels whose part is made again.
Columns = list[list[Any]]


@dataclass
class _Kernels:
    """What each kernel's part is made from, and (in the memo) the parts made of it.

    A part is kept while its kernel's config (`Kernel.config`, marshalled: format 0
    writes no back-references, so equal values give equal bytes), the paths of its
    units' compile and extraction records and those records' stats are as recorded."""

    configs: list[bytes]
    records: str  # every record's path, NUL-joined, kernel after kernel
    counts: list[int]  # records per kernel
    stats: list[str | None]  # each record's stamp (None: missing), in `records` order
    columns: Columns  # the parts' fields; columns[0]: the kernels' names

    @property
    def names(self) -> list[str]:
        return self.columns[0]

    def record_paths(self) -> list[str]:
        return self.records.split("\0") if self.records else []

    def stat_slice(self, index: int) -> slice:
        """Where kernel `index`'s records' stats are in `stats`."""
        start = sum(self.counts[:index])
        return slice(start, start + self.counts[index])

    def stat_span(self, index: int) -> list[str | None]:
        """The stats of kernel `index`'s records."""
        return self.stats[self.stat_slice(index)]

    def to_state(self) -> tuple[object, ...]:
        return (self.configs, self.records, self.counts, self.stats, self.columns)


def _no_kernels() -> _Kernels:
    return _Kernels([], "", [], [], [[] for _ in KernelPart._fields])


@dataclass
class _Memo:
    scope: tuple[str, ...]
    kernels: _Kernels
    digests: dict[str, tuple[str, str]]  # path -> (stat, sha256)
    # Of the file it was read from: the bytes read whole (appending after anything else
    # would hide the update), the snapshot's own and the number of updates after it.
    length: int = 0
    snapshot_length: int = 0
    updates: int = 0
    # The bundle task's definition (graph/uptodate.py's fingerprint: its file_dep, which
    # are every unit's compile record, and its config, which holds every kernel's
    # `Kernel.config`) when the kernels were saved; "" if not known.
    definition: str = ""

    def to_state(self) -> tuple[object, ...]:
        return (self.scope, self.kernels.to_state(), self.digests, self.definition)


class PartsMemo:
    """The parts and file digests of the last bundle, and those of this one (saved by
    `save` once the bundle stage took what it needs)."""

    def __init__(
        self, context: BuildContext, seen: SeenStats | None = None, definition: str = ""
    ) -> None:
        self.context = context
        self.seen = seen if seen is not None else SeenStats()
        self.file = context.layout.state_dir / MEMO_FILE
        scope = _scope(context)
        self.previous = _load(self.file, scope)
        self.current = _Memo(scope, _no_kernels(), {}, definition=definition)
        self.parts: list[KernelPart] = []
        self.made: list[int] = []  # the kernels whose part this bundle made
        self.aligned = False  # the memo's kernels and records, in the same order

    def kernel_parts(self, make_part: PartMaker) -> list[KernelPart]:
        """Every kernel's part, in manifest order: from the memo where its inputs are as
        recorded, else made by `make_part` from its compile records."""
        context = self.context
        layout = context.layout
        kernels = context.manifest.kernels
        previous = self.previous.kernels
        definition = self.current.definition
        units: dict[str, list[BuildUnit]] = {}
        # Stat'ed before any record is read: a record rewritten meanwhile has another
        # stat next time, so the part made of its new content is not kept under this one.
        if definition and definition == self.previous.definition:
            # The same units' records and the same kernel configs as the memo's: only
            # their stamps are taken (no path or config of 5,000 kernels made again).
            current = _same_kernels(previous, self.seen)
        else:
            units = _by_kernel(context.units)
            current = _current(layout, kernels, units, self.seen)
        self.aligned = (
            current.records == previous.records
            and current.counts == previous.counts
            and current.names == previous.names
        )
        if self.aligned:
            parts: list[Any] = list(map(KernelPart, *previous.columns))
            stale = sorted(_stale_aligned(previous, current))
        else:
            parts, stale = _matched_by_name(previous, current)
        if stale and not units:  # those of the kernels to make only
            names = {kernels[index].name for index in stale}
            units = _by_kernel(unit for unit in context.units if unit.extract.kernel in names)
        for index in stale:
            kernel = kernels[index]
            own = units.get(kernel.name, [])
            compiled = [recorded_result(layout.compile_dir(u), u.name) for u in own]
            extracted = {layout.extract_dir(u.extract): u.name for u in own}
            tools = frozenset(
                pair
                for directory, unit in extracted.items()
                for pair in load_extracted(directory, unit).toolchain
            )
            parts[index] = make_part(kernel, compiled, tools)
        self.current.kernels, self.parts, self.made = current, parts, stale
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
        """Append the parts this bundle made to the memo file (a kilobyte for a
        one-kernel edit, where the whole memo is 12 MB at 10,000 units), or write it anew
        when its kernels or records are not the memo's, or once the updates would cost
        a load more than the snapshot does."""
        previous, current = self.previous, self.current
        if (
            self.aligned
            and not self.made
            and current.digests == previous.digests
            and current.definition == previous.definition
        ):
            return
        kernels = current.kernels
        changes = [_change(kernels, index, self.parts[index]) for index in self.made]
        with contextlib.suppress(OSError):  # a hint: without it the next bundle computes all
            if not (
                self.aligned
                and previous.updates < MAX_UPDATES
                and plaindata.append(
                    self.file,
                    previous.length,
                    previous.snapshot_length,
                    plaindata.dumps((changes, current.digests, current.definition)),
                )
            ):
                kernels.columns = _columns(self.parts)
                # Not fsync'ed: one lost to a power cut only costs the next bundle its time.
                state = plaindata.dumps(current.to_state())
                atomic_write_bytes(self.file, state, durable=False)


def _columns(parts: Sequence[KernelPart]) -> Columns:
    """The parts as the memo keeps them. The small tuples most kernels share (targets,
    dtypes, versions, tools) are made one object each, which pickle then writes once and
    reads back as one."""
    if not parts:
        return _no_kernels().columns
    columns = [list(column) for column in zip(*parts, strict=True)]
    columns[KernelPart._fields.index("module")] = [None] * len(parts)  # not kept
    shared: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    for field in ("targets", "dtypes", "compiler_versions", "tools"):
        at = KernelPart._fields.index(field)
        columns[at] = list(map(shared.setdefault, columns[at], columns[at]))
    return columns


def _change(kernels: _Kernels, index: int, part: KernelPart) -> tuple[object, ...]:
    """An update's entry for a part made again: what the memo keeps of its kernel."""
    return (index, part.name, kernels.configs[index], kernels.stat_span(index), _kept(part))


def _kept(part: KernelPart) -> tuple[Any, ...]:
    """A part's fields as the memo keeps them: its module left out (its sha256 kept)."""
    return part._replace(module=None)[:]


def _by_kernel(units: Iterable[BuildUnit]) -> dict[str, list[BuildUnit]]:
    grouped: dict[str, list[BuildUnit]] = {}
    for unit in units:
        grouped.setdefault(unit.kernel, []).append(unit)
    return grouped


def _same_kernels(previous: _Kernels, seen: SeenStats) -> _Kernels:
    """The memo's kernels and records, with the records' stamps now."""
    columns: Columns = [previous.names, *([] for _ in KernelPart._fields[1:])]
    stats = seen.stamps(previous.record_paths())
    return _Kernels(previous.configs, previous.records, previous.counts, stats, columns)


def _current(
    layout: Layout,
    kernels: Sequence[Kernel],
    units: Mapping[str, Sequence[BuildUnit]],
    seen: SeenStats,
) -> _Kernels:
    """The kernels' configs and their records' paths and stamps (the parts not made yet):
    15,000 records at 10,000 units, taken as `seen` where it has them."""
    records: list[str] = []
    counts = []
    compile_path, extract_path = layout.compile_path, layout.extract_path
    for kernel in kernels:
        own = units.get(kernel.name, ())
        records += [f"{compile_path(unit)}/{RESULT_FILE}" for unit in own]
        # An extraction serves every target of its variant: stat'ed once.
        extractions = {unit.extract.name: unit.extract for unit in own}
        records += [f"{extract_path(spec)}/{METADATA_FILE}" for spec in extractions.values()]
        counts.append(len(own) + len(extractions))
    stats = seen.stamps(records)
    configs = list(map(marshal.dumps, [kernel.config() for kernel in kernels], repeat(0)))
    columns: Columns = [[kernel.name for kernel in kernels]]
    columns += ([] for _ in KernelPart._fields[1:])
    return _Kernels(configs, "\0".join(records), counts, stats, columns)


def _stale_aligned(previous: _Kernels, current: _Kernels) -> set[int]:
    """The kernels whose part is not to be kept, where the memo has the same kernels and
    records in the same order: a config or a stat differs, or a record is missing.
    Compared column against column: only a difference costs a lookup."""
    stale: set[int] = set()
    stats = current.stats
    if stats != previous.stats or None in stats:  # else (no edit) no lookup at all
        ends = list(accumulate(current.counts))
        differ = compress(count(), map(ne, stats, previous.stats))
        missing = compress(count(), map(is_, stats, repeat(None)))
        stale.update(bisect_right(ends, record) for record in chain(differ, missing))
    if current.configs != previous.configs:
        stale.update(compress(count(), map(ne, current.configs, previous.configs)))
    return stale


def _matched_by_name(previous: _Kernels, current: _Kernels) -> tuple[list[Any], list[int]]:
    """Where kernels were added, removed or moved: each kernel's part from the memo's
    entry of the same name if its config, records and their stats are as recorded, else
    None, to be made; and the indexes of the kernels to make."""
    where = dict(zip(previous.names, count()))
    previous_paths, paths = previous.record_paths(), current.record_paths()
    previous_starts = [0, *accumulate(previous.counts)]
    parts: list[Any] = []
    stale = []
    start = 0
    for index, (name, config, number) in enumerate(
        zip(current.names, current.configs, current.counts, strict=True)
    ):
        end = start + number
        at = where.get(name)
        own = current.stats[start:end]
        kept = (
            at is not None
            and previous.configs[at] == config
            and previous_paths[previous_starts[at] : previous_starts[at + 1]] == paths[start:end]
            and previous.stat_span(at) == own
            and None not in own
        )
        parts.append(KernelPart._make(column[at] for column in previous.columns) if kept else None)
        if not kept:
            stale.append(index)
        start = end
    return parts, stale


def _scope(context: BuildContext) -> tuple[str, ...]:
    from nkibuild.bundle import generator_digest, split_targets

    manifest: Manifest = context.manifest
    return (
        MEMO_FORMAT,
        __version__,
        generator_digest(),
        str(context.layout.build_dir),
        f"{RESULT_FILE} {METADATA_FILE}",  # the records' names (the definition has not)
        json.dumps(vars(manifest.package), sort_keys=True),
        ",".join(split_targets(manifest)),
    )


def _load(memo_file: Path, scope: tuple[str, ...]) -> _Memo:
    """The memo's snapshot with the updates appended after it applied in order, up to
    the first that is torn or damaged (a killed append: the next save writes anew), if
    every value then has the type the bundle reads (else no memo: every part is made)."""
    memo = None
    try:
        for value, end in plaindata.read_records(memo_file):
            if memo is None:
                memo = _snapshot(value, scope, end)
            elif not _updated(memo, value, end):
                break
    except (OSError, ValueError, TypeError):  # none yet, damaged, another layout
        return _Memo(scope, _no_kernels(), {})
    if memo is None or not _well_formed(memo.kernels):
        return _Memo(scope, _no_kernels(), {})
    return memo


def _snapshot(value: Any, scope: tuple[str, ...], end: int) -> _Memo:
    saved_scope, state, digests, definition = value
    if saved_scope != scope or not _digests(digests) or type(definition) is not str:
        raise ValueError("another build's memo")
    configs, records, counts, stats, columns = state
    if type(columns) is not list or len(columns) != len(KernelPart._fields):
        raise ValueError("not the memo's columns")
    if type(records) is not str or not plaindata.only([configs, counts, stats, *columns], list):
        raise ValueError("not the memo's columns")
    kernels = _Kernels(configs, records, counts, stats, columns)
    return _Memo(scope, kernels, digests, end, end, definition=definition)


def _updated(memo: _Memo, value: Any, end: int) -> bool:
    """Apply an update appended to the memo (the parts made by a bundle of the same
    kernels and records); False, none of it applied, if it is not one (what follows is
    not trusted: a part of it applied would leave the memo under a definition that does
    not describe it). Its values are checked with the rest of the memo's once all are
    applied."""
    try:
        changes, digests, definition = value
        if type(changes) is not list or not _digests(digests) or type(definition) is not str:
            return False
        kernels = memo.kernels
        changes = [tuple(change) for change in changes]
        for index, name, _, stats, row in changes:  # all checked before any is applied
            if not (
                type(index) is int
                and 0 <= index < len(kernels.names)
                and kernels.names[index] == name
                and type(row) is tuple
                and len(row) == len(KernelPart._fields)
                and row[0] == name
                and type(stats) is list
                and len(stats) == kernels.counts[index]
            ):
                return False
        for index, _, config, stats, row in changes:
            kernels.stats[kernels.stat_slice(index)] = stats
            kernels.configs[index] = config
            for column, field in zip(kernels.columns, row, strict=True):
                column[index] = field
    except (TypeError, ValueError, LookupError, AttributeError):
        return False
    memo.digests = digests
    memo.definition = definition
    memo.length = end
    memo.updates += 1
    return True


def _well_formed(kernels: _Kernels) -> bool:
    """Whether every value of the memo has the type the bundle reads: the pickle holds
    plain data, but not necessarily of these shapes. Checked a column at a time."""
    lists = (kernels.configs, kernels.counts, kernels.stats, *kernels.columns)
    if not plaindata.only(lists, list) or type(kernels.records) is not str:
        return False
    names, infos, modules, shas, neffs, targets, dtypes, versions, tools, flags = kernels.columns
    if any(len(column) != len(names) for column in (kernels.configs, kernels.counts, *lists[3:])):
        return False
    if not (
        plaindata.only(names, str)
        and plaindata.only(infos, bytes)
        and plaindata.only(shas, str)
        and plaindata.only(modules, type(None))
        and plaindata.only(kernels.configs, bytes)
        and plaindata.only(flags, bool)
        and plaindata.only(kernels.counts, int)
        and plaindata.only(kernels.stats, str, type(None))
        and all(plaindata.only(group, tuple) for group in (targets, dtypes, versions, tools))
        and plaindata.only(chain.from_iterable(chain(targets, dtypes, versions)), str)
        and _packed_rows(neffs)
        and _rows_of(tools, 2)
    ):
        return False
    total = sum(kernels.counts)
    records = kernels.records.count("\0") + 1 if kernels.records else 0
    return min(kernels.counts, default=0) >= 0 and records == total and len(kernels.stats) == total


def _packed_rows(packed: list[str]) -> bool:
    """Whether each kernel's NEFFs are rows packed as `packed_neffs` packs them."""
    if not plaindata.only(packed, str):
        return False
    fields = set(map(NEFF_FIELDS.__rmod__, map(str.count, packed, repeat("\0"))))
    return fields <= {0} and all(map(methodcaller("endswith", "\0"), filter(None, packed)))


def _rows_of(groups: list[tuple[Any, ...]], width: int) -> bool:
    """Whether each group holds tuples of `width` strings."""
    rows = list(chain.from_iterable(groups))
    return (
        plaindata.only(rows, tuple)
        and set(map(len, rows)) <= {width}
        and plaindata.only(chain.from_iterable(rows), str)
    )


def _digests(value: object) -> bool:
    """path -> (stat, sha256), all strings: what `file_sha256` reads without checking."""
    return isinstance(value, dict) and all(
        isinstance(path, str)
        and isinstance(known, tuple)
        and len(known) == 2
        and all(isinstance(part, str) for part in known)
        for path, known in value.items()
    )
