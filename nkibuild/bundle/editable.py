"""What an editable install of a bundle says when its bundle directory is gone.

An editable install's `.pth` file puts the bundle's directory under `build/` on
`sys.path`; `nkibuild clean` removes it, and the import then fails with a bare
"No module named ...". The editable wheel also installs the module `finder_module`
writes, which the `.pth` file imports at startup: a finder consulted after every other
one, which turns that failure into one that says what to run.
"""

from __future__ import annotations

from pathlib import Path

FINDER_SOURCE = '''\
"""Installed with the editable {import_name!r} (nkibuild): says what to run when the
bundle directory it points at is gone."""

import os
import sys
from importlib.abc import MetaPathFinder

PACKAGE = {import_name!r}
DIRECTORY = {directory!r}


class MissingBundle(MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != PACKAGE or os.path.isdir(DIRECTORY):
            return None
        raise ModuleNotFoundError(
            f"No module named {{PACKAGE!r}}: it is installed editable from {{DIRECTORY}}, "
            "which is gone (`nkibuild clean` removes it); run `nkibuild build` in its "
            "project to build it again",
            name=fullname,
        )


sys.meta_path.append(MissingBundle())
'''


def finder_module(import_name: str, directory: Path) -> tuple[str, str, str]:
    """The finder's file name in the wheel, its source, and the `.pth` line importing it."""
    module = f"__editable___nkibuild_{import_name}_finder"
    source = FINDER_SOURCE.format(import_name=import_name, directory=str(directory.resolve()))
    return f"{module}.py", source, f"import {module}\n"
