"""Disk-full and read-only directories, made real with a small tmpfs or a read-only
bind mount in a private mount namespace (`unshare -rm`, no root needed).

A full or read-only build/dist dir fails the build with the path and the reason,
no traceback and nothing half-written; once space is back the next build gives the
clean build's wheel. A full or read-only cache only costs the build its cache.
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
from campaign import Project, record, trial_counts

KIB = 1024


def namespaces_work() -> bool:
    try:
        probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


pytestmark = pytest.mark.skipif(
    not namespaces_work(), reason="needs `unshare -rm` (user and mount namespaces)"
)


@pytest.fixture
def project(tmp_path: Path) -> Project:
    return Project.copy_of_examples(tmp_path)


@pytest.fixture
def out(tmp_path: Path) -> Path:
    """Where a script in the namespace leaves what the test reads (its tmpfs vanishes)."""
    directory = tmp_path / "out"
    directory.mkdir()
    return directory


@pytest.fixture
def reference(tmp_path: Path) -> bytes:
    clean = Project.copy_of_examples(tmp_path / "clean")
    assert clean.build().returncode == 0
    return clean.wheel()


def in_namespace(project: Project, script: str) -> subprocess.CompletedProcess:
    """Run a shell script with its own mounts; `$NKIBUILD` is the build command."""
    command = shlex.join([*project.command("build", "--toolchain", "fake")])
    return subprocess.run(
        ["unshare", "-rm", "sh", "-euc", f"NKIBUILD={shlex.quote(command)}\n{script}"],
        cwd=project.root,
        capture_output=True,
        text=True,
        env=project.env(),
        timeout=600,
        check=False,
    )


def tmpfs(directory: str, size: int) -> str:
    return f"mkdir -p {directory} && mount -t tmpfs -o size={size} tmpfs {directory}\n"


def read_only(directory: str) -> str:
    return (
        f"mkdir -p {directory} && mount --bind {directory} {directory} && "
        f"mount -o remount,bind,ro {directory}\n"
    )


def assert_clean_failure(output: str, path: str, reason: str) -> None:
    assert "Traceback" not in output, output
    assert reason in output, output
    assert path in output, output


# The fast run fills the build dir at two points (doit's state, the bundle); the full
# campaign sweeps the size so that every stage meets a full disk somewhere.
BUILD_DIR_SIZES = [pytest.param(40 * KIB, id="40k"), pytest.param(200 * KIB, id="200k")] + [
    pytest.param(size * KIB, id=f"{size}k", marks=[pytest.mark.slow, pytest.mark.campaign])
    for size in range(16, 513, 32)
]


@pytest.mark.parametrize("size", BUILD_DIR_SIZES)
def test_full_build_dir_fails_cleanly_and_the_rerun_recovers(
    project: Project, reference: bytes, out: Path, size: int
) -> None:
    result = in_namespace(
        project,
        tmpfs("build", size)
        + f"""
        rc=0; $NKIBUILD > {out}/full.log 2>&1 || rc=$?; echo $rc > {out}/full.rc
        find build dist -name '.*' > {out}/leftovers.txt 2>/dev/null || true
        mount -o remount,size=64m build
        $NKIBUILD > {out}/rerun.log 2>&1
        cp dist/*.whl {out}/
        """,
    )
    assert result.returncode == 0, result.stdout + result.stderr + _read(out / "rerun.log")
    full_rc = int(_read(out / "full.rc"))
    failed_at = None
    if full_rc != 0:  # big sizes fit the whole build
        assert full_rc == 1
        log = _read(out / "full.log")
        assert_clean_failure(log, str(project.root), "No space left on device")
        message = next(line for line in log.splitlines() if "No space left" in line)
        failed_at = message.split(":")[0].removeprefix(f"{project.root}/")
    assert _read(out / "leftovers.txt") == ""
    (wheel,) = out.glob("*.whl")
    assert wheel.read_bytes() == reference
    record(
        "build dir on a full disk",
        size_kib=size // KIB,
        failed_at=failed_at,
        result="exit 1 naming the path, no traceback, no temp files; rerun byte-identical",
    )


def test_full_dist_dir_leaves_no_partial_wheel(project: Project, out: Path) -> None:
    result = in_namespace(
        project,
        tmpfs("dist", 8 * KIB)
        + f"""
        rc=0; $NKIBUILD > {out}/full.log 2>&1 || rc=$?; echo $rc > {out}/full.rc
        ls -A dist > {out}/dist.txt
        """,
    )
    assert result.returncode == 0, result.stderr
    assert _read(out / "full.rc").strip() == "1"
    assert_clean_failure(_read(out / "full.log"), ".whl", "No space left on device")
    assert _read(out / "dist.txt") == ""  # neither a truncated wheel nor its temp file


@pytest.mark.parametrize("trials", trial_counts(fast=1, full=5))
def test_full_cache_only_costs_the_cache(
    project: Project, reference: bytes, out: Path, trials: int
) -> None:
    for trial in range(trials):
        result = in_namespace(
            project,
            tmpfs(str(project.cache), (12 + 8 * trial) * KIB)
            + f"""
            rm -rf build dist
            $NKIBUILD > {out}/build.log 2>&1
            cp dist/*.whl {out}/
            find {project.cache} -name '.*' > {out}/leftovers.txt
            python -m nkibuild cache verify --cache-dir {project.cache} > {out}/verify.log
            """,
        )
        log = _read(out / "build.log")
        assert result.returncode == 0, result.stderr + log
        assert "No space left on device; the build goes on without it" in log
        assert "Traceback" not in log
        assert (out / "acme_kernels-0.1.0-py3-none-any.whl").read_bytes() == reference
        assert _read(out / "leftovers.txt") == ""
        assert "0 corrupt entries" in _read(out / "verify.log")
    record(
        "NEFF cache on a full disk",
        trials=trials,
        result="build succeeds with a warning per unpublished NEFF; 0 corrupt entries",
    )


def test_read_only_cache_only_costs_the_cache(
    project: Project, reference: bytes, out: Path
) -> None:
    result = in_namespace(
        project,
        read_only(str(project.cache)) + f"$NKIBUILD > {out}/build.log 2>&1\n",
    )
    log = _read(out / "build.log")
    assert result.returncode == 0, result.stderr + log
    assert "Read-only file system; the build goes on without it" in log
    assert project.wheel() == reference
    record("NEFF cache dir read-only", trials=1, result="build succeeds with warnings")


@pytest.mark.parametrize("directory", ["build", "dist"])
def test_read_only_output_dir_fails_cleanly(project: Project, out: Path, directory: str) -> None:
    result = in_namespace(
        project,
        read_only(directory) + f"rc=0; $NKIBUILD > {out}/log 2>&1 || rc=$?; echo $rc > {out}/rc\n",
    )
    assert result.returncode == 0, result.stderr
    assert _read(out / "rc").strip() == "1"
    assert_clean_failure(_read(out / "log"), str(project.root / directory), "Read-only file system")
    record(f"{directory} dir read-only", trials=1, result="exit 1 naming the path, no traceback")


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""
