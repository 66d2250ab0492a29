"""Frontend workers: batched (one process, many kernels) and isolated from user code."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import build, write_project

from nkibuild.errors import BuildError
from nkibuild.toolchain.worker_pool import WorkerKey, WorkerPool

pytest.importorskip("jax")

KERNELS = """\
import os
import sys
from collections.abc import Iterator
import time

import jax.numpy as jnp


def double(x):
    return x * 2


def triple(x):
    return x * 3


def noisy(x):
    print("stray output from user code")
    return x + 1


def exits(x):
    sys.exit(3)


def crashes(x):
    os._exit(9)


def hangs(x):
    time.sleep(600)
"""


def job(root: Path, function: str, output: Path) -> dict:
    return {
        "frontend": "jax",
        "root": str(root),
        "path": "k.py",
        "function": function,
        "inputs": [{"name": "x", "shape": [4, 4], "dtype": "float32"}],
        "constants": [],
        "output": str(output),
    }


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[WorkerPool]:
    (tmp_path / "k.py").write_text(KERNELS)
    workers = WorkerPool()
    yield workers
    workers.close()


KEY = WorkerKey("project", sys.executable, "jax", None)


def test_one_worker_process_serves_many_kernels(pool: WorkerPool, tmp_path: Path) -> None:
    results = [
        pool.run(KEY, job(tmp_path, name, tmp_path / f"{index}.pb"), timeout=120, unit=name)
        for index, name in enumerate(["double", "triple", "noisy", "double"])
    ]
    assert all(result["ok"] for result in results)
    assert len({result["pid"] for result in results}) == 1
    assert all((tmp_path / f"{index}.pb").stat().st_size > 0 for index in range(4))
    # Output of user code never corrupts the protocol; it is kept with that job.
    assert "stray output from user code" in results[2]["log"]


def test_sys_exit_in_user_code_fails_only_that_job(pool: WorkerPool, tmp_path: Path) -> None:
    failed = pool.run(KEY, job(tmp_path, "exits", tmp_path / "a.pb"), timeout=120, unit="exits")
    assert not failed["ok"] and "SystemExit" in failed["error"]
    after = pool.run(KEY, job(tmp_path, "double", tmp_path / "b.pb"), timeout=120, unit="d")
    assert after["ok"] and after["pid"] == failed["pid"]


def test_a_crashing_worker_is_reported_and_replaced(pool: WorkerPool, tmp_path: Path) -> None:
    first = pool.run(KEY, job(tmp_path, "double", tmp_path / "a.pb"), timeout=120, unit="d")
    with pytest.raises(BuildError) as caught:
        pool.run(KEY, job(tmp_path, "crashes", tmp_path / "b.pb"), timeout=120, unit="crash")
    assert "died" in caught.value.render() and "exit status: 9" in caught.value.render()
    after = pool.run(KEY, job(tmp_path, "triple", tmp_path / "c.pb"), timeout=120, unit="t")
    assert after["ok"] and after["pid"] != first["pid"]


def test_a_hanging_kernel_is_killed_after_the_timeout(pool: WorkerPool, tmp_path: Path) -> None:
    pool.run(KEY, job(tmp_path, "double", tmp_path / "warm.pb"), timeout=120, unit="warm")
    with pytest.raises(BuildError) as caught:
        pool.run(KEY, job(tmp_path, "hangs", tmp_path / "a.pb"), timeout=1.5, unit="hang")
    assert "did not finish within 1.5 s" in caught.value.render()
    after = pool.run(KEY, job(tmp_path, "double", tmp_path / "b.pb"), timeout=120, unit="d")
    assert after["ok"]


def test_worker_environment_is_clean(
    pool: WorkerPool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SECRET_TOKEN", "do-not-leak")
    monkeypatch.setenv("NEURON_RT_LOG_LEVEL", "INFO")
    (tmp_path / "k.py").write_text(
        KERNELS + "\n\ndef env_probe(x):\n"
        "    print('SECRET=' + os.environ.get('SECRET_TOKEN', 'absent'))\n"
        "    print('NEURON=' + os.environ.get('NEURON_RT_LOG_LEVEL', 'absent'))\n"
        "    return x\n"
    )
    result = pool.run(KEY, job(tmp_path, "env_probe", tmp_path / "e.pb"), timeout=120, unit="e")
    assert "SECRET=absent" in result["log"] and "NEURON=INFO" in result["log"]
    monkeypatch.setenv("NKIBUILD_PASS_ENV", "SECRET_TOKEN")  # the user asks for it
    other = WorkerPool()
    try:
        passed = other.run(
            KEY, job(tmp_path, "env_probe", tmp_path / "f.pb"), timeout=120, unit="f"
        )
    finally:
        other.close()
    assert "SECRET=do-not-leak" in passed["log"]


def test_misbehaving_kernels_fail_alone_under_keep_going(tmp_path: Path) -> None:
    manifest = "format-version: 1\npackage: {name: isolation, version: 1.0.0}\nkernels:\n"
    for name in ("double", "exits", "crashes", "noisy", "triple"):
        manifest += (
            f"  {name}:\n    frontend: jax\n    source: k.py:{name}\n"
            "    inputs: {x: {shape: [4, 4], dtype: float32}}\n"
        )
    project = write_project(tmp_path / "p", manifest, {"k.py": KERNELS})
    summary = build(project, keep_going=True)
    failed = {outcome.name: outcome.detail for outcome in summary.failures}
    assert set(failed) == {"extract:exits/default", "extract:crashes/default"}
    assert "SystemExit" in failed["extract:exits/default"]
    assert "died" in failed["extract:crashes/default"]
    built = {name for name in summary.executed if name.startswith("compile:")}
    assert built == {f"compile:{k}/default/trn2" for k in ("double", "noisy", "triple")}


def test_a_closed_pool_starts_no_worker(pool: WorkerPool, tmp_path: Path) -> None:
    # After Ctrl-C the session closes its pool while doit threads may still run jobs:
    # none of them may start a worker nobody would stop.
    pool.close()
    with pytest.raises(BuildError, match="the build is stopping"):
        pool.run(KEY, job(tmp_path, "double", tmp_path / "a.pb"), timeout=120, unit="d")
    assert pool._workers == {}


def test_a_compiler_started_after_the_kill_is_killed_at_once() -> None:
    from nkibuild.compiler.process import ProcessRegistry

    registry = ProcessRegistry()
    registry.kill_all()
    late = subprocess.Popen(["sleep", "30"], start_new_session=True)
    registry.add(late.pid)
    assert late.wait(timeout=5) == -signal.SIGKILL
