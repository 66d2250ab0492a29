"""The import contract: nkibuild's packages form layers, and every import goes down.

The pipeline reads bottom to top (manifest -> plan -> toolchain -> frontends ->
cache -> compiler -> session/context -> bundle -> verify -> graph -> release -> entry
points). An import of a higher layer from a lower one, even inside a function, would
make a cycle sooner or later; imports only for type checking are exempt, since they
never run.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "nkibuild"

# Bottom first; names in one tuple are one layer and may not import each other.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("text", "plaindata", "exports", "locks"),  # escaping of file-derived text; pickles read
    # without code; fcntl locks
    ("errors", "quantities", "dtypes", "interrupts"),
    ("fsutil", "confine"),
    ("formats",),
    ("manifest",),
    ("plan",),
    ("settings",),
    ("toolchain_double",),  # the toolchain double: what `toolchain` resolves to in fake mode
    ("toolchain",),
    ("frontends",),
    ("cache",),
    ("compiler",),
    ("session",),
    ("context",),
    ("bundle",),
    ("verify",),
    ("graph",),
    ("release",),
    ("cli",),
    ("build",),  # the PEP 517 backend reports through the CLI's plain display
    ("__main__",),
)
# What nkibuild/__init__.py defines itself: every layer may use it.
PACKAGE_ROOT_NAMES = {"__version__", "code_digest"}
RANK = {name: rank for rank, layer in enumerate(LAYERS) for name in layer}
# The double's stand-ins for other people's packages run in frontend workers and
# bundles, never inside nkibuild: they are not part of nkibuild's import graph.
OUTSIDE = ("toolchain_double/fakes", "toolchain_double/fake_runtime")


def part_of(module: str) -> str | None:
    """The top-level part of nkibuild that `module` belongs to (None: not nkibuild's)."""
    parts = module.split(".")
    if parts[0] != "nkibuild" or len(parts) == 1:
        return None
    return parts[1]


def type_checking_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported module) for every nkibuild import that can run."""
    tree = ast.parse(path.read_text())
    exempt = type_checking_lines(tree)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom | ast.Import) and node.lineno in exempt:
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "nkibuild":  # `from nkibuild import compiler`
                found += [(node.lineno, f"nkibuild.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
    return found


def modules() -> list[Path]:
    return [
        path
        for path in sorted(PACKAGE.rglob("*.py"))
        if not any(part in path.relative_to(PACKAGE).as_posix() for part in OUTSIDE)
    ]


def test_every_part_of_nkibuild_has_a_layer() -> None:
    parts = {path.relative_to(PACKAGE).parts[0].removesuffix(".py") for path in modules()}
    parts.discard("__init__")
    assert parts - set(RANK) == set()


def test_imports_go_down_the_layers() -> None:
    upward = []
    for path in modules():
        relative = path.relative_to(PACKAGE)
        importer = relative.parts[0].removesuffix(".py")
        if importer == "__init__":
            continue
        for line, module in imports(path):
            imported = part_of(module)
            if imported is None or imported in PACKAGE_ROOT_NAMES or imported == importer:
                continue
            if RANK[imported] >= RANK[importer]:
                upward.append(f"nkibuild/{relative}:{line} imports {module}")
    assert upward == []


def test_the_contract_sees_function_level_imports(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from nkibuild.release import x\n"
        "def f():\n"
        "    from nkibuild.graph import tasks\n"
        "    import nkibuild.cli.main\n"
    )
    assert [i for i in imports(sample) if part_of(i[1])] == [
        (5, "nkibuild.graph"),
        (6, "nkibuild.cli.main"),
    ]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_imports(path: Path, known: set[str]) -> set[str]:
    """The nkibuild modules `path` imports where it can run (`from nkibuild.a import b`
    imports nkibuild.a.b when that is a module, else nkibuild.a). A package's
    __init__ handing on names of its own submodules is not counted: it is the package's
    face, as a reader sees it."""
    importer = module_name(path)
    tree = ast.parse(path.read_text())
    exempt = type_checking_lines(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom | ast.Import) or node.lineno in exempt:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif node.level == 0 and node.module:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in known else node.module)
    own = f"{importer}." if path.name == "__init__.py" else None
    return {
        module
        for module in found & known
        if module != importer and not (own and module.startswith(own))
    }


def import_cycles() -> list[list[str]]:
    """Groups of nkibuild modules that import each other in a loop (Tarjan's algorithm)."""
    paths = modules()
    known = {module_name(path) for path in paths}
    edges = {module_name(path): module_imports(path, known) for path in paths}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for successor in sorted(edges[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            group = []
            while (member := stack.pop()) != node:
                group.append(member)
            if group:
                cycles.append(sorted([node, *group]))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return cycles


def test_no_modules_import_each_other_in_a_loop() -> None:
    assert import_cycles() == []


def test_the_loop_finder_finds_a_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "nkibuild"
    (package / "a").mkdir(parents=True)
    (package / "a" / "__init__.py").write_text("from nkibuild.a import x\n")
    (package / "a" / "x.py").write_text("from nkibuild.b import y\n")
    (package / "b.py").write_text("def y():\n    from nkibuild.a import x\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", package)
    assert import_cycles() == [["nkibuild.a.x", "nkibuild.b"]]


def test_packages_hand_on_their_names_when_first_used() -> None:
    import nkibuild.cache
    import nkibuild.compiler
    from nkibuild.compiler.record import RESULT_FILE

    assert nkibuild.compiler.RESULT_FILE == RESULT_FILE
    assert callable(nkibuild.cache.open_cache_chain)
    with pytest.raises(AttributeError, match="has no attribute 'missing'"):
        nkibuild.compiler.missing  # noqa: B018
