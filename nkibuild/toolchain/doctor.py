"""`nkibuild doctor`: which toolchain pieces this host has and what `auto` would pick."""

from __future__ import annotations

import contextlib
import importlib.util
import platform
import sys
from importlib import metadata

from nkibuild import __version__
from nkibuild.errors import ToolchainError
from nkibuild.toolchain import NO_COMPILER_HELP, find_compiler, read_compiler_version

PRODUCT_NAME_FILE = "/sys/devices/virtual/dmi/id/product_name"
# (import name, distribution, what nkibuild uses it for)
PIECES = (
    ("jax", "jax", "jax frontend (traces on CPU)"),
    ("nki", "nki", "nki frontend, simulate mode"),
    ("nkipy", "nkipy", "nkipy frontend"),
    ("torch_xla", "torch-xla", "nki frontend (graph extraction)"),
    ("spike", None, "running NEFFs on a device (from aws-neuron/nkipy, not PyPI)"),
)


def instance_type() -> str | None:
    try:
        with open(PRODUCT_NAME_FILE, encoding="utf-8") as handle:
            return handle.read().strip() or None
    except OSError:
        return None


def diagnose() -> list[str]:
    lines = [
        f"nkibuild {__version__} on Python {platform.python_version()} ({sys.executable})",
        f"host instance type: {instance_type() or 'unknown (not an EC2 Neuron instance)'}",
    ]
    compiler = find_compiler()
    if compiler is None:
        lines.append("neuronx-cc: not found")
    else:
        try:
            version = read_compiler_version((str(compiler),))
        except ToolchainError as error:
            version = f"unusable: {error}"
        lines.append(f"neuronx-cc: {compiler} ({version})")
    lines += [_piece(module, dist, purpose) for module, dist, purpose in PIECES]
    if compiler is None:
        lines.append("--toolchain auto: would stop with this message:")
        lines += [f"  {line}" for line in NO_COMPILER_HELP.splitlines()]
    else:
        lines.append(f"--toolchain auto: uses the real compiler at {compiler}")
    return lines


def _piece(module: str, distribution: str | None, purpose: str) -> str:
    if importlib.util.find_spec(module) is None:
        return f"{module}: not importable — needed for {purpose}"
    version = "unknown version"
    if distribution:
        with contextlib.suppress(metadata.PackageNotFoundError):
            version = metadata.version(distribution)
    return f"{module}: {version} — {purpose}"
