"""Work done while a compiler runs (issue 17 goal 5): the build's chores
(compiler/chores.py) and the extractions ahead of prebuilt modules (frontends/ahead.py).

An extraction ahead must change nothing a build leaves or reports: the artifacts are
the ones the extract tasks would have written, a source changed meanwhile is extracted
again, a failure is reported by the task as always, and nothing is left of one that no
task took.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import QuietDisplay, prebuilt_project

from nkibuild import frontends
from nkibuild.compiler import neuronxcc
from nkibuild.compiler.chores import Chores
from nkibuild.compiler.process import ProcessRegistry, run_process
from nkibuild.context import BuildContext, load_context
from nkibuild.frontends import ahead
from nkibuild.graph.report import BuildSummary
from nkibuild.graph.run import RunOptions, run_build
from nkibuild.graph.tasks import extract_files
from nkibuild.plan import ExtractSpec, extract_specs
from nkibuild.settings import BuildOptions

KERNELS = 3  # prebuilt_project's
# Process ids only counted, never signalled (the registry kills only after kill_all).
FIRST_PID, SECOND_PID = 2**22 + 1, 2**22 + 2


def context_of(root: Path) -> BuildContext:
    return load_context(
        root / "nkibuild.yaml", root / "build", root / "dist", BuildOptions(toolchain="fake")
    )


def extracted_ahead_of_one_kernel(
    tmp_path: Path,
) -> tuple[BuildContext, ExtractSpec, list[str]]:
    """A one-kernel project whose extraction ran ahead: its context, spec and the files
    its extract task depends on."""
    root = prebuilt_project(tmp_path / "p", kernels=1)
    context = context_of(root)
    (spec,) = extract_specs(context.units)
    files = extract_files(context, spec)
    context.session.extractions_ahead.extract(context, spec, files)
    return context, spec, files


def run(context: BuildContext, *selection: str) -> BuildSummary:
    return run_build(context, RunOptions(selection=selection), QuietDisplay())


@pytest.fixture
def extracted_into(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The directory of every extraction, by the extract task or ahead, in order."""
    seen: list[str] = []
    original = frontends.extract

    def extract(spec, root, out_dir, toolchain, tracing):  # type: ignore[no-untyped-def]
        seen.append(out_dir.name)
        return original(spec, root, out_dir, toolchain, tracing)

    monkeypatch.setattr(frontends, "extract", extract)
    monkeypatch.setattr(ahead, "extract", extract)
    return seen


def artifacts(root: Path) -> dict[str, bytes]:
    found = sorted((root / "build" / "extract").rglob("*"))
    return {str(p.relative_to(root)): p.read_bytes() for p in found if p.is_file()}


def hidden_leftovers(root: Path) -> list[str]:
    return sorted(str(p) for p in (root / "build").rglob(".*") if p.name != ".nkibuild")


def test_a_cold_build_extracts_the_next_prebuilt_module_while_a_compiler_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extracted_into: list[str], isolated_cache: Path
) -> None:
    root = prebuilt_project(tmp_path / "ahead")
    summary = run(context_of(root), "compile:*")
    assert summary.ok, summary.to_json()
    # k0's task extracted it; k1 and k2 were extracted while k0's and k1's compilers ran.
    assert extracted_into == ["default", ".default.ahead.new", ".default.ahead.new"]
    assert sorted(summary.executed) == sorted(
        [*(f"extract:k{i}/default" for i in range(KERNELS)),
         *(f"compile:k{i}/default/trn1" for i in range(KERNELS))]
    )  # fmt: skip
    assert hidden_leftovers(root) == []  # no staging dir, no compile work dir

    # The same files as a build whose extract tasks did all the extracting.
    monkeypatch.setattr(ahead, "AHEAD_FRONTENDS", frozenset())
    reference = prebuilt_project(tmp_path / "reference")
    assert run(context_of(reference), "compile:*").ok
    assert len(extracted_into) == 3 + KERNELS
    assert artifacts(root) == {
        name.replace("reference", "ahead", 1): data for name, data in artifacts(reference).items()
    }
    records = sorted((root / "build" / "state").rglob("extract/*/*.json"))
    assert len(records) == KERNELS  # each extract task recorded its extraction


def test_only_a_missing_artifact_is_extracted_ahead(
    tmp_path: Path, extracted_into: list[str], isolated_cache: Path
) -> None:
    root = prebuilt_project(tmp_path / "p")
    assert run(context_of(root), "extract:*").ok
    extracted_into.clear()
    assert run(context_of(root), "compile:*").origins == {"compiled": KERNELS}
    assert extracted_into == []  # every artifact was there: nothing extracted again


def test_an_extraction_ahead_replaces_the_files_of_a_forgotten_artifact(
    tmp_path: Path, extracted_into: list[str], isolated_cache: Path
) -> None:
    """An artifact forgotten as damaged (its artifact.json removed) leaves its other
    files in its directory: the extraction ahead is moved in file by file."""
    root = prebuilt_project(tmp_path / "p", kernels=2)
    assert run(context_of(root), "extract:*").ok
    clean = artifacts(root)
    k1 = root / "build" / "extract" / "k1" / "default"
    frontends.forget_artifact(k1)
    (k1 / frontends.HLO_FILE).write_bytes(b"torn")
    extracted_into.clear()
    summary = run(context_of(root), "compile:*")
    assert summary.origins == {"compiled": 2}
    assert extracted_into == [".default.ahead.new"]  # k1, while k0 compiled
    assert "extract:k1/default" in summary.executed
    assert artifacts(root) == clean
    assert hidden_leftovers(root) == []


def test_a_source_changed_after_its_extraction_ahead_is_extracted_again(
    tmp_path: Path, extracted_into: list[str]
) -> None:
    context, spec, files = extracted_ahead_of_one_kernel(tmp_path)
    extractions = context.session.extractions_ahead
    staging = ahead.staging_dir(context.layout.extract_dir(spec))
    assert (staging / frontends.METADATA_FILE).is_file()

    source = context.manifest.root / "kernels" / "k0.pb"
    rewritten = source.with_suffix(".new")
    rewritten.write_bytes(source.read_bytes())
    os.replace(rewritten, source)  # the same bytes in another file: its stamp differs
    assert extractions.take(context, spec, files) is None
    assert not staging.exists()
    assert not (context.layout.extract_dir(spec) / frontends.METADATA_FILE).exists()
    assert extractions.take(context, spec, files) is None  # taken once, for good
    assert extracted_into == [".default.ahead.new"]


def test_a_taken_extraction_ahead_is_the_artifact_in_place(tmp_path: Path) -> None:
    context, spec, files = extracted_ahead_of_one_kernel(tmp_path)
    extractions = context.session.extractions_ahead
    extractions.extract(context, spec, files)  # offered twice: extracted once
    taken = extractions.take(context, spec, files)
    out_dir = context.layout.extract_dir(spec)
    assert taken is not None and taken.directory == out_dir
    assert frontends.load_extracted(out_dir, "k0/default/trn1") == taken
    # What the compile stage hands the compiler: checked against the recorded hash.
    assert taken.compilable_hlo("k0/default/trn1") == (out_dir / frontends.HLO_FILE).read_bytes()
    assert not ahead.staging_dir(out_dir).exists()


def test_a_failed_extraction_ahead_leaves_the_error_to_the_extract_task(
    tmp_path: Path, extracted_into: list[str], isolated_cache: Path
) -> None:
    root = prebuilt_project(tmp_path / "p", kernels=2)
    (root / "kernels" / "k1.pb").write_bytes(b"not an HLO module")
    summary = run(context_of(root), "compile:*")
    assert extracted_into == ["default", ".default.ahead.new", "default"]
    (failure,) = summary.failures
    assert failure.name == "extract:k1/default"
    assert "the HLO module is not valid" in failure.detail
    assert "Traceback" not in failure.detail
    assert hidden_leftovers(root) == []


def test_an_extraction_ahead_no_task_took_is_removed_with_the_session(
    tmp_path: Path, extracted_into: list[str], isolated_cache: Path
) -> None:
    root = prebuilt_project(tmp_path / "p", kernels=2)
    summary = run(context_of(root), "compile:k0/*")
    assert summary.ok
    assert extracted_into == ["default", ".default.ahead.new"]  # k1, while k0 compiled
    assert not (root / "build" / "extract" / "k1").joinpath("default").exists()
    assert hidden_leftovers(root) == []


def test_chores_run_while_the_process_runs(tmp_path: Path) -> None:
    """The process waits for a file that only `meanwhile` creates: had it been called
    after the wait, the process would have been stopped by its timeout."""
    done = tmp_path / "removed"
    done.mkdir()
    chores = Chores()
    chores.remove_later(done)
    chores.offer(lambda: (tmp_path / "go").touch())
    script = "while [ ! -e go ]; do sleep 0.01; done"
    outcome = run_process(
        ["sh", "-c", script], tmp_path, tmp_path / "out.log", 10.0, meanwhile=chores.run
    )
    assert (outcome.returncode, outcome.timed_out) == (0, False)
    assert not done.exists()


def test_a_process_that_exits_in_time_is_not_timed_out_by_chores_outlasting_it(
    tmp_path: Path,
) -> None:
    """The timeout is the compiler's, not the chores': a compile that exits at once is
    a success even when the chores its thread does take longer than its timeout."""
    outcome = run_process(
        ["true"], tmp_path, tmp_path / "out.log", 0.3, meanwhile=lambda _running: time.sleep(0.8)
    )
    assert (outcome.returncode, outcome.timed_out) == (0, False)


def test_chores_stop_once_the_process_has_exited(tmp_path: Path) -> None:
    """A compile slot is not held for chores past its compiler's exit: the job under way
    finishes, the others wait for another compiler (or the session's end)."""
    chores = Chores()
    ran: list[str] = []

    def until_exited(running: Callable[[], bool]) -> Callable[[], None]:
        def job() -> None:
            (tmp_path / "go").touch()  # the process exits once it sees this
            while running():
                time.sleep(0.01)
            ran.append("first")

        return job

    def meanwhile(running: Callable[[], bool]) -> None:
        chores.offer(until_exited(running))
        chores.offer(lambda: ran.append("second"))
        chores.run(running)

    script = "while [ ! -e go ]; do sleep 0.01; done"
    outcome = run_process(
        ["sh", "-c", script], tmp_path, tmp_path / "out.log", 10.0, meanwhile=meanwhile
    )
    assert outcome.returncode == 0
    assert ran == ["first"]
    chores.run(lambda: True)
    assert ran == ["first", "second"]


def test_offered_jobs_wait_for_every_slot_s_compiler_to_run(tmp_path: Path) -> None:
    """Jobs run in a wait during which all slots' compilers run (not while another
    slot's thread still prepares its compile); work dirs are removed in any wait."""
    chores, processes = Chores(), ProcessRegistry()
    ran: list[str] = []
    chores.offer(lambda: ran.append("job"))
    work = tmp_path / ".work-a"
    work.mkdir()
    chores.remove_later(work)
    meanwhile = neuronxcc._chores(chores, processes, slots=2)
    processes.add(FIRST_PID)  # one of the two slots' compilers runs
    meanwhile(lambda: True)
    assert (ran, work.exists()) == ([], False)
    processes.add(SECOND_PID)
    meanwhile(lambda: True)
    assert ran == ["job"]


def test_chores_left_at_the_end_remove_their_dirs_and_drop_their_jobs(tmp_path: Path) -> None:
    chores = Chores()
    work = tmp_path / ".work-x"
    (work / "inner").mkdir(parents=True)
    ran: list[str] = []
    chores.remove_later(work)
    chores.offer(lambda: ran.append("job"))
    chores.finish()
    assert not work.exists()
    assert ran == []
    chores.run(lambda: True)  # nothing left
    assert ran == []


def test_a_compile_work_dir_is_gone_when_the_build_ends(
    tmp_path: Path, isolated_cache: Path
) -> None:
    root = prebuilt_project(tmp_path / "p", kernels=1)
    context = context_of(root)
    assert run(context, "compile:*").ok
    out_dir = context.layout.compile_dir(context.units[0])
    assert sorted(os.listdir(out_dir)) == ["compile.log", "key.json", "model.neff", "result.json"]
