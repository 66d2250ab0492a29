"""The compile stage on the toolchain double: scheduling under a memory budget, OOM
retries, timeouts, interrupts, cache tiers across checkouts, compiler location."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import run_nkibuild
from helpers import build, pretend_new_compiler, softmax_manifest, softmax_project

from nkibuild.cache import LocalCache
from nkibuild.compiler.budget import MemoryBudget
from nkibuild.compiler.local import memory_estimate
from nkibuild.compiler.process import run_process
from nkibuild.manifest import load_manifest
from nkibuild.plan import resolve
from nkibuild.settings import BuildOptions

MIB = 1 << 20
UNITS = ("softmax/default/trn1", "softmax/default/trn2")


def project(root: Path, extra: str = "") -> Path:
    package = "{name: two-units, version: 0.1.0}"
    return softmax_project(root, softmax_manifest(package, kernel=extra))


def fake_options(**settings: object) -> BuildOptions:
    return BuildOptions(toolchain="fake", **settings)  # type: ignore[arg-type]


def intervals(times: Path) -> list[tuple[float, float]]:
    return sorted(tuple(map(float, line.split())) for line in times.read_text().splitlines())  # type: ignore[misc]


def compiler_processes(marker: Path) -> list[int]:
    """PIDs of live fake compilers working under `marker` (a test's own dir): their
    command line names only work-dir-relative paths, so their cwd tells."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().split(") ")[-1][:1]
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if cwd.startswith(str(marker)) and "fake_neuronxcc" in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def wait_for(condition: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


# --- the memory budget ----------------------------------------------------------------


def run_concurrently(budget: MemoryBudget, estimates: list[int | None]) -> int:
    """Reserve for each estimate in its own thread; return the most that ran at once."""
    running, most = [0], [0]
    lock = threading.Lock()

    def work(estimate: int | None) -> None:
        with budget.reserve(estimate):
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            time.sleep(0.1)
            with lock:
                running[0] -= 1

    threads = [threading.Thread(target=work, args=(e,)) for e in estimates]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    return most[0]


def test_budget_admits_what_fits() -> None:
    assert run_concurrently(MemoryBudget(1000, jobs=4), [400, 400, 400, 400]) == 2
    assert run_concurrently(MemoryBudget(None, jobs=4), [400, 400, 400, 400]) == 4


def test_unknown_estimates_get_a_fair_share_and_huge_ones_run_alone() -> None:
    budget = MemoryBudget(1000, jobs=4)
    assert budget.charge(None) == 250 and budget.charge(5000) == 1000
    assert run_concurrently(budget, [None] * 4) == 4
    assert run_concurrently(budget, [5000, 5000]) == 1  # bigger than the budget: alone


def test_alone_waits_for_running_compiles_and_blocks_new_ones() -> None:
    budget = MemoryBudget(None, jobs=4)
    events: list[str] = []
    first = threading.Event()

    def neighbour(name: str, delay: float) -> None:
        time.sleep(delay)
        with budget.reserve(None):
            first.set()
            events.append(f"{name} start")
            time.sleep(0.2)
            events.append(f"{name} end")

    def retry() -> None:
        first.wait()
        with budget.reserve(None, alone=True):
            events.append("alone start")
            time.sleep(0.1)
            events.append("alone end")

    threads = [
        threading.Thread(target=neighbour, args=("early", 0)),
        threading.Thread(target=retry),
        threading.Thread(target=neighbour, args=("late", 0.05)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert events.index("alone start") > events.index("early end")
    assert events.index("late start") > events.index("alone end")  # admitted in order


# --- one compiler process --------------------------------------------------------------


def test_peak_memory_is_measured(tmp_path: Path) -> None:
    command = [sys.executable, "-c", "b = bytearray(200 << 20); b[::4096] = b'x' * (51200)"]
    outcome = run_process(command, tmp_path, tmp_path / "out.log", None)
    assert outcome.returncode == 0 and outcome.peak_memory >= 200 * MIB


def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    script = f"sleep 60 & echo $! > {tmp_path / 'child.pid'}; wait"
    started = time.monotonic()
    outcome = run_process(["sh", "-c", script], tmp_path, tmp_path / "out.log", 0.5)
    assert outcome.timed_out and not outcome.killed and time.monotonic() - started < 10
    child = int((tmp_path / "child.pid").read_text())
    wait_for(lambda: not Path(f"/proc/{child}").exists() or _zombie(child))


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].startswith("Z")
    except OSError:
        return True


# --- builds ----------------------------------------------------------------------------


def test_a_compile_killed_once_is_retried_alone_and_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = project(tmp_path / "p")
    counter = tmp_path / "count"
    monkeypatch.setenv("NKIBUILD_FAKE_CC_FAULT", "kill9")
    monkeypatch.setenv("NKIBUILD_FAKE_CC_FAULT_MATCH", "trn2")
    monkeypatch.setenv("NKIBUILD_FAKE_CC_FAULT_ONCE", str(tmp_path / "fired"))
    monkeypatch.setenv("NKIBUILD_FAKE_CC_COUNTER", str(counter))
    summary = build(root, jobs=2)
    assert summary.ok, summary.to_json()
    assert len(counter.read_text().splitlines()) == 3  # trn1 once, trn2 twice
    (notice,) = summary.notices
    assert notice.startswith("compile:softmax/default/trn2: neuronx-cc was killed by SIGKILL")
    assert "retried alone" in notice


@pytest.mark.parametrize(("fault", "retried"), [("exit70", True), ("exit1", False)])
def test_only_an_internal_error_is_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str, retried: bool
) -> None:
    # neuronx-cc exits 70 intermittently on large parallel cold compiles; exit 1 (bad
    # options, a kernel the compiler rejects) is deterministic and never retried.
    root = project(tmp_path / "p")
    counter = tmp_path / "count"
    monkeypatch.setenv("NKIBUILD_FAKE_CC_FAULT", fault)
    monkeypatch.setenv("NKIBUILD_FAKE_CC_FAULT_MATCH", "trn2")
    monkeypatch.setenv("NKIBUILD_FAKE_CC_FAULT_ONCE", str(tmp_path / "fired"))
    monkeypatch.setenv("NKIBUILD_FAKE_CC_COUNTER", str(counter))
    summary = build(root, keep_going=True)
    assert summary.ok is retried, summary.to_json()
    assert len(counter.read_text().splitlines()) == (3 if retried else 2)
    if retried:
        (notice,) = summary.notices
        assert notice.startswith("compile:softmax/default/trn2: neuronx-cc exited 70")
        assert "it was retried" in notice
    else:
        (failure,) = summary.failures
        assert "neuronx-cc failed" in failure.detail and "twice" not in failure.detail


@pytest.mark.parametrize(("setting", "compiles", "times"), [("0", 1, ""), ("2", 3, " 3 times")])
def test_the_number_of_retries_is_a_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setting: str, compiles: int, times: str
) -> None:
    root = project(tmp_path / "p")
    counter = tmp_path / "count"
    monkeypatch.setenv("NKIBUILD_FAKE_CC_FAULT", "exit70")
    monkeypatch.setenv("NKIBUILD_FAKE_CC_FAULT_MATCH", "trn2")
    monkeypatch.setenv("NKIBUILD_FAKE_CC_COUNTER", str(counter))
    monkeypatch.setenv("NKIBUILD_COMPILE_RETRIES", setting)
    summary = build(root, "compile:softmax/default/trn2")
    (failure,) = summary.failures
    assert len(counter.read_text().splitlines()) == compiles
    assert f"neuronx-cc failed with an internal error (exit 70){times}\n" in failure.detail


def test_a_bad_retry_count_is_a_usage_error(tmp_path: Path) -> None:
    root = project(tmp_path / "p")
    for value in ("-1", "many", "11"):
        result = run_nkibuild(["build", "--toolchain", "fake", "--compile-retries", value], root)
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert "--compile-retries" in result.stderr and "retries" in result.stderr
    env = {"NKIBUILD_COMPILE_RETRIES": "lots"}
    result = run_nkibuild(["build", "--toolchain", "fake"], root, env=env)
    assert result.returncode == 2
    assert "NKIBUILD_COMPILE_RETRIES: expected a whole number of retries" in result.stderr


def test_a_compile_killed_twice_fails_with_advice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = project(tmp_path / "p")
    monkeypatch.setenv("NKIBUILD_FAKE_CC_FAULT", "kill9")
    monkeypatch.setenv("NKIBUILD_FAKE_CC_FAULT_MATCH", "trn2")
    summary = build(root, keep_going=True)
    (failure,) = summary.failures
    assert failure.name == "compile:softmax/default/trn2"
    assert "killed (SIGKILL) twice" in failure.detail and "compile-memory" in failure.detail
    unit_dir = root / "build" / "compile" / "softmax" / "default" / "trn2"
    assert not (unit_dir / "model.neff").exists()
    assert json.loads((unit_dir / "peak-memory.json").read_text())["returncode"] == -9
    assert list(unit_dir.glob(".work-*")) == []


def test_manifest_timeout_stops_a_hanging_compiler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = project(tmp_path / "p", "    compile-timeout: 1s\n")
    monkeypatch.setenv("NKIBUILD_FAKE_CC_FAULT", "hang")
    started = time.monotonic()
    summary = build(root, keep_going=True, jobs=2)
    assert time.monotonic() - started < 30
    assert sorted(f.name for f in summary.failures) == [f"compile:{u}" for u in UNITS]
    assert all("did not finish within 1 s" in f.detail for f in summary.failures)
    assert compiler_processes(root) == []
    assert list((root / "build" / "compile").glob("*/*/*/model.neff")) == []


def test_memory_budget_serializes_compiles_that_do_not_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NKIBUILD_FAKE_CC_CPU_SECONDS", "0.5")
    for budget, overlapping in (("2G", True), ("1G", False)):
        root = project(tmp_path / budget, "    compile-memory: 600M\n")
        times = tmp_path / f"{budget}.times"
        monkeypatch.setenv("NKIBUILD_FAKE_CC_TIMES", str(times))
        options = fake_options(use_cache=False, max_compile_memory=int(budget[0]) << 30)
        assert build(root, jobs=2, options=options).ok
        (_, first_end), (second_start, _) = intervals(times)
        assert (second_start < first_end) is overlapping, (budget, intervals(times))


def test_peak_memory_of_a_compile_is_recorded_and_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = project(tmp_path / "p", "    compile-memory: 64M\n")
    monkeypatch.setenv("NKIBUILD_FAKE_CC_MEMORY_MB", "150")
    assert build(root, "compile:softmax/default/trn1").ok
    unit_dir = root / "build" / "compile" / "softmax" / "default" / "trn1"
    result = json.loads((unit_dir / "result.json").read_text())
    assert result["peak_memory"] >= 150 * MIB
    assert not (unit_dir / "peak-memory.json").exists()  # a finished compile's is in result.json
    (unit,) = [u for u in resolve(load_manifest(root / "nkibuild.yaml")) if "trn1" in u.name]
    assert unit.compile_memory == 64 * MIB
    assert memory_estimate(unit, unit_dir) == 64 * MIB  # no unfinished attempt: the hint
    # The next compile of the unit (here: for a new compiler) reserves the recorded peak,
    # which is larger than the hint.
    reserved: list[int | None] = []
    real_reserve = MemoryBudget.reserve

    def spying(budget: MemoryBudget, estimate: int | None, *, alone: bool = False) -> Any:
        reserved.append(estimate)
        return real_reserve(budget, estimate, alone=alone)

    monkeypatch.setattr(MemoryBudget, "reserve", spying)
    pretend_new_compiler(monkeypatch)
    assert build(root, "compile:softmax/default/trn1").origins == {"compiled": 1}
    assert reserved == [result["peak_memory"]]
    # A compile that does not finish (it fails; a kill or Ctrl-C alike) removed the
    # result.json holding the peak: the next compile still reserves it.
    peak = json.loads((unit_dir / "result.json").read_text())["peak_memory"]
    pretend_new_compiler(monkeypatch, "2.99.1.0+third")
    monkeypatch.setenv("NKIBUILD_FAKE_CC_FAULT", "exit1")
    assert not build(root, "compile:softmax/default/trn1").ok
    assert not (unit_dir / "result.json").exists()
    monkeypatch.delenv("NKIBUILD_FAKE_CC_FAULT")
    reserved.clear()
    retry = fake_options(retry_failed=True)  # the failure is recorded in the cache
    assert build(root, "compile:softmax/default/trn1", options=retry).ok
    assert reserved == [peak]
    assert not (unit_dir / "peak-memory.json").exists()


def test_another_checkout_gets_every_neff_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated_cache: Path
) -> None:
    first = project(tmp_path / "alice" / "checkout")
    assert build(first).origins == {"compiled": 2}
    second = tmp_path / "bob" / "elsewhere"
    shutil.copytree(first, second, ignore=shutil.ignore_patterns("build", "dist"))
    counter = tmp_path / "count"
    monkeypatch.setenv("NKIBUILD_FAKE_CC_COUNTER", str(counter))
    assert build(second).origins == {"cache-local": 2}
    assert not counter.exists()
    for unit in UNITS:
        neffs = [root / "build" / "compile" / unit / "model.neff" for root in (first, second)]
        assert neffs[0].read_bytes() == neffs[1].read_bytes()


def test_a_corrupt_cache_entry_is_reported_discarded_and_rebuilt(
    tmp_path: Path, isolated_cache: Path
) -> None:
    first = project(tmp_path / "a")
    assert build(first).ok
    cache = LocalCache(isolated_cache)
    for entry in cache.entries():
        (entry.directory / "model.neff").write_bytes(b"bit rot")
    second = project(tmp_path / "b")
    summary = build(second)
    assert summary.origins == {"compiled": 2}
    assert len(summary.notices) == 2 and all("corrupt cache entry" in n for n in summary.notices)
    assert cache.verify() == []  # the rebuilt entries replaced the corrupt ones
    assert len(cache.entries()) == 2


def test_read_only_cache_is_used_but_never_written(tmp_path: Path, isolated_cache: Path) -> None:
    summary = build(project(tmp_path / "a"), options=fake_options(cache_read_only=True))
    assert summary.ok and LocalCache(isolated_cache).entries() == []
    assert build(project(tmp_path / "b")).origins == {"compiled": 2}
    reader = fake_options(cache_read_only=True)
    assert build(project(tmp_path / "c"), options=reader).origins == {"cache-local": 2}


def test_concurrent_builds_share_one_cache_without_corruption(
    tmp_path: Path, isolated_cache: Path
) -> None:
    roots = [project(tmp_path / f"p{i}") for i in range(3)]
    env = {**os.environ, "NKIBUILD_FAKE_CC_CPU_SECONDS": "0.3", "CI": "true"}
    command = [sys.executable, "-m", "nkibuild", "build", "--toolchain", "fake", "-j", "2"]
    processes = [
        subprocess.Popen(
            command, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        for root in roots
    ]
    outputs = [process.communicate(timeout=120)[0].decode() for process in processes]
    assert [p.returncode for p in processes] == [0, 0, 0], outputs
    cache = LocalCache(isolated_cache)
    assert cache.verify() == [] and len(cache.entries()) == 2
    neffs = {(root / "build/compile" / UNITS[1] / "model.neff").read_bytes() for root in roots}
    assert len(neffs) == 1


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_ctrl_c_stops_the_compiler_and_the_next_build_recovers(tmp_path: Path, jobs: str) -> None:
    root = project(tmp_path / "p")
    env = {**os.environ, "NKIBUILD_FAKE_CC_FAULT": "hang", "CI": "true"}
    command = [sys.executable, "-m", "nkibuild", "build", "--toolchain", "fake", "-j", jobs]
    process = subprocess.Popen(
        command, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    wait_for(lambda: len(compiler_processes(root)) == int(jobs))
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 130, stderr.decode()
    assert compiler_processes(root) == []
    assert list((root / "build" / "compile").glob("*/*/*/model.neff")) == []
    rerun = run_nkibuild(["build", "--toolchain", "fake"], root)
    assert rerun.returncode == 0, rerun.stderr
    assert list((root / "build" / "compile").glob("*/*/*/.work-*")) == []


def test_a_killed_build_leaves_no_neff_and_the_rerun_recovers(tmp_path: Path) -> None:
    root = project(tmp_path / "p")
    env = {**os.environ, "NKIBUILD_FAKE_CC_FAULT": "hang", "CI": "true"}
    command = [sys.executable, "-m", "nkibuild", "build", "--toolchain", "fake"]
    process = subprocess.Popen(
        command, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for(lambda: compiler_processes(root))
    finally:  # even when the wait fails: a hung compiler must not outlive the test
        process.kill()
        process.wait(10)
        for pid in compiler_processes(root):  # SIGKILL cannot be handled: the test cleans up
            os.kill(pid, signal.SIGKILL)
    assert list((root / "build" / "compile").glob("*/*/*/model.neff")) == []
    assert list((root / "build" / "compile").glob("*/*/*/result.json")) == []
    rerun = run_nkibuild(["build", "--toolchain", "fake"], root)
    assert rerun.returncode == 0, rerun.stderr
    assert len(list((root / "build" / "compile").glob("*/*/*/model.neff"))) == 2
    assert list((root / "build" / "compile").glob("*/*/*/.work-*")) == []


# --- where the compiler is -------------------------------------------------------------


def fake_compiler_script(directory: Path) -> Path:
    """A stand-alone `neuronx-cc` executable that is the double."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "neuronx-cc"
    double = "nkibuild.toolchain_double.fake_neuronxcc"
    script.write_text(f'#!/bin/sh\nexec {sys.executable} -m {double} "$@"\n')
    script.chmod(0o755)
    return script


@pytest.mark.parametrize("how", ["manifest", "env", "flag"])
def test_the_configured_compiler_is_used(tmp_path: Path, how: str) -> None:
    compiler = fake_compiler_script(tmp_path / "sdk" / "bin")
    extra = f"compiler:\n  path: {compiler}\n" if how == "manifest" else ""
    root = project(tmp_path / "p")
    (root / "nkibuild.yaml").write_text((root / "nkibuild.yaml").read_text() + extra)
    env = {"NKIBUILD_NEURONX_CC": str(compiler)} if how == "env" else {}
    flag = ["--compiler", str(compiler)] if how == "flag" else []
    result = run_nkibuild(["build", "--toolchain", "neuron", *flag, "--json"], root, env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["compile_origins"] == {"compiled": 2}
    command = (root / "build/compile" / UNITS[0] / "compile.log").read_text()
    assert "this is nkibuild's toolchain double" in command


def test_a_missing_configured_compiler_is_a_clear_error(tmp_path: Path) -> None:
    root = project(tmp_path / "p")
    missing = tmp_path / "nowhere" / "neuronx-cc"
    result = run_nkibuild(["build", "--toolchain", "neuron", "--compiler", str(missing)], root)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"the configured neuronx-cc {missing} is not an executable file" in result.stderr


def test_a_consistent_but_wrong_cache_entry_is_refused(
    tmp_path: Path, isolated_cache: Path
) -> None:
    assert build(project(tmp_path / "a")).ok
    cache = LocalCache(isolated_cache)
    entries = {
        json.loads((e.directory / "entry.json").read_text())["unit"]: e.directory
        for e in cache.entries()
    }
    # Poison trn2's entry with trn1's NEFF (1 core, not 2) and a matching sha256.
    trn1, trn2 = entries[UNITS[0]], entries[UNITS[1]]
    shutil.copyfile(trn1 / "model.neff", trn2 / "model.neff")
    record = json.loads((trn2 / "entry.json").read_text())
    record["sha256"] = json.loads((trn1 / "entry.json").read_text())["sha256"]
    (trn2 / "entry.json").write_text(json.dumps(record))
    summary = build(project(tmp_path / "b"))
    assert summary.origins == {"cache-local": 1, "compiled": 1}
    (notice,) = summary.notices
    assert (
        f"compile:{UNITS[1]}: the cache at {isolated_cache} held a NEFF that does not match"
        in notice
    )
    assert "it is for 1 NeuronCore(s) but the unit uses lnc=2" in notice
    assert cache.verify() == [] and len(cache.entries()) == 2  # replaced by the right one
    assert build(project(tmp_path / "c")).origins == {"cache-local": 2}


@pytest.mark.parametrize(
    ("fault", "message", "status"),
    [
        ("exit1", "neuronx-cc failed", "exit status: 1"),
        ("exit70", "neuronx-cc failed with an internal error (exit 70) twice", "exit status: 70"),
        ("empty", "neuronx-cc exited 0 but wrote no NEFF", None),
        ("garbage", "neuronx-cc wrote an invalid NEFF", None),
        ("hugelog", "neuronx-cc failed", "exit status: 1"),
    ],
)
def test_each_compiler_fault_is_a_clear_failure_and_leaves_no_neff(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str, message: str, status: str | None
) -> None:
    root = project(tmp_path / "p")
    monkeypatch.setenv("NKIBUILD_FAKE_CC_FAULT", fault)
    monkeypatch.setenv("NKIBUILD_FAKE_CC_FAULT_MATCH", "trn2")
    summary = build(root, keep_going=True)
    (failure,) = summary.failures
    assert failure.name == f"compile:{UNITS[1]}"
    assert failure.detail.startswith(f"{UNITS[1]}: {message}")
    assert "  command: " in failure.detail and " compile --framework XLA " in failure.detail
    assert (status in failure.detail) if status else "exit status" not in failure.detail
    assert len(failure.detail) < 10_000  # a 5 MB log is cut to its tail in the message
    unit_dir = root / "build" / "compile" / UNITS[1]
    assert not (unit_dir / "model.neff").exists() and not (unit_dir / "result.json").exists()
    assert (unit_dir / "compile.log").exists()
    assert (root / "build" / "compile" / UNITS[0] / "model.neff").exists()  # the other unit


@pytest.mark.parametrize(
    ("printed", "version"),
    [
        ("Loading...\nNeuronX Compiler version 2.23.6484.0+3b612583\n", "2.23.6484.0+3b612583"),
        ("NeuronX Compiler version 2.21.1.0\nPython 3.10\n", "2.21.1.0"),
        ("neuronx-cc 2.x\n", None),
    ],
)
def test_compiler_version_is_read_from_its_version_line(
    tmp_path: Path, printed: str, version: str | None
) -> None:
    from nkibuild.errors import ToolchainError
    from nkibuild.toolchain import read_compiler_version

    script = tmp_path / "neuronx-cc"
    script.write_text(f"#!/bin/sh\nprintf '{printed}'\n")
    script.chmod(0o755)
    if version is None:
        with pytest.raises(ToolchainError, match="printed no 'NeuronX Compiler version <X>' line"):
            read_compiler_version((str(script),))
    else:
        assert read_compiler_version((str(script),)) == version
