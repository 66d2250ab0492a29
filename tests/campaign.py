"""Shared parts of the fault-injection campaign (tests/test_reliability_*.py).

Each campaign test runs a fast subset by default and the full number of trials
under `-m campaign` (see docs/reliability.md). With NKIBUILD_CAMPAIGN_RESULTS set
to a file, every test appends one JSON line with its figures, which is where the
table in docs/reliability.md comes from.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import EXAMPLES

from nkibuild.fsutil import LEFTOVER_PATTERNS, leftovers

TAG_VARIABLE = "NKIBUILD_CAMPAIGN_TAG"


def trial_counts(fast: int, full: int) -> list[object]:
    """Parametrize a campaign test: `fast` trials by default, `full` under -m campaign."""
    return [
        pytest.param(fast, id=f"{fast}-trials"),
        pytest.param(full, id=f"{full}-trials", marks=[pytest.mark.slow, pytest.mark.campaign]),
    ]


def record(fault: str, **figures: object) -> None:
    """Print a campaign figure and append it to $NKIBUILD_CAMPAIGN_RESULTS, if set."""
    line = json.dumps({"fault": fault, **figures}, sort_keys=True)
    print(f"campaign: {line}")
    results = os.environ.get("NKIBUILD_CAMPAIGN_RESULTS")
    if results:
        with open(results, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")


@dataclass
class Project:
    """A copy of examples/ with its own NEFF cache; every process it starts carries a
    tag in its environment, so the process table shows what it left running."""

    root: Path
    cache: Path
    tag: str

    @classmethod
    def copy_of_examples(cls, directory: Path) -> Project:
        root = directory / "project"
        shutil.copytree(
            EXAMPLES, root, ignore=shutil.ignore_patterns("build", "dist", "__pycache__")
        )
        return cls.at(root, directory / "cache")

    @classmethod
    def at(cls, root: Path, cache: Path) -> Project:
        """The project in `root` (already written), with `cache` as its NEFF cache."""
        return cls(root, cache, uuid.uuid4().hex)

    def env(self, **extra: str) -> dict[str, str]:
        return {
            **os.environ,
            "CI": "true",
            "NKIBUILD_CACHE_DIR": str(self.cache),
            TAG_VARIABLE: self.tag,
            **extra,
        }

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "nkibuild", *args]

    def start_build(self, *args: str, log: Path, **env: str) -> subprocess.Popen[bytes]:
        with open(log, "wb") as sink:
            return subprocess.Popen(
                self.command("build", "--toolchain", "fake", *args),
                cwd=self.root,
                stdout=sink,
                stderr=subprocess.STDOUT,
                env=self.env(**env),
            )

    def run(self, *args: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.command(*args),
            cwd=self.root,
            capture_output=True,
            text=True,
            env=self.env(**env),
            timeout=timeout,
            check=False,
        )

    def build(self, *args: str, **env: str) -> subprocess.CompletedProcess:
        return self.run("build", "--toolchain", "fake", *args, **env)

    def wheel(self) -> bytes:
        (wheel,) = (self.root / "dist").glob("*.whl")
        return wheel.read_bytes()

    def leftovers(self) -> list[Path]:
        """Temp files and staging dirs under the build and dist dirs."""
        return [
            path
            for directory in (self.root / "build", self.root / "dist")
            if directory.exists()
            for path in leftovers(directory, LEFTOVER_PATTERNS)
        ]

    def corrupt_cache_entries(self) -> int:
        verified = self.run("cache", "verify", "--cache-dir", str(self.cache))
        assert "Traceback" not in verified.stderr, verified.stderr
        last = [line for line in verified.stdout.splitlines() if "corrupt entries" in line]
        assert last, verified.stdout
        return int(last[0].split()[0])


def tagged_processes(project: Project) -> list[str]:
    """Command lines of live processes the project started: those whose environment
    holds its tag, and those working in its directory (workers get a filtered
    environment; compilers and workers run in dirs under the build dir)."""
    needle = f"{TAG_VARIABLE}={project.tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            tagged = needle in (entry / "environ").read_bytes().split(b"\0")
            if not tagged and not _inside(Path(os.readlink(entry / "cwd")), project.root):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if state == "Z":
                continue  # exited, waiting for its parent to reap it
            found.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            continue  # exited meanwhile, or not ours to read
    return found


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def wait_for_no_processes(project: Project, timeout: float = 10.0) -> list[str]:
    """The project's processes still alive after `timeout` seconds (ideally none)."""
    deadline = time.monotonic() + timeout
    while True:
        alive = tagged_processes(project)
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def wait_for_lines(path: Path, count: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() or len(path.read_text().splitlines()) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not reach {count} lines in {timeout} s")
        time.sleep(0.05)


def finished_tasks(output: str, stage: str = "") -> list[str]:
    """Tasks a build reported done ("[ 3/13] done   extract:k/v 0.0s"), of `stage` if given."""
    lines = [line for line in output.splitlines() if " done " in line]
    names = [line.split(" done ", 1)[1].split()[0] for line in lines]
    return [name for name in names if name.startswith(stage)]
