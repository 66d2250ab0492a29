"""The per-task up-to-date proof (graph/uptodate.py): a touched file costs a content check
of that file, not a whole doit decision; a changed file hands exactly its downstream
tasks to doit; anything the proof does not understand hands everything to doit."""

from __future__ import annotations

import copy
import json
import os
import pickle
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from doit.dependency import JSONCodec
from doit.tools import config_changed
from helpers import build, manifests_parsed, parts_made, write_project

from nkibuild import fsutil, plaindata
from nkibuild.fsutil import stat_stamp
from nkibuild.graph import uptodate
from nkibuild.graph.intact import outputs_checked
from nkibuild.graph.loader import DEP_FILE
from nkibuild.graph.run import LAST_RUN_FILE
from nkibuild.graph.state import AtomicJsonDB
from nkibuild.graph.uptodate import STAMP_FILE
from nkibuild.toolchain_double.hlo_writer import build_hlo_module

SHAPE = (64, 128)


def hlo(name: str) -> bytes:
    return build_hlo_module(name, [("x", "float32", SHAPE)], [("float32", SHAPE)])


def touch(path: Path) -> None:
    """New mtime and ctime, same bytes (as an editor's save without changes)."""
    path.write_bytes(path.read_bytes())
    later = path.stat().st_mtime_ns + 5_000_000_000
    os.utime(path, ns=(later, later))


# ---- the decision on plain task dicts (no project, no doit) ----


def task(name: str, deps: list[Path], outputs: list[Path], config: str = "c") -> dict:
    return {
        "basename": "t",
        "name": name,
        "file_dep": [str(p) for p in deps],
        "targets": [str(p) for p in outputs],
        "uptodate": [config_changed(config)],
    }


@pytest.fixture
def chain(tmp_path: Path) -> tuple[Path, list[dict]]:
    """src_a -> t:a -> mid_a -> t:join <- mid_b <- t:b <- src_b, all files present."""
    files = {n: tmp_path / n for n in ("src_a", "src_b", "mid_a", "mid_b", "out", DEP_FILE)}
    for name, path in files.items():
        path.write_text(name)
    dicts = [
        task("a", [files["src_a"]], [files["mid_a"]]),
        task("b", [files["src_b"]], [files["mid_b"]]),
        task("join", [files["mid_a"], files["mid_b"]], [files["out"]]),
    ]
    return tmp_path, dicts


def checked_now(names: list[str]) -> dict[str, int]:
    """As the build's reporter notes them: doit found these up to date just now."""
    return dict.fromkeys(names, time.time_ns())


def proven_state(tmp_path: Path, dicts: list[dict]) -> uptodate.Decision:
    """Record every task as verified, then decide again."""
    dep_file = str(tmp_path / DEP_FILE)
    first = uptodate.decide(tmp_path, dicts, dep_file)
    assert first.pending == ["t:a", "t:b", "t:join"]  # no stamp yet: doit decides all
    uptodate.record(tmp_path, first, checked_now(first.pending), dep_file)
    return uptodate.decide(tmp_path, dicts, dep_file)


def test_nothing_changed_proves_every_task(chain: tuple[Path, list[dict]]) -> None:
    root, dicts = chain
    again = proven_state(root, dicts)
    assert again.pending == []
    assert again.touched == []
    assert again.proven == ["t:a", "t:b", "t:join"]


def test_a_touched_source_is_checked_by_content_and_proves_again(
    chain: tuple[Path, list[dict]],
) -> None:
    root, dicts = chain
    proven_state(root, dicts)
    touch(root / "src_a")
    decision = uptodate.decide(root, dicts, str(root / DEP_FILE))
    assert decision.pending == []
    assert decision.touched == [str(root / "src_a")]
    uptodate.record(root, decision, {}, str(root / DEP_FILE))
    after = uptodate.decide(root, dicts, str(root / DEP_FILE))
    assert (after.pending, after.touched) == ([], [])  # the new stat is recorded


def test_a_changed_source_hands_its_task_and_everything_downstream_to_doit(
    chain: tuple[Path, list[dict]],
) -> None:
    root, dicts = chain
    proven_state(root, dicts)
    (root / "src_b").write_text("edited")
    decision = uptodate.decide(root, dicts, str(root / DEP_FILE))
    assert decision.pending == ["t:b", "t:join"]
    assert decision.proven == ["t:a"]
    assert decision.touched == []


def test_downstream_reaches_readers_listed_before_their_producers(tmp_path: Path) -> None:
    """A graph in no particular order: src -> t:a -> mid -> t:b -> out -> t:c, listed
    c, b, a; and t:d, after t:c by task_dep."""
    paths = {name: str(tmp_path / name) for name in ("src", "mid", "out", "end")}
    dicts = [
        task("c", [Path(paths["out"])], [Path(paths["end"])]),
        {**task("d", [], []), "task_dep": ["t:c"]},
        task("b", [Path(paths["mid"])], [Path(paths["out"])]),
        task("a", [Path(paths["src"])], [Path(paths["mid"])]),
        task("other", [], [tmp_path / "other"]),
    ]
    graph = uptodate.Graph(dicts)
    assert graph.downstream(["t:a"]) == ["t:c", "t:d", "t:b", "t:a"]
    assert graph.downstream(["t:b"]) == ["t:c", "t:d", "t:b"]
    assert graph.downstream([]) == []


def test_the_tasks_of_changed_sources_are_named_before_the_rest_is_compared(
    chain: tuple[Path, list[dict]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`sources_changed` hears of t:b (its source's content changed) while no output has
    been stat'ed yet: its work can start while the rest is compared."""
    root, dicts = chain
    proven_state(root, dicts)
    (root / "src_b").write_text("edited")
    touch(root / "src_a")  # same content: no work to start for t:a
    stated: list[str] = []
    monkeypatch.setattr(
        uptodate, "stat_stamp", lambda path: stated.append(path) or stat_stamp(path)
    )
    heard: list[tuple[list[str], list[str]]] = []
    decision = uptodate.decide(
        root, dicts, str(root / DEP_FILE), lambda names: heard.append((names, list(stated)))
    )
    outputs = [str(root / name) for name in ("mid_a", "mid_b", "out")]
    ((names, stated_then),) = heard
    assert names == ["t:b"]
    assert not set(outputs) & set(stated_then)
    assert set(outputs) <= set(stated)  # compared after
    assert decision.pending == ["t:b", "t:join"]
    assert decision.touched == [str(root / "src_a")]


def test_no_changed_source_and_no_proof_name_no_tasks_early(
    chain: tuple[Path, list[dict]],
) -> None:
    root, dicts = chain
    heard: list[list[str]] = []
    first = uptodate.decide(root, dicts, str(root / DEP_FILE), heard.append)
    assert first.pending == ["t:a", "t:b", "t:join"]  # no proof: nothing said early
    uptodate.record(root, first, checked_now(first.pending), str(root / DEP_FILE))
    touch(root / "src_a")
    (root / "mid_a").write_text("rewritten output")
    decision = uptodate.decide(root, dicts, str(root / DEP_FILE), heard.append)
    assert decision.pending == ["t:a", "t:join"]  # by the output, not a source
    assert heard == []


def test_a_touched_output_hands_its_producer_and_readers_to_doit(
    chain: tuple[Path, list[dict]],
) -> None:
    # Outputs carry no digest in the proof: doit's own checks (OutputsIntact, md5)
    # decide, and find them up to date when only the stat changed.
    root, dicts = chain
    proven_state(root, dicts)
    touch(root / "mid_a")
    assert uptodate.decide(root, dicts, str(root / DEP_FILE)).pending == ["t:a", "t:join"]


def test_an_output_dir_counts_its_recorded_files_not_new_ones(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    for name in ("a", "sub/b"):
        (tree / name).write_text(name)
    (tmp_path / DEP_FILE).write_text("state")
    _, intact = outputs_checked((), [str(tree)])
    dicts = [{"basename": "bundle", "file_dep": [], "targets": [], "uptodate": [intact]}]
    dep_file = str(tmp_path / DEP_FILE)
    first = uptodate.decide(tmp_path, dicts, dep_file)
    uptodate.record(tmp_path, first, checked_now(first.pending), dep_file)
    (tree / "added").write_text("not the task's")  # OutputsIntact ignores it too
    assert uptodate.decide(tmp_path, dicts, dep_file).pending == []
    (tree / "sub" / "b").unlink()
    assert uptodate.decide(tmp_path, dicts, dep_file).pending == ["bundle"]


def test_an_output_dir_whose_files_changed_is_appended_as_a_whole_record_would(
    tmp_path: Path,
) -> None:
    """The appended change looks only at the keys the pending tasks can have changed:
    the files gone from the task's dir are removed, those added recorded, others kept."""
    tree, source = tmp_path / "tree", tmp_path / "src"
    tree.mkdir()
    for name in ("a", "b", "c"):
        (tree / name).write_text(name)
    source.write_text("1")
    (tmp_path / DEP_FILE).write_text("state")
    _, intact = outputs_checked((), [str(tree)])
    dicts = [
        {"basename": "bundle", "file_dep": [str(source)], "targets": [], "uptodate": [intact]},
        task("other", [source], [tmp_path / "other"]),
    ]
    (tmp_path / "other").write_text("o")
    dep_file = str(tmp_path / DEP_FILE)
    first = uptodate.decide(tmp_path, dicts, dep_file)
    uptodate.record(tmp_path, first, checked_now(first.pending), dep_file)
    size = (tmp_path / STAMP_FILE).stat().st_size
    source.write_text("2")
    (tree / "a").unlink()
    (tree / "b").write_text("bb")
    (tree / "d").write_text("d")
    decision = uptodate.decide(tmp_path, dicts, dep_file)
    assert decision.pending == ["bundle", "t:other"]
    failed = checked_now(["bundle"])  # t:other failed: dropped from the proof
    proof, change = uptodate._updated(decision, failed, dep_file, {})
    assert change is not None and decision.previous is not None
    replayed = copy.deepcopy(decision.previous)
    assert uptodate._applied(replayed, change)  # as the next build reads it
    assert replayed == proof
    assert "t:other" not in proof.tasks and str(tree / "a") not in proof.files
    verified = checked_now(decision.pending)
    whole = uptodate._recorded(decision, verified, dep_file, {}).to_dict()
    assert recorded_stamp(tmp_path, decision, verified) == whole
    assert (tmp_path / STAMP_FILE).stat().st_size > size  # appended
    assert whole["listings"]["bundle"] == [str(tree / name) for name in ("b", "c", "d")]
    assert str(tree / "a") not in whole["files"]
    assert uptodate.decide(tmp_path, dicts, dep_file).pending == []
    source.write_text("3")  # the tree as it was: its listing is not appended again
    decision = uptodate.decide(tmp_path, dicts, dep_file)
    proof, change = uptodate._updated(decision, checked_now(decision.pending), dep_file, {})
    assert change is not None and change["listings"] == {} and change["tasks"] == {}
    assert proof.listings["bundle"] == whole["listings"]["bundle"]


def test_a_changed_config_hands_that_task_and_its_readers_to_doit(
    chain: tuple[Path, list[dict]],
) -> None:
    root, dicts = chain
    proven_state(root, dicts)
    dicts[0]["uptodate"] = [config_changed("other")]
    assert uptodate.decide(root, dicts, str(root / DEP_FILE)).pending == ["t:a", "t:join"]


def fingerprinted(config: object) -> str:
    return uptodate.fingerprint({"file_dep": ["/a"], "targets": ["/b"], "uptodate": [config]})


def test_a_fingerprint_tells_apart_values_that_compare_or_print_alike() -> None:
    configs = [1, True, 1.0, "1", [1], (1,), {"k": 1}, {"k": "1"}, [[1, 2]], [[1], [2]], None]
    assert len({fingerprinted(uptodate.ConfigChanged({"v": c})) for c in configs}) == len(configs)


def test_equal_values_built_apart_have_one_fingerprint() -> None:
    # Interned or not, shared or copied: the same value gives the same fingerprint.
    name = "".join(["compile", "_", "args"])
    shared = ["--target", "trn1"]
    one = {"compile_args": ["--target", "trn1"], "again": ["--target", "trn1"]}
    other = {name: shared, "again": shared}
    assert fingerprinted(uptodate.ConfigChanged(one)) == fingerprinted(
        uptodate.ConfigChanged(other)
    )


def test_checks_and_actions_declare_the_signature_doit_would_compute() -> None:
    """doit reads each check's and action's signature for every task; they are declared
    once, and must be what inspecting the call itself gives."""
    import inspect

    from nkibuild.graph import tasks
    from nkibuild.graph.intact import OutputsIntact

    def shape(signature: inspect.Signature) -> list[tuple[str, object]]:
        return [(p.name, p.kind) for p in signature.parameters.values()]

    for check in (uptodate.ConfigChanged({"v": 1}), OutputsIntact(["/a"])):
        called = shape(inspect.signature(type(check).__call__))[1:]  # without self
        assert (
            shape(inspect.signature(check))
            == called
            == [
                ("task", inspect.Parameter.POSITIONAL_OR_KEYWORD),
                ("values", inspect.Parameter.POSITIONAL_OR_KEYWORD),
            ]
        )
    for action in (tasks.run_bundle, tasks.run_wheel):
        assert inspect.signature(action) == inspect.signature(action.__wrapped__)
        assert "__signature__" in vars(action)


def test_a_check_marshal_cannot_write_is_fingerprinted_by_its_repr() -> None:
    class Check:
        def __init__(self, setting: str) -> None:
            self.setting = setting

        def __repr__(self) -> str:
            return f"Check({self.setting!r})"

        def __call__(self, task: object, values: object) -> bool:
            return True

    assert fingerprinted(Check("a")) == fingerprinted(Check("a"))
    assert fingerprinted(Check("a")) != fingerprinted(Check("b"))


def test_a_task_not_verified_by_doit_is_left_out_of_the_proof(
    chain: tuple[Path, list[dict]],
) -> None:
    root, dicts = chain
    dep_file = str(root / DEP_FILE)
    first = uptodate.decide(root, dicts, dep_file)
    uptodate.record(root, first, checked_now(["t:a", "t:b"]), dep_file)  # t:join failed
    assert uptodate.decide(root, dicts, dep_file).pending == ["t:join"]


def test_an_output_changed_after_doit_checked_its_task_is_not_proven(
    chain: tuple[Path, list[dict]],
) -> None:
    # A long build: t:b was found up to date early, then its output was rewritten
    # before the proof was recorded at the end.
    root, dicts = chain
    dep_file = str(root / DEP_FILE)
    first = uptodate.decide(root, dicts, dep_file)
    checked = checked_now(first.pending)
    time.sleep(0.05)
    (root / "mid_b").write_text("rewritten after the check")
    uptodate.record(root, first, checked, dep_file)
    assert uptodate.decide(root, dicts, dep_file).pending == ["t:b", "t:join"]


def saved_stamp(state_dir: Path) -> dict:
    """The stamp as the next build reads it: its snapshot with the changes after it."""
    read = uptodate.load(state_dir)
    assert read is not None
    return read.proof.to_dict()


def retyped(root: Path, field: str, value: object) -> None:
    (root / STAMP_FILE).write_bytes(plaindata.dumps({**saved_stamp(root), field: value}))


def truncated(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def garbled_stats(root: Path) -> None:
    """Every recorded stat (sources with digests too) replaced by a non-stat string."""
    retyped(root, "files", dict.fromkeys(saved_stamp(root)["files"], "garbage"))


def restat(root: Path, stat: str) -> None:
    """Every recorded stat replaced by `stat`."""
    retyped(root, "files", dict.fromkeys(saved_stamp(root)["files"], stat))


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda root: (root / DEP_FILE).write_text("rewritten"), id="doit-state"),
        pytest.param(lambda root: truncated(root / STAMP_FILE), id="truncated"),
        pytest.param(lambda root: (root / STAMP_FILE).write_text("[]"), id="not-a-pickle"),
        pytest.param(
            lambda root: (root / STAMP_FILE).write_bytes(plaindata.dumps([])), id="not-a-dict"
        ),
        pytest.param(lambda root: (root / STAMP_FILE).unlink(), id="missing"),
        pytest.param(lambda root: retyped(root, "files", []), id="files-a-list"),
        pytest.param(lambda root: retyped(root, "listings", {"t:a": 3}), id="listing-a-number"),
        pytest.param(lambda root: retyped(root, "files", {"x": [1, 2]}), id="stat-a-list"),
        pytest.param(lambda root: garbled_stats(root), id="stat-not-numbers"),
        pytest.param(lambda root: retyped(root, "state", "1 2 x 4"), id="state-not-numbers"),
        # str.isdigit takes these; int() refuses them.
        pytest.param(lambda root: restat(root, "\u00b2 1 1 1"), id="stat-unicode-digits"),
        pytest.param(lambda root: restat(root, "1 1 1 1\n2 2 2 2"), id="stat-two-lines"),
        pytest.param(lambda root: restat(root, "1 1 1"), id="stat-three-numbers"),
        # int() refuses more than 4,300 digits; no stat has more than 20.
        pytest.param(lambda root: restat(root, "9" * 5000 + " 1 1 1"), id="stat-huge-number"),
        pytest.param(lambda root: retyped(root, "files", {3: "1 1 1 1"}), id="path-a-number"),
        pytest.param(lambda root: retyped(root, "state", "\u0663 1 1 1"), id="state-arabic-digit"),
        pytest.param(lambda root: retyped(root, "tasks", {"t:a": 3}), id="fingerprint-a-number"),
        pytest.param(lambda root: retyped(root, "digests", {"x": None}), id="digest-null"),
        pytest.param(lambda root: retyped(root, "listings", {"t:a": [1]}), id="listed-a-number"),
        pytest.param(lambda root: retyped(root, "listings", {"t:a": "ab"}), id="listing-a-str"),
        pytest.param(
            lambda root: retyped(root, "listings", {"t:a": {"a": 1}}), id="listing-a-dict"
        ),
    ],
)
def test_what_the_proof_cannot_trust_hands_everything_to_doit(
    chain: tuple[Path, list[dict]], damage
) -> None:
    root, dicts = chain
    proven_state(root, dicts)
    damage(root)
    decision = uptodate.decide(root, dicts, str(root / DEP_FILE))
    assert decision.pending == ["t:a", "t:b", "t:join"]


def test_a_file_dated_before_1970_keeps_the_proof(chain: tuple[Path, list[dict]]) -> None:
    """Its stat has negative times, which the stamp must take as well-formed."""
    root, dicts = chain
    os.utime(root / "src_a", ns=(-(10**9), -(10**9)))
    again = proven_state(root, dicts)
    assert again.pending == []
    assert stat_stamp(str(root / "src_a")).split(" ")[1] == str(-(10**9))


def test_a_listed_path_no_file_can_have_hands_its_task_to_doit(
    chain: tuple[Path, list[dict]],
) -> None:
    root, dicts = chain
    proven_state(root, dicts)
    retyped(root, "listings", {"t:a": ["bad\u0000path"]})
    assert uptodate.decide(root, dicts, str(root / DEP_FILE)).pending == ["t:a", "t:join"]


def recorded_stamp(
    root: Path, decision: uptodate.Decision, verified: dict[str, int] | None = None
) -> dict:
    """Record `decision` after a build in which doit verified `verified` (none: it was
    asked nothing); the stamp as saved."""
    uptodate.record(root, decision, verified or {}, str(root / DEP_FILE))
    return saved_stamp(root)


def decided_after(
    chain: tuple[Path, list[dict]],
    *changes: Callable[[Path], object],
    tasks: list[dict] | None = None,
) -> tuple[Path, list[dict], str, uptodate.Decision]:
    """The chain proven, then `changes` made to its files: the decision about `tasks`
    (default: the chain's)."""
    root, dicts = chain
    proven_state(root, dicts)
    for change in changes:
        change(root)
    dep_file = str(root / DEP_FILE)
    return root, dicts, dep_file, uptodate.decide(root, dicts if tasks is None else tasks, dep_file)


def edit_src_b(root: Path) -> None:
    (root / "src_b").write_text("edited")


def after_editing_src_b(
    chain: tuple[Path, list[dict]],
) -> tuple[Path, list[dict], str, uptodate.Decision]:
    """The chain proven, then src_b edited: the decision (t:b and t:join pending)."""
    return decided_after(chain, edit_src_b)


def test_a_pending_task_sees_the_files_deciding_vouched_for_and_no_task_rewrites(
    chain: tuple[Path, list[dict]],
) -> None:
    """t:join may take mid_a (proven t:a's output) and src_a as seen; not mid_b (written
    by pending t:b), src_b (seen changed), nor any file deciding did not compare."""
    root, _, _, decision = after_editing_src_b(chain)
    seen = uptodate.seen_by(decision, "t:join")
    names = ("mid_a", "src_a", "mid_b", "src_b", "stranger")
    for name in ("mid_a", "mid_b", "src_b", "stranger"):  # each with new bytes and stamp
        (root / name).write_text(f"{name} changed after deciding, longer than it was")
    paths = [str(root / name) for name in names]
    now = [stat_stamp(path) for path in paths]
    recorded = decision.previous.files
    assert seen.stamps(paths) == [recorded[paths[0]], *now[1:]]  # mid_a: as seen
    assert now[0] != recorded[paths[0]] and now[1] == recorded[paths[1]]
    nothing = uptodate.seen_by(proven_state(root, chain[1]), "t:join")  # none pending
    assert nothing.stamps(paths) == [stat_stamp(path) for path in paths]


def test_a_touched_source_is_re_recorded_as_a_whole_record_would(
    chain: tuple[Path, list[dict]],
) -> None:
    # Nothing pending: the previous stamp is kept with the touched file's new stat,
    # which must be what recording every task again would have written.
    root, _, dep_file, decision = decided_after(chain, lambda root: touch(root / "src_b"))
    assert decision.touched == [str(root / "src_b")]
    whole = uptodate._recorded(decision, {}, dep_file, {}).to_dict()
    stamp = recorded_stamp(root, decision)
    assert stamp == whole
    assert stamp["files"][str(root / "src_b")] == stat_stamp(str(root / "src_b"))


def test_a_task_gone_from_the_build_is_dropped_when_a_touch_is_recorded(
    chain: tuple[Path, list[dict]],
) -> None:
    fewer = chain[1][:1]  # t:b and t:join no longer in the build
    root, _, dep_file, decision = decided_after(
        chain, lambda root: touch(root / "src_a"), tasks=fewer
    )
    assert (decision.pending, decision.touched) == ([], [str(root / "src_a")])
    stamp = recorded_stamp(root, decision)
    assert sorted(stamp["tasks"]) == ["t:a"]
    assert sorted(stamp["files"]) == [str(root / "mid_a"), str(root / "src_a")]
    assert uptodate.decide(root, fewer, dep_file).pending == []


def test_after_a_change_only_the_pending_tasks_are_recorded_again(
    chain: tuple[Path, list[dict]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The proven t:a is not gone over again, and the stamp is what recording every task
    # from scratch gives.
    # src_a touched: same content, new stat: a proven task's touched source
    root, dicts, dep_file, decision = decided_after(
        chain, edit_src_b, lambda root: touch(root / "src_a")
    )
    assert (decision.pending, decision.proven) == (["t:b", "t:join"], ["t:a"])
    verified = checked_now(decision.pending)
    whole = uptodate._recorded(decision, verified, dep_file, {}).to_dict()
    recorded: list[str] = []
    task_record = uptodate._task_record
    monkeypatch.setattr(
        uptodate,
        "_task_record",
        lambda d, name, *rest: recorded.append(name) or task_record(d, name, *rest),
    )
    stamp = recorded_stamp(root, decision, verified)
    assert recorded == ["t:b", "t:join"]
    assert stamp == whole
    assert uptodate.decide(root, dicts, dep_file).pending == []


def test_a_pending_task_doit_did_not_verify_stays_pending(
    chain: tuple[Path, list[dict]],
) -> None:
    root, dicts, dep_file, decision = after_editing_src_b(chain)
    stamp = recorded_stamp(root, decision, checked_now(["t:b"]))  # t:join failed
    assert sorted(stamp["tasks"]) == ["t:a", "t:b"]
    assert uptodate.decide(root, dicts, dep_file).pending == ["t:join"]


def test_a_previous_task_gone_from_the_build_records_every_task_again(
    chain: tuple[Path, list[dict]],
) -> None:
    root, _, _, decision = decided_after(
        chain, lambda root: (root / "src_a").write_text("edited"), tasks=chain[1][:1]
    )
    assert decision.pending == ["t:a"]
    stamp = recorded_stamp(root, decision, checked_now(["t:a"]))
    assert sorted(stamp["tasks"]) == ["t:a"]
    assert sorted(stamp["files"]) == [str(root / "mid_a"), str(root / "src_a")]


def simulated_build(root: Path, tasks: list[dict], run: dict) -> uptodate.Decision:
    """Decide, run the pending tasks' `run` functions (as doit would), record."""
    dep_file = str(root / DEP_FILE)
    decision = uptodate.decide(root, tasks, dep_file)
    verified = {}
    for name in decision.pending:
        run[name]()
        verified[name] = time.time_ns()
    uptodate.record(root, decision, verified, dep_file)
    return decision


def test_a_source_changed_during_the_build_keeps_no_digest_of_older_content(
    tmp_path: Path,
) -> None:
    # The task ran on "c2"; the source was edited meanwhile, then restored to "c1": the
    # digest of "c1" must not pass it as touched (the output was made from "c2").
    (tmp_path / DEP_FILE).write_text("x")
    source, output = tmp_path / "s.txt", tmp_path / "o.txt"
    made = task("a", [source], [output])

    def run_and_edit() -> None:
        output.write_text("built from " + source.read_text())
        time.sleep(0.01)
        source.write_text("c3")

    source.write_text("c1")
    simulated_build(tmp_path, [made], {"t:a": lambda: output.write_text(source.read_text())})
    source.write_text("c2")
    simulated_build(tmp_path, [made], {"t:a": run_and_edit})
    time.sleep(0.01)
    source.write_text("c1")
    decision = uptodate.decide(tmp_path, [made], str(tmp_path / DEP_FILE))
    assert (decision.pending, decision.touched) == (["t:a"], [])


def test_a_file_that_became_an_output_is_never_touched(tmp_path: Path) -> None:
    # s.txt was a source (its digest recorded); a new task now writes it. Rewritten with
    # the old source's bytes, it is not what that task wrote.
    (tmp_path / DEP_FILE).write_text("x")
    shared, output = tmp_path / "s.txt", tmp_path / "o.txt"
    reader = task("a", [shared], [output])
    writer = task("b", [], [shared])
    run = {
        "t:a": lambda: output.write_text("built from " + shared.read_text()),
        "t:b": lambda: shared.write_text("c2"),
    }
    shared.write_text("c1")
    simulated_build(tmp_path, [reader], run)
    time.sleep(0.01)
    simulated_build(tmp_path, [writer, reader], run)
    time.sleep(0.01)
    shared.write_text("c1")
    decision = uptodate.decide(tmp_path, [writer, reader], str(tmp_path / DEP_FILE))
    assert (decision.pending, decision.touched) == (["t:b", "t:a"], [])


def test_an_output_changed_after_its_producer_was_checked_is_not_recorded_by_its_reader(
    chain: tuple[Path, list[dict]],
) -> None:
    root, dicts, dep_file, decision = after_editing_src_b(chain)
    checked = checked_now(["t:b"])
    time.sleep(0.01)
    (root / "mid_b").write_text("changed after t:b was checked, before t:join was")
    uptodate.record(root, decision, {**checked, **checked_now(["t:join"])}, dep_file)
    assert uptodate.decide(root, dicts, dep_file).pending == ["t:b", "t:join"]


def test_a_stamp_naming_a_class_is_refused_unrun(chain: tuple[Path, list[dict]]) -> None:
    root, dicts = chain
    proven_state(root, dicts)
    hostile = pickle.dumps({"format": uptodate.FORMAT, "run": Path("x")})
    (root / STAMP_FILE).write_bytes(hostile)
    assert uptodate.load(root) is None
    assert len(uptodate.decide(root, dicts, str(root / DEP_FILE)).pending) == 3


def test_a_stamp_of_another_nkibuild_proves_nothing(chain: tuple[Path, list[dict]]) -> None:
    root, dicts = chain
    proven_state(root, dicts)
    retyped(root, "nkibuild", "0.0.0-other")
    assert len(uptodate.decide(root, dicts, str(root / DEP_FILE)).pending) == 3


# ---- whole builds: what doit is asked about, and what runs ----


@pytest.fixture
def two_kernels(tmp_path: Path) -> Path:
    manifest = "\n".join(
        [
            "format-version: 1",
            "package: {name: proof-kernels, version: 0.1.0}",
            "defaults: {targets: [trn1, trn2]}",
            "kernels:",
            *(
                line
                for name in ("alpha", "beta")
                for line in (
                    f"  {name}:",
                    "    frontend: hlo",
                    f"    source: kernels/{name}.pb",
                    "    inputs: {x: {shape: [64, 128], dtype: float32}}",
                )
            ),
        ]
    )
    root = write_project(
        tmp_path / "project",
        manifest + "\n",
        {"kernels/alpha.pb": hlo("alpha"), "kernels/beta.pb": hlo("beta")},
    )
    first = build(root)
    assert first.ok, first.to_json()
    return root


def last_decision(root: Path) -> dict:
    return json.loads((root / "build" / "state" / LAST_RUN_FILE).read_text())["up_to_date_decision"]


def test_touching_one_source_rebuilds_nothing_and_asks_doit_nothing(
    two_kernels: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed = manifests_parsed(monkeypatch)
    source = two_kernels / "kernels" / "alpha.pb"
    touch(source)
    summary = build(two_kernels)
    assert parsed == []  # the cached plan still served (by content)
    assert summary.ok
    assert summary.executed == []
    assert len(summary.up_to_date) == 2 + 4 + 2  # extractions, compiles, bundle, wheel
    decision = last_decision(two_kernels)
    assert decision["touched_unchanged"] == [str(source)]
    assert decision["handed_to_doit"] == 0
    assert build(two_kernels).executed == []
    assert last_decision(two_kernels)["touched_unchanged"] == []  # recorded: checked once


def test_editing_one_source_asks_doit_about_its_tasks_only(two_kernels: Path) -> None:
    (two_kernels / "kernels" / "beta.pb").write_bytes(hlo("beta-edited"))
    summary = build(two_kernels)
    assert summary.ok
    expected = [
        "extract:beta/default",
        "compile:beta/default/trn1",
        "compile:beta/default/trn2",
        "bundle",
        "wheel",
    ]
    assert sorted(summary.executed) == sorted(expected)
    assert sorted(summary.up_to_date) == [
        "compile:alpha/default/trn1",
        "compile:alpha/default/trn2",
        "extract:alpha/default",
    ]
    decision = last_decision(two_kernels)
    assert (decision["handed_to_doit"], decision["proven"]) == (5, 3)
    assert build(two_kernels).executed == []
    assert last_decision(two_kernels)["handed_to_doit"] == 0


def test_outputs_a_task_recorded_as_it_wrote_them_are_not_listed_or_stated_again(
    two_kernels: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bundle's tree (thousands of files at scale) is listed in the proof from the
    fingerprints the bundle task recorded, not walked; and those stats are the files'."""
    walked: list[tuple[str, ...]] = []
    output_files = uptodate.output_files

    def counted(files: tuple[str, ...], directories: tuple[str, ...] = ()) -> list[str]:
        walked.append(tuple(directories))
        return output_files(files, directories)

    monkeypatch.setattr(uptodate, "output_files", counted)
    (two_kernels / "kernels" / "beta.pb").write_bytes(hlo("beta-edited"))
    assert "bundle" in build(two_kernels).executed
    assert walked == []
    stamp = saved_stamp(two_kernels / "build" / "state")
    tree = two_kernels / "build" / "bundle" / "proof-kernels"
    files = sorted(str(p) for p in tree.rglob("*") if p.is_file() and p.name != ".files.pickle")
    assert stamp["listings"]["bundle"] == files
    assert all(stamp["files"][path] == stat_stamp(path) for path in files)
    assert build(two_kernels).executed == []
    assert last_decision(two_kernels)["handed_to_doit"] == 0


def test_touching_a_neff_reruns_nothing(two_kernels: Path) -> None:
    neff = next((two_kernels / "build" / "compile").glob("alpha/*/trn1/*.neff"))
    touch(neff)
    summary = build(two_kernels)
    assert summary.executed == []
    decision = last_decision(two_kernels)
    assert decision["handed_to_doit"] == 3  # its compile, the bundle, the wheel: all up to date
    assert build(two_kernels).executed == []
    assert last_decision(two_kernels)["handed_to_doit"] == 0


def test_a_build_killed_after_doit_saved_its_state_is_decided_by_doit(
    two_kernels: Path,
) -> None:
    # doit's state rewritten without the stamp following (the build died in between):
    # the stamp no longer matches it, so nothing is taken from the stamp.
    state = two_kernels / "build" / "state" / DEP_FILE
    state.write_bytes(state.read_bytes())
    (two_kernels / "kernels" / "alpha.pb").write_bytes(hlo("alpha-edited"))
    summary = build(two_kernels)
    assert last_decision(two_kernels)["handed_to_doit"] == 8
    assert sorted(summary.executed) == [
        "bundle",
        "compile:alpha/default/trn1",
        "compile:alpha/default/trn2",
        "extract:alpha/default",
        "wheel",
    ]


def test_config_digests_follow_the_values() -> None:
    config = {"kernels": [{"name": "k", "shape": [8, 16]}], "nkibuild": "1"}
    rebuilt = {"kernels": [{"name": "k", "shape": [8, 16]}], "nkibuild": "1"}
    assert uptodate.config_digest(config) == uptodate.config_digest(rebuilt)
    changed = {"kernels": [{"name": "k", "shape": [8, 17]}], "nkibuild": "1"}
    assert uptodate.config_digest(changed) != uptodate.config_digest(config)
    assert uptodate.config_digest("as it is") == "as it is"
    with pytest.raises(TypeError):  # neither marshal nor JSON: as doit's own digest
        uptodate.config_digest({"object": Path("x")})
    assert uptodate.config_digest({"n": 1.0}) != uptodate.config_digest({"n": 1})


def stamp_file(root: Path) -> tuple[int, int]:
    info = (root / STAMP_FILE).stat()
    return info.st_ino, info.st_size


def test_an_edit_appends_its_change_to_the_stamp(chain: tuple[Path, list[dict]]) -> None:
    root, _, dep_file, decision = after_editing_src_b(chain)
    inode, size = stamp_file(root)
    verified = checked_now(decision.pending)
    stamp = recorded_stamp(root, decision, verified)
    assert stamp == uptodate._recorded(decision, verified, dep_file, {}).to_dict()
    grown_inode, grown_size = stamp_file(root)
    assert grown_inode == inode and size < grown_size < 2 * size  # appended, not rewritten
    assert uptodate.decide(root, chain[1], dep_file).pending == []


def test_a_change_cut_short_leaves_the_proof_before_it(chain: tuple[Path, list[dict]]) -> None:
    root, dicts, dep_file, decision = after_editing_src_b(chain)
    before = saved_stamp(root)
    _, size = stamp_file(root)
    recorded_stamp(root, decision, checked_now(decision.pending))
    appended = (root / STAMP_FILE).read_bytes()
    for cut in (1, (len(appended) - size) // 2, len(appended) - size - 1):
        (root / STAMP_FILE).write_bytes(appended[:-cut])
        assert saved_stamp(root) == before, cut
        # The proof of before the edit: src_b's tasks go back to doit.
        assert uptodate.decide(root, dicts, dep_file).pending == ["t:b", "t:join"], cut
    damaged = plaindata.dumps({"tasks": [], "files": {}, "digests": {}, "listings": {}})
    (root / STAMP_FILE).write_bytes(appended[:size] + damaged + appended[size:])
    assert saved_stamp(root) == before  # nothing after a change not understood


def test_the_stamp_is_written_whole_after_enough_changes(
    chain: tuple[Path, list[dict]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(uptodate, "MAX_CHANGES", 1)
    root, dicts, dep_file, decision = after_editing_src_b(chain)
    recorded_stamp(root, decision, checked_now(decision.pending))
    inode, _ = stamp_file(root)
    (root / "src_b").write_text("edited again")
    again = uptodate.decide(root, dicts, dep_file)
    stamp = recorded_stamp(root, again, checked_now(again.pending))
    assert stamp_file(root)[0] != inode  # a new file (atomic rewrite) with one snapshot
    assert plaindata.loads((root / STAMP_FILE).read_bytes())["files"] == stamp["files"]
    assert uptodate.decide(root, dicts, dep_file).pending == []


def test_what_the_proof_told_doit_leaves_doits_own_state_complete(two_kernels: Path) -> None:
    """An edit built through the proof (its handed tasks told which inputs changed, doit's
    checker given the proof's timestamps): doit alone then finds every task up to date,
    and reruns exactly what a later edit affects."""
    (two_kernels / "kernels" / "beta.pb").write_bytes(hlo("beta-edited"))
    assert "bundle" in build(two_kernels).executed
    state_dir = two_kernels / "build" / "state"
    uptodate.forget(state_dir)
    assert build(two_kernels).executed == []
    (two_kernels / "kernels" / "alpha.pb").write_bytes(hlo("alpha-edited"))
    uptodate.forget(state_dir)
    executed = build(two_kernels).executed
    assert sorted(executed) == [
        "bundle",
        "compile:alpha/default/trn1",
        "compile:alpha/default/trn2",
        "extract:alpha/default",
        "wheel",
    ]


def test_a_stamp_whose_snapshot_has_no_maps_proves_nothing(
    chain: tuple[Path, list[dict]],
) -> None:
    """A change after a snapshot whose maps are not dicts is not applied to them."""
    root, dicts = chain
    proven_state(root, dicts)
    snapshot = {**saved_stamp(root), "tasks": []}
    change = {"tasks": {"t:a": "f"}, "files": {}, "digests": {}, "listings": {}, "state": None}
    (root / STAMP_FILE).write_bytes(plaindata.dumps(snapshot) + plaindata.dumps(change))
    assert uptodate.load(root) is None
    assert len(uptodate.decide(root, dicts, str(root / DEP_FILE)).pending) == 3


def test_configs_json_cannot_write_are_refused_as_doit_refuses_them() -> None:
    import array

    with pytest.raises(TypeError):  # marshal would write both as the same four bytes
        uptodate.config_digest({"x": array.array("i", [1])})
    with pytest.raises(TypeError):
        uptodate.config_digest({"x": {1, 2}})
    assert uptodate.config_digest({"x": 1}) != uptodate.config_digest({"x": True})


def bundle_config_digest(project: Path) -> str:
    state = AtomicJsonDB(str(project / "build" / "state" / DEP_FILE), JSONCodec())
    return state.get("bundle", "_values_:")["_config_changed"]


def test_a_costly_config_digest_is_remembered_for_the_same_fingerprint(
    two_kernels: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bundle's config (1.4 MB of JSON at 10,000 units) is the same after an edit: its
    digest is taken from the build that computed it, and computed again once it changes.
    (Every config counts as costly here: the extract's and compiles' are remembered too.)"""
    monkeypatch.setattr(uptodate, "COSTLY_CONFIG", 0)
    encoded: list[int] = []
    config_json = uptodate._config_json
    monkeypatch.setattr(
        uptodate, "_config_json", lambda config: encoded.append(1) or config_json(config)
    )
    state_dir = two_kernels / "build" / "state"
    (two_kernels / "kernels" / "beta.pb").write_bytes(hlo("beta-1"))
    ran = build(two_kernels).executed
    remembered = uptodate.known_digests(state_dir)
    assert sorted(remembered) == sorted(name for name in ran if name != "wheel")  # str config
    assert len(encoded) == len(remembered)
    assert remembered["bundle"][1] == [bundle_config_digest(two_kernels)]
    encoded.clear()
    (two_kernels / "kernels" / "beta.pb").write_bytes(hlo("beta-2"))
    assert build(two_kernels).executed == ran
    assert encoded == []  # every digest was remembered
    assert remembered["bundle"][1] == [bundle_config_digest(two_kernels)]  # as doit saved it
    manifest = two_kernels / "nkibuild.yaml"
    manifest.write_text(manifest.read_text().replace("version: 0.1.0", "version: 0.2.0"))
    assert "bundle" in build(two_kernels).executed
    digest = bundle_config_digest(two_kernels)
    assert encoded and digest != remembered["bundle"][1][0]  # computed anew
    assert uptodate.known_digests(state_dir)["bundle"][1] == [digest]
    (state_dir / uptodate.DIGESTS_FILE).write_bytes(b"damaged")  # not remembered: computed
    (two_kernels / "kernels" / "beta.pb").write_bytes(hlo("beta-3"))
    encoded.clear()
    assert "bundle" in build(two_kernels).executed
    assert encoded and bundle_config_digest(two_kernels) == digest


def test_the_bundle_takes_the_stamps_deciding_saw_of_files_no_task_rewrote(
    two_kernels: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After an edit, the bundle does not stat again the records and tree files deciding
    found as recorded (25,000 at 10,000 units); it does stat what the edit's tasks wrote."""
    stated: list[str] = []
    real = fsutil.stat_stamp

    def counted(path: str) -> str | None:
        stated.append(str(path))
        return real(path)

    monkeypatch.setattr(fsutil, "stat_stamp", counted)  # what SeenStats stats with
    (two_kernels / "kernels" / "beta.pb").write_bytes(hlo("beta-edited"))
    assert "bundle" in build(two_kernels).executed
    compiled = two_kernels / "build" / "compile"
    tree = two_kernels / "build" / "bundle" / "proof-kernels" / "proof_kernels"
    for target in ("trn1", "trn2"):
        assert str(compiled / "beta" / "default" / target / "result.json") in stated
        assert str(compiled / "alpha" / "default" / target / "result.json") not in stated
        assert str(tree / "neff" / target / "alpha" / "default.neff") not in stated
    assert str(tree / "_kernels" / "alpha.py") not in stated
    assert build(two_kernels).executed == []


def test_a_file_changed_after_deciding_is_seen_by_the_next_build(
    two_kernels: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bundle keeps a tree file as deciding saw it; changed behind its back after
    that, the proof keeps the stamp seen, so the next build finds it and restores it."""
    module = two_kernels / "build" / "bundle" / "proof-kernels" / "proof_kernels" / "_kernels"
    generated = (module / "alpha.py").read_bytes()
    seen_by = uptodate.seen_by

    def then_tampered(decision: uptodate.Decision, name: str) -> fsutil.SeenStats:
        seen = seen_by(decision, name)
        (module / "alpha.py").write_bytes(b"# changed while the build ran\n")
        return seen

    monkeypatch.setattr(uptodate, "seen_by", then_tampered)
    (two_kernels / "kernels" / "beta.pb").write_bytes(hlo("beta-edited"))
    assert "bundle" in build(two_kernels).executed
    assert (module / "alpha.py").read_bytes() != generated  # taken as seen: not rewritten
    monkeypatch.setattr(uptodate, "seen_by", seen_by)
    summary = build(two_kernels)
    assert "bundle" in summary.executed
    assert (module / "alpha.py").read_bytes() == generated
    assert build(two_kernels).executed == []


def test_the_bundles_stamp_removed_after_deciding_is_written_again(
    two_kernels: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bundle runs but its tree is as wanted: bundle.json, removed after deciding,
    is still written (the wheel reads it)."""
    stamp = two_kernels / "build" / "bundle" / "proof-kernels" / "bundle.json"
    seen_by = uptodate.seen_by

    def then_removed(decision: uptodate.Decision, name: str) -> fsutil.SeenStats:
        seen = seen_by(decision, name)
        stamp.unlink()
        return seen

    monkeypatch.setattr(uptodate, "seen_by", then_removed)
    (two_kernels / "build" / "compile" / "alpha" / "default" / "trn1" / "result.json").unlink()
    summary = build(two_kernels)
    assert summary.ok and "bundle" in summary.executed
    assert stamp.exists()


def test_a_compile_record_rewritten_after_deciding_is_seen_by_the_next_bundle(
    two_kernels: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bundle keeps a part under its records' stamps as deciding saw them; a record
    rewritten after that has another stamp, so the next bundle makes its part again
    (one that finds the record's content unchanged, doit does not even run)."""
    record = two_kernels / "build" / "compile" / "alpha" / "default" / "trn1" / "result.json"
    seen_by = uptodate.seen_by

    def then_rewritten(decision: uptodate.Decision, name: str) -> fsutil.SeenStats:
        seen = seen_by(decision, name)
        content = record.read_bytes()
        record.unlink()
        record.write_bytes(content)  # same bytes, new inode and ctime
        return seen

    made = parts_made(monkeypatch)
    monkeypatch.setattr(uptodate, "seen_by", then_rewritten)
    (two_kernels / "kernels" / "beta.pb").write_bytes(hlo("beta-edited"))
    assert "bundle" in build(two_kernels).executed
    assert made == ["beta"]
    monkeypatch.setattr(uptodate, "seen_by", seen_by)
    made.clear()
    (two_kernels / "kernels" / "beta.pb").write_bytes(hlo("beta-edited-again"))
    summary = build(two_kernels)
    assert "bundle" in summary.executed and sorted(made) == ["alpha", "beta"]
    assert build(two_kernels).executed == []


def test_what_another_pending_task_writes_in_its_output_dirs_is_stat_ed(
    two_kernels: Path,
) -> None:
    """The bundle's tree (its output dir) is the bundle's to take as seen; to the wheel,
    which runs after the bundle may have rewritten it, it is stat'ed."""
    from helpers import load_context

    from nkibuild.graph.tasks import task_dicts
    from nkibuild.settings import BuildOptions

    context = load_context(
        two_kernels / "nkibuild.yaml",
        two_kernels / "build",
        two_kernels / "dist",
        BuildOptions(toolchain="fake"),
    )
    state = context.layout.state_dir
    (two_kernels / "kernels" / "beta.pb").write_bytes(hlo("beta-edited"))
    decision = uptodate.decide(state, task_dicts(context), str(state / DEP_FILE))
    assert "bundle" in decision.pending and "wheel" in decision.pending
    module = two_kernels / "build" / "bundle" / "proof-kernels" / "proof_kernels" / "_kernels"
    path = str(module / "alpha.py")
    seen = decision.previous.files[path]
    (module / "alpha.py").write_text("# rewritten after deciding, as the bundle may\n")
    assert uptodate.seen_by(decision, "bundle").stamps([path]) == [seen]
    assert uptodate.seen_by(decision, "wheel").stamps([path]) == [stat_stamp(path)] != [seen]


def test_a_kept_file_removed_after_deciding_fails_the_wheel_cleanly(
    two_kernels: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tree file the bundle kept as seen, removed while the build runs: a wheel written
    fresh cannot pack it and says so (no traceback); the next build writes it back."""
    module = two_kernels / "build" / "bundle" / "proof-kernels" / "proof_kernels" / "_kernels"
    for wheel in (two_kernels / "dist").glob("*.whl"):
        wheel.unlink()  # dist/ cleaned: the wheel is written fresh from the tree
    seen_by = uptodate.seen_by

    def then_removed(decision: uptodate.Decision, name: str) -> fsutil.SeenStats:
        seen = seen_by(decision, name)
        (module / "alpha.py").unlink()
        return seen

    monkeypatch.setattr(uptodate, "seen_by", then_removed)
    (two_kernels / "kernels" / "beta.pb").write_bytes(hlo("beta-edited"))
    summary = build(two_kernels)
    failed = [outcome for outcome in summary.outcomes if outcome.name == "wheel"]
    assert not summary.ok and failed and "Traceback" not in failed[0].detail
    assert "alpha.py was removed after the bundle was generated" in failed[0].detail
    monkeypatch.setattr(uptodate, "seen_by", seen_by)
    assert build(two_kernels).ok and (module / "alpha.py").exists()
