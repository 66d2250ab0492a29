"""Toolchain doubles: stand-ins for the Neuron tools that cannot be installed everywhere.

`fake_neuronxcc` behaves like `neuronx-cc` on the command line and writes placeholder
NEFFs (a real container and signature, no executable code). nkibuild's tests and CI use
these doubles; a real build never uses them unless `--toolchain fake` is chosen.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
FAKES_DIR = HERE / "fakes"  # nki, torch, torch_xla stand-ins for frontend workers
# nkipy's tracer runs on any CPU: the double adds this stand-in only where the real
# nkipy is not installed.
FAKE_NKIPY_DIR = HERE / "fake_nkipy"
FAKE_RUNTIME_DIR = HERE / "fake_runtime"  # nrtpy and spike, for running bundles
COMPILER_COMMAND = (sys.executable, "-m", "nkibuild.toolchain_double.fake_neuronxcc")
LABEL = " (nkibuild toolchain double: placeholder NEFFs)"


def fake_nki_version() -> str:
    """The NKI release the double's nki imitates: NKIBUILD_FAKE_NKI_VERSION, else the
    newest it knows (the default fakes/nki/__init__.py has too)."""
    return os.environ.get("NKIBUILD_FAKE_NKI_VERSION") or "0.7.0"


def compiler_version() -> str:
    """What the double's `--version` answers now, and its NEFFs record: a build asks
    this in-process (the compiler is this package), not through a process of its own.
    NKIBUILD_FAKE_CC_VERSION stands for an upgraded compiler."""
    return os.environ.get("NKIBUILD_FAKE_CC_VERSION") or "2.23.0.0+nkibuild.fake"
