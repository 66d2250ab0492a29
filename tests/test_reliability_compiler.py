"""Compiler faults through the CLI (the double misbehaves on purpose for one unit):
each gives a clear error naming the unit, the command and the log's tail, with no
traceback and a bounded message; with --keep-going every other unit completes; and
once the compiler behaves, the next build gives the clean build's wheel."""

from __future__ import annotations

from pathlib import Path

import pytest
from campaign import Project, finished_tasks, record, wait_for_no_processes

from nkibuild.toolchain_double.fake_neuronxcc import FAULTS

FAILING_UNIT = "scaled_add/large/trn2"
EXPECTED = {
    "exit1": "neuronx-cc failed",
    "exit70": "neuronx-cc failed with an internal error (exit 70) twice",
    "kill9": "neuronx-cc was killed (SIGKILL) twice",
    "hang": "neuronx-cc did not finish within 3 s and was stopped",
    "empty": "neuronx-cc exited 0 but wrote no NEFF",
    "garbage": "neuronx-cc wrote an invalid NEFF",
    "hugelog": "neuronx-cc failed",
}
# Failures of the compiler's own (an exit status, no signal, no timeout): recorded under
# the unit's cache key and reported at once by the next build, unless --retry-failed.
RECORDED = {"exit1", "exit70", "hugelog"}
MAX_MESSAGE_BYTES = 20_000  # the 5 MB log of `hugelog` must be cut to its tail


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    clean = Project.copy_of_examples(tmp_path_factory.mktemp("clean"))
    assert clean.build().returncode == 0
    return clean.wheel()


def test_every_fault_is_named() -> None:
    assert set(EXPECTED) == set(FAULTS)


@pytest.mark.parametrize("fault", sorted(EXPECTED))
def test_compiler_fault_with_keep_going(tmp_path: Path, reference: bytes, fault: str) -> None:
    project = Project.copy_of_examples(tmp_path)
    failed = project.build(
        "-j", "2", "--keep-going", "--compile-timeout", "3s",
        NKIBUILD_FAKE_CC_FAULT=fault,
        NKIBUILD_FAKE_CC_FAULT_MATCH="scaled_add/large/trn2",
    )  # fmt: skip
    output = failed.stdout + failed.stderr
    assert failed.returncode == 1, output
    assert "Traceback" not in output
    message = failed.stderr.split(f"compile:{FAILING_UNIT} failed:", 1)[1]
    assert message.strip().startswith(f"{FAILING_UNIT}: {EXPECTED[fault]}"), message
    assert "  command: " in message and " compile --framework XLA " in message
    assert "  log tail:" in message
    assert len(failed.stderr.encode()) < MAX_MESSAGE_BYTES
    compiled = finished_tasks(failed.stdout, "compile:")
    assert len(compiled) == 6 and f"compile:{FAILING_UNIT}" not in compiled  # the others
    assert wait_for_no_processes(project, timeout=2.0) == []  # e.g. the hung compiler

    if fault in RECORDED:
        known = project.build()  # the compiler would pass now, and is not asked
        assert known.returncode == 1 and "Traceback" not in known.stderr
        assert f"{FAILING_UNIT}: {EXPECTED[fault]} (a known failure" in known.stderr
        assert finished_tasks(known.stdout, "compile:") == []
    healthy = project.build(*(["--retry-failed"] if fault in RECORDED else []))
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    assert finished_tasks(healthy.stdout, "compile:") == [f"compile:{FAILING_UNIT}"]
    assert project.wheel() == reference
    record(f"compiler fault {fault} (one unit, --keep-going)", trials=1,
           result=f"'{EXPECTED[fault]}' with command and log tail; 6 other units compiled; "
           "the next build recompiled only that unit")  # fmt: skip
