"""`nkibuild init`: a minimal project that builds as it is (JAX kernel + NumPy reference)."""

from __future__ import annotations

import keyword
import os
from pathlib import Path

from nkibuild.confine import read_regular
from nkibuild.errors import UsageError
from nkibuild.fsutil import atomic_write_text
from nkibuild.text import printable

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
MAX_GITIGNORE_BYTES = 1 << 20


def scaffold(directory: Path) -> list[str]:
    """Create the files and what it did to each, e.g. "created nkibuild.yaml".

    Checks everything first and refuses, writing nothing, if a path it would create
    is taken (a dangling symlink too: writing through it would create its target), if
    something other than a directory stands where a directory must be (a symlinked
    `kernels/` is refused too), or if `.gitignore` is not a regular file; an existing
    .gitignore gets the missing entries appended.
    """
    files = {
        directory / "nkibuild.yaml": MANIFEST.format(name=project_name(directory)),
        directory / "kernels" / "kernels.py": KERNEL,
        directory / "kernels" / "reference.py": REFERENCE,
        directory / "pyproject.toml": PYPROJECT.format(install=EDITABLE_INSTALL),
    }
    gitignore = directory / ".gitignore"
    ignored, unreadable = _read_gitignore(gitignore)
    taken = [*_taken(directory, list(files)), *unreadable]
    if taken:
        raise UsageError(
            f"nkibuild init: {'; '.join(taken)}; nothing was written "
            "(move them away, or init another directory)"
        )
    for path, text in files.items():
        atomic_write_text(path, text)
    done = [f"created {path}" for path in files]
    updated = _ignore_outputs(gitignore, ignored)
    return [*done, updated] if updated else done


def _taken(directory: Path, files: list[Path]) -> list[str]:
    """Why each of `files` cannot be created where it goes, if it cannot."""
    taken = [f"would overwrite {printable(str(path))}" for path in files if os.path.lexists(path)]
    for folder in sorted({path.parent for path in files}):
        while not os.path.lexists(folder) and folder != folder.parent:
            folder = folder.parent  # the nearest that exists: it must be a directory
        if not folder.is_dir() or (folder != directory and folder.is_symlink()):
            taken.append(f"{printable(str(folder))} is in the way (not a directory)")
    return taken


def _read_gitignore(gitignore: Path) -> tuple[str | None, list[str]]:
    """Its text (None: there is none), or why it cannot be read (bounded, no symlink)."""
    try:
        return read_regular(gitignore, MAX_GITIGNORE_BYTES, follow=False).decode(), []
    except FileNotFoundError:
        return None, []
    except (OSError, UnicodeDecodeError) as error:
        why = getattr(error, "strerror", None) or "not UTF-8 text"
        return None, [f"cannot update {printable(str(gitignore))} ({why})"]


def _ignore_outputs(gitignore: Path, existing: str | None) -> str | None:
    """Make git ignore build/ and dist/; what was done, or None if it already does."""
    present = {line.strip().strip("/") for line in (existing or "").splitlines()}
    missing = [entry for entry in IGNORED if entry.strip("/") not in present]
    if not missing:
        return None
    separator = "\n" if existing and not existing.endswith("\n") else ""
    addition = "\n".join([GITIGNORE_HEADER, *missing]) + "\n"
    atomic_write_text(gitignore, (existing or "") + separator + addition)
    return f"{'updated' if existing else 'created'} {gitignore}"


def project_name(directory: Path) -> str:
    """A distribution name that validates whatever the directory is called: ASCII
    letters and digits with single '-' for anything else, a letter first, at most 64
    characters, and an import name that is not a Python keyword."""
    words = "".join(c if c.isascii() and c.isalnum() else " " for c in directory.resolve().name)
    name = "-".join(words.lower().split())[:64].rstrip("-")
    if not name[:1].isalpha() or keyword.iskeyword(name.replace("-", "_")):
        name = f"kernels-{name}"[:64].rstrip("-")
    return name
