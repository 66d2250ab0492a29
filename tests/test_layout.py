"""Layout's string paths (context.py): they must be spelled exactly as os.path.join
spells them, since doit links a file_dep to the task whose targets produce it by
exact string."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from nkibuild.context import Layout


@pytest.mark.parametrize("build_dir", ["/", "/srv/project/build", "/srv/with space/b"])
def test_string_paths_are_spelled_as_os_path_join_spells_them(build_dir: str) -> None:
    layout = Layout(Path(build_dir), Path("/srv/dist"))
    unit = SimpleNamespace(name="kernel/variant/trn2")
    assert layout.compile_path(unit) == os.path.join(build_dir, "compile", unit.name)  # type: ignore[arg-type]
    assert layout.extract_path(unit) == os.path.join(build_dir, "extract", unit.name)  # type: ignore[arg-type]
    assert layout.compile_dir(unit) == Path(build_dir) / "compile" / unit.name  # type: ignore[arg-type]


def test_a_layout_equals_one_made_alike_after_its_paths_were_used() -> None:
    used = Layout(Path("/b"), Path("/d"))
    used.compile_path(SimpleNamespace(name="k/v/t"))  # type: ignore[arg-type]
    assert used == Layout(Path("/b"), Path("/d"))
    assert hash(used) == hash(Layout(Path("/b"), Path("/d")))


def test_a_relative_build_dir_is_refused() -> None:
    with pytest.raises(ValueError, match="absolute"):
        Layout(Path("build"), Path("/d"))
