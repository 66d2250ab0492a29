"""The names a Python file defines at module level, read with `ast`: the file is
parsed, never imported (validation must not run the user's code, nor need jax).

`source: kernels/kernels.py:softmaxx` is then a manifest error at validate time,
instead of an AttributeError when the build imports the file.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# Scopes of their own: what they bind is not a module attribute.
_NEW_SCOPES = (
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.Lambda,
    ast.ListComp,
    ast.SetComp,
    ast.DictComp,
    ast.GeneratorExp,
)


@dataclass(frozen=True)
class ModuleNames:
    """What `from module import name` could find without running the module."""

    names: frozenset[str]
    functions: tuple[str, ...]  # def and class names, in file order: what to suggest
    # A star import or a module-level __getattr__: any name may exist.
    open_ended: bool

    def has(self, name: str) -> bool:
        return self.open_ended or name in self.names


def module_names(path: Path) -> ModuleNames | str:
    """The names the module at `path` binds, or why it cannot be parsed."""
    try:
        tree = ast.parse(path.read_bytes(), filename=path.name)
    except SyntaxError as error:  # also a wrong encoding; ValueError: NUL bytes (< 3.12)
        where = f" (line {error.lineno}, column {error.offset})" if error.lineno else ""
        return f"{error.msg}{where}"
    except (ValueError, RecursionError, MemoryError) as error:
        return str(error) or type(error).__name__
    except OSError as error:
        return error.strerror or str(error)
    collector = _Bindings()
    collector.visit(tree)
    # `global name` in a function binds a module attribute when the function runs.
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            collector.names.update(node.names)
    return ModuleNames(
        frozenset(collector.names),
        tuple(collector.functions),
        collector.star_import or "__getattr__" in collector.names,
    )


def defines_all(path: Path, functions: Iterable[str]) -> bool:
    """Whether the module at `path` parses and may define every one of `functions`."""
    names = module_names(path)
    return not isinstance(names, str) and all(map(names.has, functions))


class _Bindings(ast.NodeVisitor):
    """Every name bound in the module's own scope, through if/try/with/for blocks too."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.functions: list[str] = []
        self.star_import = False

    def generic_visit(self, node: ast.AST) -> None:
        if isinstance(node, _NEW_SCOPES):
            # Decorators, defaults and bases run in the module scope but bind nothing.
            name = getattr(node, "name", None)
            if name is not None:
                self.names.add(name)
                self.functions.append(name)
            return
        # Match patterns bind names too: `case [x, *rest]`, `case {**rest}`.
        if isinstance(node, ast.MatchAs | ast.MatchStar) and node.name:
            self.names.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            self.names.add(node.rest)
        super().generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Store):
            self.names.add(node.id)

    def visit_alias(self, node: ast.alias) -> None:
        if node.name == "*":
            self.star_import = True
        else:  # `import a.b` binds `a`
            self.names.add(node.asname or node.name.split(".")[0])
