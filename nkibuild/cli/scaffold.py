"""`nkibuild init`: a minimal project that builds as it is (JAX kernel + NumPy reference)."""

from __future__ import annotations

import os
from pathlib import Path

from nkibuild.errors import UsageError
from nkibuild.fsutil import atomic_write_text

MANIFEST = """\
# nkibuild manifest: see docs/manifest.md for every key.
format-version: 1

package:
  name: {name}
  version: 0.1.0
  description: Neuron kernels built with nkibuild

defaults:
  targets: [trn1, trn2]

kernels:
  scaled_add:
    frontend: jax
    source: kernels/kernels.py:scaled_add
    reference: kernels/reference.py:scaled_add
    inputs:
      x: {{shape: [128, 512], dtype: float32}}
      y: {{shape: [128, 512], dtype: float32}}
    constants:
      alpha: 2.0
    variants:
      small: {{x: [128, 512], y: [128, 512]}}
      large: {{x: [1024, 512], y: [1024, 512]}}
"""

KERNEL = '''\
"""Kernels traced by nkibuild (JAX on CPU at build time)."""

import jax.numpy as jnp


def scaled_add(x, y, alpha):
    return jnp.asarray(alpha, x.dtype) * x + y
'''

REFERENCE = '''\
"""NumPy references: what the bundle runs on hosts without a Neuron device."""


def scaled_add(x, y, alpha):
    return (alpha * x + y).astype(x.dtype)
'''


PYPROJECT = """\
# Makes the project pip-installable through nkibuild's build backend (docs/pep517.md).
# Install it editable into the environment nkibuild is installed in:
#   {install}
# (--no-build-isolation: the build uses this environment's nkibuild and jax, not copies
# from a package index; toolchain=fake: placeholder NEFFs, drop it on a Neuron host.)
[build-system]
requires = ["nkibuild[jax]"]
build-backend = "nkibuild.build"
"""

# How to install the scaffold editable today: `requires` names nkibuild, which a build
# isolated from this environment would have to find on an index.
EDITABLE_INSTALL = "python -m pip install -e . --no-build-isolation -C toolchain=fake"

GITIGNORE_HEADER = "# nkibuild's outputs (nkibuild clean removes them), and Python's bytecode"
# Bytecode: nkibuild writes none into the project, but Python run by hand on the
# kernels (a quick test of a reference) would.
IGNORED = ("/build/", "/dist/", "__pycache__/")


def scaffold(directory: Path) -> list[str]:
    """Create the files and what it did to each, e.g. "created nkibuild.yaml".

    Checks every path first and refuses, writing nothing, if one it would create already
    exists (a dangling symlink too: writing through it would create its target); an
    existing .gitignore gets the missing entries appended instead.
    """
    name = _project_name(directory)
    files = {
        directory / "nkibuild.yaml": MANIFEST.format(name=name),
        directory / "kernels" / "kernels.py": KERNEL,
        directory / "kernels" / "reference.py": REFERENCE,
        directory / "pyproject.toml": PYPROJECT.format(install=EDITABLE_INSTALL),
    }
    existing = [str(path) for path in files if os.path.lexists(path)]
    if existing:
        raise UsageError(
            f"nkibuild init: would overwrite {', '.join(existing)}; nothing was written "
            "(move them away, or init another directory)"
        )
    for path, text in files.items():
        atomic_write_text(path, text)
    done = [f"created {path}" for path in files]
    gitignore = _ignore_outputs(directory / ".gitignore")
    return [*done, gitignore] if gitignore else done


def _ignore_outputs(gitignore: Path) -> str | None:
    """Make git ignore build/ and dist/; what was done, or None if it already does."""
    existing = gitignore.read_text(encoding="utf-8") if gitignore.exists() else ""
    present = {line.strip().strip("/") for line in existing.splitlines()}
    missing = [entry for entry in IGNORED if entry.strip("/") not in present]
    if not missing:
        return None
    separator = "\n" if existing and not existing.endswith("\n") else ""
    addition = "\n".join([GITIGNORE_HEADER, *missing]) + "\n"
    atomic_write_text(gitignore, existing + separator + addition)
    return f"{'updated' if existing else 'created'} {gitignore}"


def _project_name(directory: Path) -> str:
    name = "".join(c if c.isalnum() else "-" for c in directory.resolve().name.lower()).strip("-")
    if not name or not name[0].isalpha():
        name = f"kernels-{name}".rstrip("-")
    return name
