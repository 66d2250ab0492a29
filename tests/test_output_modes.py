"""Outputs get the user's umask: what nkibuild writes atomically (temp file + rename)
or stages in a temp dir must not keep mkstemp's 0o600 or mkdtemp's 0o700."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from helpers import EXAMPLE_KERNELS, write_project

MANIFEST = """\
format-version: 1
package: {name: mode-kernels, version: 0.1.0}
defaults: {targets: [trn2]}
kernels:
  softmax:
    frontend: hlo
    source: kernels/softmax.hlo.pb
    inputs: {logits: {shape: [64, 1024], dtype: float32}}
"""


def modes_under(*roots: Path) -> dict[str, int]:
    """Permission bits of every file and directory below `roots` (not following links)."""
    found = {}
    for root in roots:
        for directory, dirs, files in os.walk(root):
            for name in [*dirs, *files]:
                path = Path(directory, name)
                found[str(path)] = stat.S_IMODE(path.lstat().st_mode)
    return found


def test_every_output_gets_the_users_umask(tmp_path: Path, isolated_cache: Path) -> None:
    project = write_project(tmp_path / "project", MANIFEST)
    (project / "kernels").mkdir()
    shutil.copyfile(EXAMPLE_KERNELS / "softmax.hlo.pb", project / "kernels" / "softmax.hlo.pb")
    command = f"umask 027 && exec {sys.executable} -m nkibuild build --toolchain fake"
    result = subprocess.run(
        ["sh", "-c", command], cwd=project, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    modes = modes_under(project / "build", project / "dist", isolated_cache)
    assert any(path.endswith(".whl") for path in modes)
    wrong = {
        path: oct(mode)
        for path, mode in modes.items()
        if mode != (0o750 if os.path.isdir(path) else 0o640)
    }
    assert wrong == {}
