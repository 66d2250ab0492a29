"""A bundle asked to run a kernel on a target it has no NEFF for says so."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from helpers import build, softmax_manifest, softmax_project

from nkibuild.toolchain_double import FAKE_RUNTIME_DIR

SCRIPT = """
    import numpy as np
    from softmax_kernels import softmax
    from softmax_kernels._runtime import KernelError
    try:
        softmax(np.zeros((64, 1024), np.float32), mode="neuron")
    except KernelError as error:
        print(error)
"""


def test_neuron_mode_on_a_target_without_a_neff_is_a_kernel_error(tmp_path: Path) -> None:
    project = softmax_project(tmp_path / "p", softmax_manifest(defaults="{targets: [trn2]}"))
    assert build(project).ok
    bundle = project / "build" / "bundle" / "softmax-kernels"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("NKIBUILD_", "PYTHON"))}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={
            **clean,
            "PYTHONPATH": os.pathsep.join([str(bundle), str(FAKE_RUNTIME_DIR)]),
            "NKIBUILD_TARGET": "trn3",
        },
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "softmax: no NEFF was built for trn3 (built: trn2)" in result.stdout
