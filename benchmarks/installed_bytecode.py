"""Benchmarks time nkibuild as pip installs it: with its modules' bytecode compiled.

In a checkout under PYTHONDONTWRITEBYTECODE=1 (some CI images and this machine set
it) every timed process would compile each module changed since its last .pyc, a
cost no installed nkibuild has and the baselines' installed packages (doit,
jsonschema, jax) never pay.
"""

from __future__ import annotations

import compileall
from pathlib import Path

import nkibuild


def compile_nkibuild() -> None:
    compileall.compile_dir(Path(nkibuild.__file__).parent, quiet=1)
