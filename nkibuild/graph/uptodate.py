"""A per-task proof of being up to date, so a build asks doit only about what may have changed.

After a build, nkibuild records for every task doit found up to date (or ran
successfully) a fingerprint of its definition (file_dep, targets, config values)
and the stat of every file it involves: dependencies, targets and the files in its
output directories. It also records the stat of doit's own state file and the
sha256 of each source file (a file_dep that no task writes).

The next build compares. A task whose fingerprint and files are unchanged is up to
date without asking doit, because doit's decision about it depends on nothing else.
A source whose stat changed but whose content did not (touched, rewritten with the
same bytes, restored by a checkout) is re-recorded without rebuilding anything. The
remaining tasks, with every task downstream of them, are handed to doit, which
checks content hashes as usual; tasks upstream of them are already proven and are
not loaded, so doit treats their outputs as plain files.

Anything that is not understood distrusts the whole proof: a different nkibuild,
an unreadable stamp, or doit's state file changed behind nkibuild's back (a plain
`doit` run, `doit forget`).

Stats compare size, mtime, ctime and inode: ctime cannot be set back by tools that
restore mtimes, so a rewrite within the same mtime tick is still seen. The stamp is
written atomically; a build killed before writing it leaves the previous stamp, whose
stats then no longer match the files the killed build rewrote.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import marshal
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from itertools import chain
from pathlib import Path
from typing import Any

from nkibuild import __version__, plaindata
from nkibuild.cache.key import file_sha256
from nkibuild.fsutil import SeenStats, atomic_write_bytes, stamp_ctime_ns, stat_stamp
from nkibuild.graph.intact import CHECK_SIGNATURE, OutputsIntact, Recorded, output_files

STAMP_FILE = "up-to-date.stamp"
FORMAT = 6  # 4: fingerprints of marshal bytes; 6: the stamp a plain-data pickle, not JSON
Stat = str  # fsutil.stat_stamp: "size mtime_ns ctime_ns inode"


def task_name(task: dict[str, Any]) -> str:
    return f"{task['basename']}:{task['name']}" if "name" in task else task["basename"]


class ConfigChanged:
    """doit's `config_changed` check, made when doit first uses it: a build whose every
    task the proof covers never imports doit (a fifth of a 1,000-unit no-op's time).
    Fingerprints read `config`; doit stores and compares its digest (`config_digest`),
    or `known`, the digest a build computed for this config (`remember_digests`)."""

    __signature__ = CHECK_SIGNATURE
    # Class defaults, set on an instance only when they differ: a build makes 15,000.
    known: str | None = None
    costly = False  # its digest was computed, from JSON of COSTLY_CONFIG or more

    def __init__(self, config: dict[str, Any] | str, known: str | None = None) -> None:
        self.config = config
        if known is not None:
            self.known = known

    @functools.cached_property
    def digest(self) -> str:
        if self.known is not None:
            return self.known
        if isinstance(self.config, str):
            return self.config
        encoded = _config_json(self.config)
        self.costly = len(encoded) >= COSTLY_CONFIG
        return _json_digest(encoded)

    @functools.cached_property
    def _check(self) -> Any:
        from doit.tools import config_changed

        return config_changed(self.digest)

    def configure_task(self, task: Any) -> None:
        self._check.configure_task(task)

    def __call__(self, task: Any, values: dict[str, Any]) -> bool:
        return self._check(task, values)

    def __repr__(self) -> str:  # as doit's, which names it in `doit info`'s reasons
        return repr(self._check)


def config_digest(config: dict[str, Any] | str) -> str:
    """What doit stores and compares for a task's config: a string as it is; a dict's
    sha256 of its JSON as built (doit's sorts every mapping's keys first, 30 ms for the
    bundle's 5,000 kernels, 18 ms without). Equal configs built alike give equal JSON;
    a mapping in another order only reruns the task. What JSON cannot write is refused
    as doit refuses it (TypeError)."""
    if isinstance(config, str):
        return config
    return _json_digest(_config_json(config))


def _config_json(config: dict[str, Any]) -> str:
    # No check for circular references (a config is a tree built from the plan): a
    # fifth faster for the bundle's 1.4 MB, and the same text.
    return json.dumps(config, separators=(",", ":"), check_circular=False)


def _json_digest(encoded: str) -> str:
    return "json:" + hashlib.sha256(encoded.encode()).hexdigest()


# A config whose JSON is this long or longer has its digest remembered between builds
# (DIGESTS_FILE): the bundle's, 1.4 MB and 25 ms at 10,000 units, which every edit hands
# to doit with the same config.
COSTLY_CONFIG = 100_000
DIGESTS_FILE = "config-digests.pickle"
Digests = dict[str, tuple[str, list[str]]]  # task -> (fingerprint, its configs' digests)


def known_digests(state_dir: Path) -> Digests:
    """The digests remembered by the last build (`remember_digests`); none if unreadable."""
    try:
        with open(state_dir / DIGESTS_FILE, "rb") as handle:
            known = plaindata.load(handle)
    except (OSError, ValueError):
        return {}
    if not isinstance(known, dict):
        return {}
    return {
        name: (entry[0], entry[1])
        for name, entry in known.items()
        if type(name) is str
        and type(entry) is tuple
        and len(entry) == 2
        and type(entry[0]) is str
        and type(entry[1]) is list
        and plaindata.all_strings(entry[1])
    }


def config_checks(task: dict[str, Any]) -> list[ConfigChanged]:
    return [check for check in task.get("uptodate", ()) if isinstance(check, ConfigChanged)]


def with_known_digests(task: dict[str, Any], name: str, decision: Decision) -> dict[str, Any]:
    """`task` with the digests remembered for its configs, if its fingerprint is the one
    they were remembered with (its configs are then those: see `remember_digests`)."""
    known = decision.digests.get(name)
    checks = config_checks(task)
    if known is None or known[0] != decision.fingerprints[name] or len(known[1]) != len(checks):
        return task
    digests = dict(zip(map(id, checks), known[1], strict=True))
    uptodate = [
        ConfigChanged(check.config, digests[id(check)]) if id(check) in digests else check
        for check in task["uptodate"]
    ]
    return {**task, "uptodate": uptodate}


def remember_digests(state_dir: Path, decision: Decision, verified: Mapping[str, int]) -> None:
    """Remember the costly digests the build computed, for the next build that hands their
    task to doit with the same fingerprint (`with_known_digests`). An equal fingerprint
    means equal configs where they marshal (exact builtin types, their marshal bytes in
    the fingerprint) or, failing marshal elsewhere in the task, where their reprs are
    equal, which for exact builtin types is equal values of equal types too: the JSON
    and its digest are then the same. Best effort: without it doit computes them."""
    fingerprints = decision.fingerprints
    known = {
        name: entry
        for name, entry in decision.digests.items()
        if fingerprints.get(name) == entry[0]
    }
    for name in decision.pending:
        checks = config_checks(decision.graph.by_name[name])
        costly = checks and all(check.costly for check in checks)
        if name in verified and costly and all(_marshals(check.config) for check in checks):
            known[name] = (fingerprints[name], [check.digest for check in checks])
    if known != decision.digests:
        with contextlib.suppress(OSError):
            atomic_write_bytes(state_dir / DIGESTS_FILE, plaindata.dumps(known), durable=False)


def _marshals(value: object) -> bool:
    try:
        marshal.dumps(value, 0)
    except ValueError:
        return False
    return True


def fingerprint(task: dict[str, Any]) -> str:
    """What doit's decision about `task` depends on, besides its files and its state."""
    configs = [getattr(check, "config", check) for check in task.get("uptodate", ())]
    entry = (task["file_dep"], task["targets"], task.get("task_dep", ()), configs)
    # marshal, not JSON or repr: three times faster than repr, and the values are built
    # the same way each build. Format 0 writes no back-references nor interning flags,
    # so equal values give equal bytes; what marshal cannot write (an object) is taken
    # by its repr, prefixed apart. Bytes that differ for equal values (dict order, an
    # object's address) only hand the task to doit, which then decides by value.
    try:
        encoded = b"m" + marshal.dumps(entry, 0)
    except ValueError:
        encoded = b"r" + repr(entry).encode()
    return hashlib.sha256(encoded).hexdigest()


def _size(stat: Stat) -> int:
    return int(stat.split(" ", 1)[0])


MAPS = ("tasks", "files", "digests", "listings")  # a proof's fields that are dicts
MAX_CHANGES = 100  # appended to a stamp before it is written whole again


@dataclass
class Proof:
    """The recorded stamp: see the module docstring."""

    tasks: dict[str, str] = field(default_factory=dict)  # name -> fingerprint
    files: dict[str, Stat] = field(default_factory=dict)  # path -> stat
    digests: dict[str, str] = field(default_factory=dict)  # source path -> sha256
    listings: dict[str, list[str]] = field(default_factory=dict)  # name -> files in its dirs
    state: Stat | None = None  # doit's state file

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "nkibuild": __version__, **vars(self)}


@dataclass(frozen=True)
class StampRead:
    """A proof and how its stamp was read: bytes (all of them whole), the snapshot's,
    and the number of changes appended after the snapshot."""

    proof: Proof
    length: int
    snapshot: int
    changes: int


def load(state_dir: Path) -> StampRead | None:
    """The recorded proof: the stamp's snapshot with the changes appended after it
    applied in order, up to the first cut short or not understood."""
    stamp = None
    try:
        for value, end in plaindata.read_records(state_dir / STAMP_FILE):
            if stamp is None:
                proof = _snapshot(value)
                if proof is None:
                    return None  # another layout: nothing is proven
                stamp = StampRead(proof, end, end, 0)
            elif _applied(stamp.proof, value):
                stamp = replace(stamp, length=end, changes=stamp.changes + 1)
            else:
                break
    except OSError:
        return None
    return stamp if stamp is not None and _well_formed(stamp.proof) else None


def _snapshot(data: object) -> Proof | None:
    """The stamp's first record as a proof whose maps are dicts (changes are applied to
    them before the whole is checked); None if it is not one."""
    if not isinstance(data, dict) or data.pop("format", None) != FORMAT:
        return None
    if data.pop("nkibuild", None) != __version__:
        return None
    try:
        proof = Proof(**data)
    except TypeError:
        return None
    return proof if all(type(getattr(proof, name)) is dict for name in MAPS) else None


def _applied(proof: Proof, change: object) -> bool:
    """Apply a change appended to the stamp (`_change`); False if it is not one. What it
    sets is checked with the whole proof (`_well_formed`)."""
    if not (isinstance(change, dict) and change.keys() == {*MAPS, "state"}):
        return False
    if not all(type(change[name]) is dict for name in MAPS):
        return False
    for name in MAPS:
        recorded = getattr(proof, name)
        for key, value in change[name].items():
            if value is None:
                recorded.pop(key, None)
            else:
                recorded[key] = value
    proof.state = change["state"]
    return True


def _change(previous: Proof, proof: Proof) -> dict[str, Any]:
    """What turns `previous` into `proof`: each map's new and changed entries, None for
    those removed (a dict compare per entry)."""
    change: dict[str, Any] = {"state": proof.state}
    for name in MAPS:
        before, after = getattr(previous, name), getattr(proof, name)
        changed = {key: value for key, value in after.items() if before.get(key) != value}
        changed.update(dict.fromkeys(before.keys() - after.keys()))
        change[name] = changed
    return change


def encode(proof: Proof) -> bytes:
    """The stamp's bytes: a pickle of plain data, which writes and reads the 50,000 stats
    of a 10,000-unit build several times faster than JSON (`load` refuses any class and
    checks every field's type, as for a stamp damaged on disk)."""
    return plaindata.dumps(proof.to_dict())


def _well_formed(proof: Proof) -> bool:
    """Every field of the type deciding relies on (a damaged stamp is no traceback),
    each checked with one join and one regular expression rather than a Python loop per
    value."""
    maps = (proof.tasks, proof.files, proof.digests, proof.listings)
    if not all(type(m) is dict for m in maps):
        return False
    listings = proof.listings.values()
    if not all(type(files) is list for files in listings):
        return False
    keys = chain.from_iterable(maps)
    return (
        plaindata.all_strings(chain(keys, proof.tasks.values(), proof.digests.values(), *listings))
        and _all_stats(list(proof.files.values()))
        and (proof.state is None or _all_stats([proof.state]))
    )


# What `stat_stamp` writes: size, mtime, ctime (negative before 1970) and inode as ASCII
# decimal integers (str.isdigit would take "²", which int() refuses) of at most 20
# digits (int() refuses thousands); one stat per line once joined.
_NUMBER = "[0-9]{1,20}"
_STAT = rf"{_NUMBER} -?{_NUMBER} -?{_NUMBER} {_NUMBER}"
_STAT_LINES = re.compile(rf"{_STAT}(?:\n{_STAT})*")


def _all_stats(values: list[object]) -> bool:
    if not values:
        return True
    try:
        lines = "\n".join(values)  # type: ignore[arg-type]
    except TypeError:
        return False
    # No value may hold a newline itself: as many lines as values.
    return lines.count("\n") == len(values) - 1 and _STAT_LINES.fullmatch(lines) is not None


def forget(state_dir: Path) -> None:
    (state_dir / STAMP_FILE).unlink(missing_ok=True)


class Graph:
    """The build's tasks with what the proof needs of each: name, files, producers."""

    def __init__(self, dicts: list[dict[str, Any]]) -> None:
        self.dicts = dicts
        self.names = [task_name(task) for task in dicts]
        self.by_name = dict(zip(self.names, dicts, strict=True))
        self.producer = {path: name for name, t in self.by_name.items() for path in t["targets"]}

    def files(self, name: str, listing: Iterable[str] = ()) -> Iterable[str]:
        """The task's file_dep, targets and `listing` (the files in its output dirs)."""
        task = self.by_name[name]
        return (*task["file_dep"], *task["targets"], *listing)

    def reads(self, name: str, paths: set[str]) -> bool:
        return not paths.isdisjoint(self.by_name[name]["file_dep"])

    def sources(self, name: str) -> list[str]:
        return [path for path in self.by_name[name]["file_dep"] if path not in self.producer]

    def downstream(self, seeds: Iterable[str], read: Iterable[str] = ()) -> list[str]:
        """`seeds`, every task that reads one of the files `read`, and every task that
        reads an output of one of those, in graph order.

        Passes over the tasks until one reaches no more (the second, where producers come
        before their readers, as in a build's graph): each a lookup per file_dep in the
        few paths read or written by the tasks reached, not a map of every task's readers
        made first (20 ms at 10,000 units)."""
        reached = set(seeds)
        written = {path for name in reached for path in self.by_name[name]["targets"]}
        written.update(read)
        grew = bool(written or reached)
        while grew:
            grew = False
            for name, task in self.by_name.items():
                if name in reached or (
                    written.isdisjoint(task["file_dep"])
                    and reached.isdisjoint(task.get("task_dep", ()))
                ):
                    continue
                reached.add(name)
                written.update(task["targets"])
                grew = True
        return [name for name in self.names if name in reached]


def _listing(task: dict[str, Any], written: Recorded | None) -> list[str]:
    """The files in the task's output directories: those it recorded writing there (the
    bundle's thousands), else what a walk finds."""
    directories = [
        directory
        for check in task.get("uptodate", ())
        if isinstance(check, OutputsIntact)
        for directory in check.directories
    ]
    if not directories:
        return []
    if written is None:
        return sorted(output_files((), directories))
    prefixes = tuple(directory.rstrip("/") + "/" for directory in directories)
    return sorted(path for path in written.paths if path.startswith(prefixes))


@dataclass
class Decision:
    """Which tasks the proof covers and which doit must decide about."""

    graph: Graph
    fingerprints: dict[str, str]
    # As seen when deciding: with a proof, the files whose stat differs from it (the
    # others are as recorded); without one, every source.
    stats: dict[str, Stat | None]
    pending: list[str]  # doit decides about these (in graph order)
    touched: list[str]  # sources whose stat changed but whose content did not
    stamp: StampRead | None  # the proof deciding compared with, as read
    # The costly config digests the last build remembered (read when doit is handed tasks).
    digests: Digests = field(default_factory=dict)
    # Every file deciding compared with the proof, when it hands doit tasks (for `seen_by`).
    compared: dict[str, None] = field(default_factory=dict)

    @property
    def previous(self) -> Proof | None:
        return self.stamp.proof if self.stamp is not None else None

    @property
    def proven(self) -> list[str]:
        pending = set(self.pending)
        return [name for name in self.graph.names if name not in pending]


def decide(
    state_dir: Path,
    dicts: list[dict[str, Any]],
    dep_file: str,
    sources_changed: Callable[[list[str]], None] | None = None,
) -> Decision:
    """Compare the build's tasks with the recorded proof. `sources_changed` is told, as
    soon as the sources are compared and before the rest, the tasks a changed source
    makes pending (a start for their work while the rest is compared); not called
    without a proof, where every task is pending."""
    graph = Graph(dicts)
    stamp = load(state_dir)
    proof = stamp.proof if stamp is not None else None
    if proof is None or proof.state is None or proof.state != stat_stamp(dep_file):
        # doit decides about every task; recording needs the sources' stats from now.
        stats = {path: stat_stamp(path) for name in graph.names for path in graph.sources(name)}
        digests = known_digests(state_dir)
        return Decision(graph, _fingerprints(graph), stats, list(graph.names), [], None, digests)
    # The sources the proof recorded first (their tasks' work can start while the rest
    # is compared), then the other files. Only a source is taken as touched: a task's
    # output rewritten with bytes a digest once recorded (when it was a source) is not
    # what that task wrote. Output dirs are not walked: a file added there is ignored
    # (see OutputsIntact), a recorded one removed or changed is seen by its stat.
    sources = {path: None for path in proof.digests if path not in graph.producer}
    stats = _differing(sources, proof.files)
    touched = [path for path in sorted(stats) if _same_content(path, stats[path], proof)]
    edited = set(stats).difference(touched)
    if edited and sources_changed is not None:
        sources_changed([name for name in graph.names if graph.reads(name, edited)])
    fingerprints = _fingerprints(graph)
    listings = proof.listings
    every = (graph.files(name, listings.get(name, ())) for name in graph.names)
    compared = dict.fromkeys(chain.from_iterable(every))  # each file once
    stats.update(_differing((path for path in compared if path not in sources), proof.files))
    changed = set(stats).difference(touched)
    # Pending: a task whose definition changed, or one of whose files did (it writes it,
    # has it in its output dirs, or reads it: `downstream` finds the readers).
    seeds = [name for name in graph.names if proof.tasks.get(name) != fingerprints[name]]
    if changed:
        seeds += (graph.producer[path] for path in changed if path in graph.producer)
        seeds += (
            name
            for name, listing in listings.items()
            if name in graph.by_name and not changed.isdisjoint(listing)
        )
    pending = graph.downstream(seeds, read=changed)
    if not pending:
        return Decision(graph, fingerprints, stats, pending, touched, stamp)
    digests = known_digests(state_dir)
    return Decision(graph, fingerprints, stats, pending, touched, stamp, digests, compared)


def _fingerprints(graph: Graph) -> dict[str, str]:
    return {name: fingerprint(task) for name, task in graph.by_name.items()}


def _differing(paths: Iterable[str], recorded: dict[str, Stat]) -> dict[str, Stat | None]:
    """The stats of `paths` that differ from `recorded` (None: the file is gone)."""
    stats: dict[str, Stat | None] = {}
    for path in paths:
        stat = stat_stamp(path)
        if stat is None or recorded.get(path) != stat:
            stats[path] = stat
    return stats


def seen_by(decision: Decision, name: str) -> SeenStats:
    """The stamps deciding saw, for pending task `name` to take instead of stat'ing the
    same files again when it runs: those of the files deciding found as the proof
    recorded them, but any written by another pending task, which may have run before
    it (its targets, and the files in its output dirs). The files in `name`'s own output
    dirs are its alone (nkibuild's tasks write into no other task's): as seen until it
    writes them. A file changed after deciding (by anyone else) keeps the stamp seen in
    what `name` records; the next build finds that stamp differs and asks doit again."""
    previous = decision.previous
    if previous is None or not decision.compared:
        return SeenStats()
    graph = decision.graph
    unseen = set(decision.stats)
    for other in decision.pending:
        if other != name:
            unseen.update(graph.by_name[other]["targets"], previous.listings.get(other, ()))
    return SeenStats(previous.files, decision.compared, unseen)


def _same_content(path: str, stat: Stat | None, proof: Proof) -> bool:
    recorded = proof.digests.get(path)
    previous = proof.files.get(path)
    if stat is None or recorded is None or previous is None or _size(stat) != _size(previous):
        return False
    return _digest(path, stat) == recorded


def _digest(path: str, stat: Stat | None) -> str | None:
    """sha256 of `path` if it still has `stat` before and after hashing (else None: the
    file is being written, and the digest would not describe the content of `stat`)."""
    if stat is None:
        return None
    try:
        digest = file_sha256(path)
    except OSError:
        return None
    return digest if stat_stamp(path) == stat else None


def record(
    state_dir: Path,
    decision: Decision,
    verified: Mapping[str, int],
    dep_file: str,
    written: Mapping[str, Recorded] | None = None,
) -> None:
    """Save the proof for the proven tasks and those in `verified` (doit found them up to
    date or ran them successfully, at the time_ns given). Sources keep the stat seen when
    deciding (doit may have read them after a later change; that change is then seen
    next time). Outputs of verified tasks are stat'ed again, since the build rewrote
    them, unless the task recorded them as it wrote them (`written`: task -> its outputs'
    record, doit's values for the outputs check): a recorded stamp is the one the task
    saw, and a file changed since has another. One stat'ed here that changed after doit
    looked at its task (ctime later) is left out, so that task goes back to doit next
    time.

    Best effort: without a stamp the next build only asks doit about everything."""
    remember_digests(state_dir, decision, verified)
    proof, change = _retouched(decision) if not verified else None, None
    if proof is None:
        proof, change = _updated(decision, verified, dep_file, written or {})
    # Not fsync'ed: after a power loss a damaged stamp is unreadable, which proves nothing;
    # a change cut short is not applied, which proves only what the stamp held before.
    with contextlib.suppress(OSError):
        if not _appended(state_dir / STAMP_FILE, decision.stamp, proof, change):
            atomic_write_bytes(state_dir / STAMP_FILE, encode(proof), durable=False)


def _appended(
    file: Path, read: StampRead | None, proof: Proof, change: dict[str, Any] | None
) -> bool:
    """Append what changed since the stamp was read to it (kilobytes after an edit of
    a 10,000-unit build, whose stamp is 8 MB): `change`, or else what `_change` finds;
    False, nothing written, where it is to be written whole."""
    if read is None or read.changes >= MAX_CHANGES:
        return False
    encoded = plaindata.dumps(change if change is not None else _change(read.proof, proof))
    return plaindata.append(file, read.length, read.snapshot, encoded)


def _retouched(decision: Decision) -> Proof | None:
    """The previous proof with the touched sources' new stats, when the proof covered
    every task of this build and nothing else (what `_recorded` would make of it, without
    walking every file again); None otherwise.

    Nothing pending means every file is as recorded, or a touched source whose content
    deciding hashed under its new stat (so its digest stands)."""
    previous = decision.previous
    if previous is None or decision.pending or len(previous.tasks) != len(decision.graph.names):
        return None
    touched = {path: decision.stats[path] for path in decision.touched}
    return replace(previous, files={**previous.files, **touched})


def _updated(
    decision: Decision,
    verified: Mapping[str, int],
    dep_file: str,
    written: Mapping[str, Recorded],
) -> tuple[Proof, dict[str, Any] | None]:
    """The previous proof with the pending tasks recorded again: a proven task's files are
    all as recorded (or touched sources, re-stat'ed here), so only the tasks doit saw
    change the record; after an edit, a few of thousands. A pending task doit did not
    verify (failed, blocked) is dropped; the files it shares with recorded tasks keep
    their stats, those it alone involved are never compared again until it is recorded.
    Also returns the change from the previous proof (`_change`'s), noted as it is made.

    Without a previous proof, or with tasks in it this build no longer has, every task is
    recorded from scratch (`_recorded`), and the change is not known (None)."""
    previous = decision.previous
    if previous is None or not previous.tasks.keys() <= decision.graph.by_name.keys():
        return _recorded(decision, verified, dep_file, written), None
    touched = {path: decision.stats[path] for path in decision.touched}
    proof = Proof(
        tasks=dict(previous.tasks),
        files={**previous.files, **touched},
        digests=dict(previous.digests),
        listings=dict(previous.listings),
        state=stat_stamp(dep_file),
    )
    change: dict[str, Any] = {
        "state": proof.state,
        "files": touched,
        "digests": {},
        "tasks": {},
        "listings": {},
    }
    for name in decision.pending:
        before = proof.tasks.pop(name, None), proof.listings.pop(name, None)
        if name in verified:
            record = _task_record(decision, name, verified[name], written.get(name))
            _apply(proof, name, record, change)
        # Only what differs: the bundle's listing (15,000 files) is mostly the same.
        for map_name, value in zip(("tasks", "listings"), before, strict=True):
            if getattr(proof, map_name).get(name) != value:
                change[map_name][name] = getattr(proof, map_name).get(name)
    return proof, change


def _recorded(
    decision: Decision,
    verified: Mapping[str, int],
    dep_file: str,
    written: Mapping[str, Recorded],
) -> Proof:
    pending = set(decision.pending)
    proof = Proof(state=stat_stamp(dep_file))
    for name in decision.graph.names:
        checked = verified.get(name)
        if name in pending and checked is None:
            continue  # failed, blocked or not reached: doit decides about it next time
        _apply(proof, name, _task_record(decision, name, checked, written.get(name)))
    return proof


@dataclass
class TaskRecord:
    """What the proof records of one task: its files' stats and its sources' digests,
    None for one not to be recorded (removed from the proof if it was)."""

    fingerprint: str
    listing: list[str]
    files: dict[str, Stat | None]
    digests: dict[str, str | None]


def _apply(
    proof: Proof, name: str, record: TaskRecord, change: dict[str, Any] | None = None
) -> None:
    """Record one task into `proof`; note in `change` which of its files and digests
    differ from what `proof` had."""
    proof.tasks[name] = record.fingerprint
    if record.listing:
        proof.listings[name] = record.listing
    for field_name, entries in (("files", record.files), ("digests", record.digests)):
        recorded = getattr(proof, field_name)
        # A dict lookup per entry, no write for those as recorded: the bundle's 25,000
        # files after an edit, of which a few changed.
        differ = {key: value for key, value in entries.items() if recorded.get(key) != value}
        for key, value in differ.items():
            if value is None:
                del recorded[key]
            else:
                recorded[key] = value
        if change is not None:
            change[field_name].update(differ)


def _task_record(
    decision: Decision,
    name: str,
    checked: int | None,
    outputs: Recorded | None,
) -> TaskRecord:
    """What the proof records of one task: proven (`checked` None: its recorded files were
    all checked when deciding) or verified by doit at `checked` (time_ns)."""
    graph, previous = decision.graph, decision.previous or Proof()
    files: dict[str, Stat | None] = {}
    if checked is None:
        listing = previous.listings.get(name, [])
    else:
        listing = _listing(graph.by_name[name], outputs)
        # No longer in its output dirs: nobody's file.
        files.update(dict.fromkeys(set(previous.listings.get(name, ())).difference(listing)))
    task = graph.by_name[name]
    sources = graph.sources(name)
    # Another task's output this one read is recorded by its producer alone: a stat taken
    # here, after the producer was checked, would hide a change since from it.
    read = set(task["file_dep"]).difference(sources)
    own = [path for path in chain(task["targets"], listing) if path not in read]
    seen, recorded = decision.stats, previous.files  # as seen when deciding
    source_stats = {path: seen[path] if path in seen else recorded.get(path) for path in sources}
    files.update(source_stats)
    if checked is None:
        files.update((path, seen[path] if path in seen else recorded.get(path)) for path in own)
    else:
        written = dict(zip(outputs.paths, outputs.stamps, strict=True)) if outputs else {}
        for path in own:
            files[path] = written[path] if path in written else _stat_before(path, checked)
    digests: dict[str, str | None] = {}
    for path in sources:
        # None: an older digest would pass other content as this stat's.
        digests[path] = _source_digest(path, source_stats[path], previous)
    return TaskRecord(decision.fingerprints[name], listing, files, digests)


def _stat_before(path: str, checked: int) -> Stat | None:
    """The stat of an output its task did not record: the file's now, None if it
    changed after doit looked at the task (at `checked`)."""
    stat = stat_stamp(path)
    return stat if stat is None or stamp_ctime_ns(stat) <= checked else None


def _source_digest(path: str, stat: Stat | None, previous: Proof) -> str | None:
    if stat is not None and previous.files.get(path) == stat and path in previous.digests:
        return previous.digests[path]
    return _digest(path, stat)
