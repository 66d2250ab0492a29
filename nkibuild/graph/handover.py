"""The tasks the up-to-date proof hands to doit, each told which of its inputs may have
changed.

After an edit the proof hands doit a few tasks, the bundle among them, whose file_dep
are every compile record (10,000 at 10,000 units). doit compares each file_dep with
what it saved for the task, after its `uptodate` checks, unless one of those said the
task is not up to date. `InputsChanged`, put first among a handed task's checks,
compares only the file_dep that may have changed since the proof was made (written by
a task handed to doit, or seen changed when deciding), with doit's own file checker
and saved state. One that differs is one doit's own comparison would find: the task
runs, without its other file_dep compared one by one. None that differs decides
nothing (the check says None) and doit compares them all, as without it. A task that
runs anyway needs no other check that only looks (the outputs check: the bundle's
15,000 files): those say None for it; checks that also save something (`config_changed`'s
digest) run as before.

Saving a task it ran, doit asks its file checker for each file_dep's state, which
stat's the file to find its timestamp as saved (the state then kept). `proof_checker`
takes the timestamp of a file the proof found as recorded, and that no handed task
writes, from the proof instead: the state is kept exactly where doit would keep it, as
of deciding; a file changed since then is saved with its older state, which only makes
the next build compare it again.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import Any

from doit.dependency import MD5Checker, UptodateCalculator

from nkibuild.graph.intact import CHECK_SIGNATURE, OutputsIntact
from nkibuild.graph.uptodate import Decision, task_name, with_known_digests


class InputsChanged(UptodateCalculator):
    """doit `uptodate` check: False if one of `candidates` (file_dep of the task) differs
    from doit's saved state for it; None otherwise."""

    __signature__ = CHECK_SIGNATURE

    def __init__(self, candidates: list[str]) -> None:
        super().__init__()
        self.candidates = candidates
        self.manager: Callable[[], Any] = lambda: None
        self.found = False  # one of them differs: the task runs

    def setup(self, dep_manager: Any, tasks_dict: dict[str, Any]) -> None:
        # Held weakly (not as doit's own checks hold it): the task outlives the run in
        # doit's reference cycles and would keep the state doit decoded (the bundle's
        # 10,000 file_dep states) alive until the process ends, for its last garbage
        # collection to go through.
        self.manager = weakref.ref(dep_manager)

    def __call__(self, task: Any, values: dict[str, Any]) -> bool | None:
        self.found = self._found(task.name)
        return False if self.found else None

    def _found(self, name: str) -> bool:
        manager = self.manager()
        for path in self.candidates:
            saved = manager._get(name, path)
            if saved is None:
                return True  # never saved for this task: doit's check finds it changed
            try:
                info = os.stat(path)
            except OSError:
                return False  # missing: doit's own check reports it
            if manager.checker.check_modified(path, info, saved):
                return True
        return False

    def __repr__(self) -> str:  # doit names a check in `doit info`'s reasons
        return f"inputs changed among {self.candidates!r}"


class UnlessInputsChanged:
    """A check that only looks, skipped (None) once `inputs` found the task must run."""

    __signature__ = CHECK_SIGNATURE

    def __init__(self, check: Any, inputs: InputsChanged) -> None:
        self.check = check
        self.inputs = inputs

    def __call__(self, task: Any, values: dict[str, Any]) -> bool | None:
        return None if self.inputs.found else self.check(task, values)

    def __repr__(self) -> str:
        return repr(self.check)


def handed_over(decision: Decision, dicts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pending tasks of `dicts`, each with the config digests remembered for it
    (uptodate.with_known_digests); with a proof, each with `InputsChanged` first among
    its checks (without one, doit compares every file anyway)."""
    pending = set(decision.pending)
    handed = [
        with_known_digests(task, name, decision)
        for task in dicts
        if (name := task_name(task)) in pending
    ]
    if decision.previous is None:
        return handed
    unsure = _unvouched(decision)
    for index, task in enumerate(handed):
        candidates = [path for path in task["file_dep"] if path in unsure]  # one lookup each
        if candidates:
            inputs = InputsChanged(candidates)
            checks = [_unless(check, inputs) for check in task.get("uptodate", ())]
            handed[index] = {**task, "uptodate": [inputs, *checks]}
    return handed


def _unvouched(decision: Decision) -> set[str]:
    """The files the proof does not vouch for: seen changed when deciding, or written by
    a handed task (its targets; a few after an edit)."""
    by_name = decision.graph.by_name
    targets = (by_name[name]["targets"] for name in decision.pending)
    return set(decision.stats).union(*targets)


def _unless(check: Any, inputs: InputsChanged) -> Any:
    """`check`, skipped once `inputs` found a change if it is an outputs check (one that
    also saves something, as `config_changed` does, runs as it is)."""
    return UnlessInputsChanged(check, inputs) if isinstance(check, OutputsIntact) else check


def proof_checker(decision: Decision) -> type[MD5Checker]:
    """doit's MD5 checker for this build, taking from the proof the timestamps of the
    files it found as recorded (see the module docstring)."""
    if decision.previous is None:
        return MD5Checker  # no proof: nothing found as recorded
    recorded = decision.previous.files
    unsure = _unvouched(decision)

    class ProofChecker(MD5Checker):
        def get_state(self, dep: str, current_state: Any) -> Any:
            # Asked for each file_dep of a task doit saves (10,000 for the bundle).
            if current_state and dep not in unsure:
                stat = recorded.get(dep)
                if stat is not None and current_state[0] == st_mtime(stat):
                    return None  # doit's own answer for a file of this timestamp
            return super().get_state(dep, current_state)

    # doit saves its checker's class name with every task and distrusts a task saved
    # under another: this is the MD5 checker as doit saves and reads it.
    ProofChecker.__name__ = ProofChecker.__qualname__ = MD5Checker.__name__
    return ProofChecker


def st_mtime(stat: str) -> float:
    """`os.stat().st_mtime` of a file of this stat (`fsutil.stat_stamp`), computed as
    Python does from the nanoseconds: seconds plus nanoseconds times 1e-9."""
    seconds, nanoseconds = divmod(int(stat.split(" ", 2)[1]), 1_000_000_000)
    return seconds + nanoseconds * 1e-9
