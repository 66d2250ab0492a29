"""The module an editable install of a bundle runs at startup.

The editable wheel's `.pth` file holds one line, `import <this module>`; the module
puts the bundle's directory under `build/` (and its target parts') on `sys.path`. The
directories are string literals in it (`repr`), never lines of the `.pth` file: site
runs any `.pth` line that starts with `import`, so a project path holding a newline
would otherwise add lines of code to every interpreter start. `nkibuild clean`
removes the bundle directory, and the import then fails with a bare "No module named
..."; the module's finder, consulted after every other one, says what to run instead.
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
DIRECTORIES = {directories!r}
DIRECTORY = DIRECTORIES[0]


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


sys.path.extend(d for d in DIRECTORIES if d not in sys.path)
sys.meta_path.append(MissingBundle())
'''


def finder_module(import_name: str, directories: list[Path]) -> tuple[str, str, str]:
    """The module's file name in the wheel, its source, and the `.pth` line importing it."""
    module = f"__editable___nkibuild_{import_name}_finder"
    resolved = [str(directory.resolve()) for directory in directories]
    source = FINDER_SOURCE.format(import_name=import_name, directories=resolved)
    return f"{module}.py", source, f"import {module}\n"
