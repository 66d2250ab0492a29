"""Safe YAML loading that remembers where every value came from.

PyYAML's own constructors lose positions, accept duplicate keys silently and
expand aliases without bound, so documents are composed into nodes (safe
resolution, PyYAML's composer) and converted here. Only JSON-like data comes out:
dict, list, str, int, float, bool and None.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

import yaml
from yaml.composer import ComposerError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.reader import ReaderError

from nkibuild.confine import read_regular
from nkibuild.errors import Diagnostic, Location, ManifestError

MAX_BYTES = 1 << 20
# Each visit of a node counts, so an alias expands into as many visits as its
# target has nodes; this bounds "billion laughs" documents.
MAX_NODES = 100_000
# Deep enough for any manifest; shallow enough that neither PyYAML's recursive
# composer nor the JSON Schema validator can hit Python's recursion limit.
MAX_DEPTH = 32

JsonPath = tuple[str | int, ...]
_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")

_TAG = "tag:yaml.org,2002:"
_SCALAR_TAGS = frozenset(_TAG + name for name in ("null", "bool", "int", "float", "str"))
_SEQ_TAG = _TAG + "seq"
_MAP_TAG = _TAG + "map"
_MERGE_TAG = _TAG + "merge"
# An unquoted 2024-01-01 or "=" stays a string instead of becoming a date or an
# unconstructable "value" node.
_UNRESOLVED_TAGS = frozenset({_TAG + "timestamp", _TAG + "value"})


@dataclass
class YamlDocument:
    """Plain data plus the position of every value and of every mapping key."""

    file: str
    data: Any
    values: dict[JsonPath, Location] = field(default_factory=dict)
    keys: dict[JsonPath, Location] = field(default_factory=dict)

    def location(self, path: JsonPath) -> Location:
        """Where the value at `path` is, or its deepest existing ancestor."""
        for end in range(len(path), -1, -1):
            found = self.values.get(path[:end])
            if found is not None:
                return found
        return Location(self.file, 1, 1)

    def key_location(self, path: JsonPath) -> Location:
        """Where the mapping key naming `path` is (for the root: the document)."""
        return self.keys.get(path) or self.location(path)

    def at(self, message: str, path: JsonPath, *, key: bool = False, **details: Any) -> Diagnostic:
        """A problem with the value at `path`, or with the key naming it."""
        where = self.key_location(path) if key else self.location(path)
        return Diagnostic(message, where, json_path(path), **details)


class _Loader(yaml.SafeLoader):
    """The pure-Python safe loader (it checks every character and words every syntax
    error), composing with a nesting limit and recording where aliases are used."""

    yaml_implicit_resolvers: ClassVar[dict[str, list[tuple[str, re.Pattern[str]]]]] = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag not in _UNRESOLVED_TAGS]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0
        # (id(parent node), item index or id(key node)) -> mark of the alias used
        # as that value: the node itself only knows where its anchor is.
        self.alias_marks: dict[tuple[int, int], yaml.Mark] = {}

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) and parent is not None and index is not None:
            self.alias_marks[_child_key(parent, index)] = event.start_mark
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise ComposerError(
                    None, None, f"nesting deeper than {MAX_DEPTH} levels", event.start_mark
                )
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _child_key(parent: Node, index: Any) -> tuple[int, int]:
    # Mapping values are composed with their key node as index, sequence items with an int.
    return (id(parent), id(index) if isinstance(index, Node) else index)


def load_yaml(
    path: str | os.PathLike[str], display: str | None = None
) -> tuple[YamlDocument, bytes]:
    """The YAML file at `path`, parsed, and its bytes; locations name the file `display`
    (default: `path` as given)."""
    file = display if display is not None else os.fspath(path)
    try:
        raw = read_regular(path, MAX_BYTES)
    except OSError as error:  # missing, a FIFO or device, larger than MAX_BYTES
        raise _fatal(file, f"cannot read the manifest: {error.strerror or error}") from None
    return parse_yaml(raw, file), raw


def parse_yaml(raw: bytes, file: str) -> YamlDocument:
    """Parse one YAML document from UTF-8 bytes; every problem raises ManifestError."""
    if len(raw) > MAX_BYTES:
        raise _fatal(file, f"{len(raw)} bytes, more than the {MAX_BYTES} allowed in a manifest")
    text = _decode(raw, file)
    root, loader = _compose(text, file)
    if root is None:
        raise _fatal(file, "the manifest is empty", hint="start from `format-version: 1`")
    converter = _Converter(loader, file)
    data = converter.convert(root, ())
    if converter.diagnostics:
        raise ManifestError(converter.diagnostics)
    return YamlDocument(file, data, converter.values, converter.keys)


def _compose(text: str, file: str) -> tuple[Node | None, _Loader]:
    try:
        loader = _Loader(text)  # checks that every character is printable
        try:
            loader.get_event()  # StreamStartEvent
            root = None if loader.check_event(yaml.StreamEndEvent) else loader.compose_document()
            if not loader.check_event(yaml.StreamEndEvent):
                where = _location(file, loader.get_event().start_mark)
                message = "a second YAML document starts here"
                hint = "remove the '---' separator and everything after it"
                diagnostic = Diagnostic(
                    message, where, expected="a single YAML document", hint=hint
                )
                raise ManifestError([diagnostic])
            return root, loader
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as error:
        raise _syntax_error(error, file) from None
    except ReaderError as error:
        message = f"character U+{error.character:04X} is not allowed in YAML"
        raise _fatal(file, message, *_line_column(text, error.position)) from None
    except yaml.YAMLError as error:
        raise _fatal(file, f"invalid YAML: {error}") from None


def _decode(raw: bytes, file: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        before = raw[: error.start].decode("utf-8", "replace")
        where = _line_column(before, len(before))
        raise _fatal(file, "the manifest is not valid UTF-8", *where) from None


def _line_column(text: str, position: int) -> tuple[int, int]:
    before = text[:position]
    return before.count("\n") + 1, position - (before.rfind("\n") + 1) + 1


def _location(file: str, mark: yaml.Mark | None) -> Location:
    return Location(file, mark.line + 1, mark.column + 1) if mark else Location(file, 1, 1)


def _syntax_error(error: yaml.MarkedYAMLError, file: str) -> ManifestError:
    mark = error.problem_mark or error.context_mark
    message = error.problem or error.context or "invalid YAML"
    hint = "indent with spaces: YAML does not allow tabs there" if "'\\t'" in message else None
    if error.context and error.context_mark is not None and error.problem_mark is not None:
        where = _location(file, error.context_mark)
        at = f"line {where.line}, column {where.column}"
        if error.context.startswith("while "):
            hint = f"{error.context} that starts at {at}"
        else:  # e.g. "found duplicate anchor 'x'; first occurrence" / "second occurrence"
            message = f"{error.context} at {at}; {message} here"
    return ManifestError([Diagnostic(f"YAML: {message}", _location(file, mark), hint=hint)])


def _fatal(
    file: str, message: str, line: int = 1, column: int = 1, hint: str | None = None
) -> ManifestError:
    return ManifestError([Diagnostic(message, Location(file, line, column), hint=hint)])


class _BudgetExceeded(Exception):
    """Stops the conversion of a document too large or too deep (its argument says so)."""


def _count_nodes(root: Node | None, limit: int) -> int:
    """The distinct nodes under `root` (each alias target once), counted up to `limit`."""
    seen: set[int] = set()
    stack = [] if root is None else [root]
    while stack and len(seen) < limit:
        node = stack.pop()
        if id(node) not in seen:
            seen.add(id(node))
            if isinstance(node, SequenceNode):
                stack.extend(node.value)
            elif isinstance(node, MappingNode):
                stack.extend(item for pair in node.value for item in pair)
    return len(seen)


class _Converter:
    """Nodes -> plain data, recording locations and collecting (not raising) key problems."""

    def __init__(self, loader: _Loader, file: str) -> None:
        self.loader = loader
        self.file = file
        self.values: dict[JsonPath, Location] = {}
        self.keys: dict[JsonPath, Location] = {}
        self.diagnostics: list[Diagnostic] = []
        self.visited = 0
        self.root: Node | None = None
        self.active: set[int] = set()  # nodes being converted: a repeat is a recursive alias

    def convert(self, node: Node, path: JsonPath) -> Any:
        self.root = node
        try:
            return self._value(node, path, self._where(node))
        except _BudgetExceeded as error:
            self.diagnostics = [error.args[0]]
            return None

    def _where(self, node: Node, parent: Node | None = None, index: Any = None) -> Location:
        mark = None
        if parent is not None and self.loader.alias_marks:  # most documents have none
            mark = self.loader.alias_marks.get(_child_key(parent, index))
        return _location(self.file, mark or node.start_mark)

    def _value(self, node: Node, path: JsonPath, where: Location) -> Any:
        self._count(node, path, where)
        self.values.setdefault(path, where)
        if isinstance(node, ScalarNode):
            return self._scalar(node, path, where)
        if node.tag != (_SEQ_TAG if isinstance(node, SequenceNode) else _MAP_TAG):
            self._refuse_tag(node.tag, path, where)
        self.active.add(id(node))
        try:
            if isinstance(node, SequenceNode):
                return [
                    self._value(item, (*path, i), self._where(item, node, i))
                    for i, item in enumerate(node.value)
                ]
            return self._mapping(node, path)
        finally:
            self.active.discard(id(node))

    def _count(self, node: Node, path: JsonPath, where: Location) -> None:
        self.visited += 1
        if self.visited > MAX_NODES:
            raise _BudgetExceeded(self._too_many(path, where))
        if id(node) in self.active:
            raise _BudgetExceeded(
                Diagnostic("an alias refers to a value that contains it", where, json_path(path))
            )
        if len(path) > MAX_DEPTH:
            raise _BudgetExceeded(
                Diagnostic(f"nesting deeper than {MAX_DEPTH} levels", where, json_path(path))
            )

    def _too_many(self, path: JsonPath, where: Location) -> Diagnostic:
        """Aliases are blamed only if the document's own values are within the limit."""
        own = _count_nodes(self.root, MAX_NODES + 1)
        if own > MAX_NODES:
            message, hint = f"the manifest holds more than {MAX_NODES} values (the limit)", None
        else:
            message = f"the document expands to more than {MAX_NODES} values (the limit)"
            hint = f"it has {own} values of its own; anchors and aliases (&name, *name) repeat them"
        return Diagnostic(message, where, json_path=json_path(path), hint=hint)

    def _scalar(self, node: ScalarNode, path: JsonPath, where: Location) -> Any:
        if node.tag not in _SCALAR_TAGS:
            self._refuse_tag(node.tag, path, where)
            return node.value
        try:
            return self.loader.yaml_constructors[node.tag](self.loader, node)
        except (ValueError, yaml.YAMLError):
            # e.g. an integer with more digits than Python converts
            self._problem(f"cannot read {node.value[:40]!r}", where, path)
            return node.value

    def _refuse_tag(self, tag: str, path: JsonPath, where: Location) -> None:
        self._problem(
            f"YAML tag {tag!r} is not allowed",
            where,
            path,
            expected="plain YAML: strings, numbers, booleans, null, lists and mappings",
            hint="remove the tag (the '!...' before the value)",
        )

    def _mapping(self, node: MappingNode, path: JsonPath) -> dict[str, Any]:
        result: dict[str, Any] = {}
        first_seen: dict[str, Location] = {}
        merged: list[Node] = []
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:  # `<<: *base` or `<<: [*a, *b]`
                merged += value_node.value if isinstance(value_node, SequenceNode) else [value_node]
                continue
            key = self._key(key_node, path)
            if key is None:
                continue
            key_where = self._where(key_node)
            if key in first_seen:
                first = first_seen[key]
                self._problem(
                    f"duplicate key {key!r} (first at line {first.line}, column {first.column})",
                    key_where,
                    (*path, key),
                    hint="each key may appear once in a mapping; remove or rename one of them",
                )
                continue
            first_seen[key] = key_where
            self.keys.setdefault((*path, key), key_where)
            where = self._where(value_node, node, key_node)
            result[key] = self._value(value_node, (*path, key), where)
        for source in merged:
            self._merge(source, path, result)
        return result

    def _merge(self, source: Node, path: JsonPath, result: dict[str, Any]) -> None:
        # YAML merge keys (<<: *base): explicit keys win, earlier merges win over later ones.
        where = self._where(source)
        if not isinstance(source, MappingNode):
            self._problem(
                "a merge key (<<) must refer to a mapping",
                where,
                path,
                expected="a mapping or a list of mappings",
            )
            return
        for key, value in self._value(source, path, where).items():
            result.setdefault(key, value)

    def _key(self, node: Node, path: JsonPath) -> str | None:
        where = self._where(node)
        self._count(node, path, where)
        if isinstance(node, ScalarNode) and node.tag == _TAG + "str":
            return node.value
        shown = repr(node.value[:40]) if isinstance(node, ScalarNode) else "a collection"
        self._problem(
            f"mapping keys must be plain strings, not {shown}",
            where,
            path,
            expected="a string key",
            hint="quote it (YAML reads unquoted numbers, booleans and null as such)",
        )
        return None

    def _problem(self, message: str, where: Location, path: JsonPath, **details: Any) -> None:
        self.diagnostics.append(Diagnostic(message, where, json_path(path), **details))


def json_path(path: JsonPath) -> str:
    """`$.kernels.matmul.inputs.x.shape[0]`; keys that are not plain words are bracketed."""
    parts = ["$"]
    for part in path:
        if isinstance(part, int):
            parts.append(f"[{part}]")
        elif _PLAIN_KEY.fullmatch(part):
            parts.append(f".{part}")
        else:
            parts.append(f"[{part!r}]")
    return "".join(parts)
