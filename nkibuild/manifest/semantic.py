"""Checks a schema cannot express, run on the typed model after the schema passed.

Names that become Python names, package metadata, source files, variants, targets
and settings that clash. Positions (and, where the model normalizes a value, the
value as written) come from the YAML document, so every diagnostic points at the
key or value to change.
"""

from __future__ import annotations

import ast
import difflib
import keyword
import posixpath
import re
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from nkibuild.confine import file_problem, read_confined
from nkibuild.errors import Diagnostic, Location, NkibuildError
from nkibuild.manifest.buckets import padding_diagnostics
from nkibuild.manifest.model import (
    DISTRIBUTION_NAME_PATTERN,
    CompileSettings,
    Kernel,
    Manifest,
    split_source,
)
from nkibuild.manifest.phrases import did_you_mean, position, show
from nkibuild.manifest.pysource import ModuleNames, module_names
from nkibuild.manifest.yamlsource import JsonPath, YamlDocument, json_path

PYTHON_FRONTENDS = frozenset({"nki", "nkipy", "jax"})
# Names the generated bundle uses itself: a kernel or argument by these names would
# shadow them (or, for `mode`, repeat the generated keyword-only parameter).
RESERVED_KERNEL_NAMES = frozenset({"build_info", "KERNELS", "reference", "neff", "torch_ops"})
RESERVED_ARGUMENT_NAMES = frozenset({"mode"})
_ABSENT = object()
_LISTED = 8  # names of a file's functions shown when the one named is missing


# What the real nkipy tracer turns 64-bit inputs into (NeuronCores have no 64-bit types).
NKIPY_NARROWED = {"float64": "float32", "int64": "int32"}


NKI_TRN2_FROM = (0, 3)  # NKI 0.3 (SDK 2.29): Trn2/Trn3 only; nki.jit drops these keywords
NKI_DROPPED = {
    "platform_target": "NKI 0.3 removed it (it raises); nkibuild sets each unit's target "
    "through NEURON_PLATFORM_TARGET_OVERRIDE",
    "mode": "NKI 0.3 ignores it (nki.jit picks how to run from the arguments' types)",
}
LNC_FLAGS = ("--lnc", "--logical-nc-config")


def nki_diagnostics(
    manifest: Manifest, version: str | None, release: tuple[int, ...] | None
) -> list[Diagnostic]:
    """What NKI `version` (the toolchain's; `release` its major and minor) refuses in the
    manifest's nki kernels: nothing before 0.3, or with no nki known."""
    if release is None or release < NKI_TRN2_FROM:
        return []
    kernels = [kernel for kernel in manifest.kernels if kernel.frontend == "nki"]
    found = [
        Diagnostic(
            f"kernel {kernel.name!r} (frontend: nki) targets trn1, which NKI {version} does "
            "not support: NKI supports Trn2 and Trn3 only from NKI 0.3 (Neuron SDK 2.29)",
            kernel.location,
            json_path((*_base(kernel), "targets")),
            expected="trn2 or trn3",
            hint="give the kernel `targets: [trn2, trn3]`, or build its trn1 NEFFs with "
            "Neuron SDK 2.28 or earlier (NKI before 0.3)",
        )
        for kernel in kernels
        if "trn1" in (kernel.targets or manifest.default_targets)
    ]
    by_file = {kernel.source.path: kernel for kernel in kernels}  # each file reported once
    found += [
        d for kernel in by_file.values() for d in _dropped_keywords(manifest, kernel, version)
    ]
    return sorted(found, key=position)


def _dropped_keywords(
    manifest: Manifest, kernel: Kernel, version: str | None
) -> Iterator[Diagnostic]:
    """`nki.jit(..., platform_target=...)` or `mode=` in the kernel's file, found with
    `ast` (never imported); a file that does not parse is the sources check's report."""
    try:
        tree = ast.parse(read_confined(manifest.root / kernel.source.path, (manifest.root,)))
    except (SyntaxError, ValueError, OSError, NkibuildError, RecursionError):
        return
    manifest_dir = posixpath.dirname(kernel.location.file) if kernel.location else ""
    shown = posixpath.join(manifest_dir, kernel.source.path)
    for node in ast.walk(tree):
        function = node.func if isinstance(node, ast.Call) else None
        if getattr(function, "attr", getattr(function, "id", None)) != "jit":
            continue
        for keyword_ in node.keywords:  # type: ignore[union-attr]
            if keyword_.arg in NKI_DROPPED:
                yield Diagnostic(
                    f"nki.jit({keyword_.arg}=...) is not supported by NKI {version}",
                    Location(shown, keyword_.lineno, keyword_.col_offset + 1),
                    hint=f"remove it: {NKI_DROPPED[keyword_.arg]}",
                )


def semantic_diagnostics(manifest: Manifest, doc: YamlDocument) -> list[Diagnostic]:
    """Problems beyond the schema, in document order."""
    checks = _Checks(manifest, doc)
    found = [d for check in checks.all() for d in check()]
    return sorted(found, key=position)


def python_functions(manifest: Manifest) -> dict[str, set[str]]:
    """The functions each Python file the manifest names must define (sources of the
    Python frontends, references): what validation looked for in their contents."""
    wanted: dict[str, set[str]] = {}
    for kernel in manifest.kernels:
        python_source = kernel.source if kernel.frontend in PYTHON_FRONTENDS else None
        for ref in (kernel.reference, python_source):
            if ref and ref.function:
                wanted.setdefault(ref.path, set()).add(ref.function)
    return wanted


def name_problem(name: str) -> str | None:
    """Why `name` cannot be a Python name in generated code, or None."""
    if not (name.isascii() and name.isidentifier()):
        return f"{show(name)} is not an ASCII Python identifier"
    if keyword.iskeyword(name):
        return f"{name!r} is a Python keyword"
    if name.startswith("__"):
        return f"{name!r} starts with '__', which Python reserves"
    return None


def _reserved_problem(path: JsonPath) -> str | None:
    name = str(path[-1])
    if len(path) == 2 and (name in RESERVED_KERNEL_NAMES or name.startswith("_")):
        return f"kernel name {name!r} is reserved by the generated bundle (or private)"
    if len(path) == 4 and path[2] == "inputs" and name in RESERVED_ARGUMENT_NAMES:
        return f"{name!r} is reserved: generated kernels take a `mode` keyword argument"
    return None


def _base(kernel: Kernel) -> JsonPath:
    return ("kernels", kernel.name)


class _Checks:
    """The semantic checks, each a generator of diagnostics over the model."""

    def __init__(self, manifest: Manifest, doc: YamlDocument) -> None:
        self.manifest = manifest
        self.doc = doc
        # Each file is checked and parsed once, however many kernels name it.
        self.files: dict[str, tuple[str, str | None] | None] = {}
        self.modules: dict[str, ModuleNames | str] = {}

    def all(self) -> list[Callable[[], Iterator[Diagnostic]]]:
        return [
            self.names,
            self.package,
            self.sources,
            self.hlo_inputs_only,
            self.nkipy_narrowed_inputs,
            self.variant_inputs,
            self.scalar_inputs,
            self.constant_names,
            self.override_targets,
            self.lnc_on_trn1,
            self.nki_lnc_flags,
            self.deps,
            self.encodable,
            lambda: padding_diagnostics(self.manifest, self.doc),
        ]

    def written(self, path: JsonPath) -> Any:
        """The value at `path` as written (_ABSENT if none), for what the model normalizes
        or drops: a source reference as typed, whether a key was given at all, variant
        entries naming inputs that do not exist."""
        node: Any = self.doc.data
        for part in path:
            if not isinstance(node, dict) or part not in node:
                return _ABSENT
            node = node[part]
        return node

    def names(self) -> Iterator[Diagnostic]:
        for path in self._named_entries():
            problem = name_problem(str(path[-1])) or _reserved_problem(path)
            if problem:
                yield self.doc.at(problem, path, key=True, expected="a Python identifier")

    def _named_entries(self) -> Iterator[JsonPath]:
        # Kernel, input, constant and variant names become Python names in the bundle.
        # (A kernel without variants has the implicit one, `default`: a valid name.)
        for kernel in self.manifest.kernels:
            base = _base(kernel)
            yield base
            yield from ((*base, "inputs", spec.name) for spec in kernel.inputs)
            yield from ((*base, "constants", name) for name, _ in kernel.constants)
            yield from ((*base, "variants", variant.name) for variant in kernel.variants)

    def package(self) -> Iterator[Diagnostic]:
        from packaging.specifiers import SpecifierSet
        from packaging.version import Version

        package = self.manifest.package
        # JSON Schema's "$" also matches before a final newline; a name must not end in one.
        name_ok = re.fullmatch(DISTRIBUTION_NAME_PATTERN, package.name) is not None
        if not name_ok:
            yield self.doc.at(
                f"invalid distribution name {show(package.name)}", ("package", "name")
            )
        yield from self._parses(Version, "version", "a PEP 440 version such as 1.0 or 0.2.1rc1")
        yield from self._parses(
            SpecifierSet, "requires-python", "a PEP 440 specifier set such as >=3.10"
        )
        problem = name_problem(package.import_name)
        if problem and self.written(("package", "import-name")) is not _ABSENT:
            yield self.doc.at(problem, ("package", "import-name"), expected="a Python identifier")
        elif problem and name_ok:  # else the name's problem is reported already
            yield self.doc.at(
                f"the distribution name gives the import name {package.import_name!r}: {problem}",
                ("package", "name"),
                hint="set package.import-name to a valid Python package name",
            )

    def _parses(
        self, parse: Callable[[str], object], key: str, expected: str
    ) -> Iterator[Diagnostic]:
        value = self.written(("package", key))
        if value is _ABSENT:
            return
        try:
            parse(value)
        except ValueError:  # packaging's InvalidVersion and InvalidSpecifier
            what = "version" if key == "version" else "version specifier"
            yield self.doc.at(f"invalid {what} {show(value)}", ("package", key), expected=expected)

    def sources(self) -> Iterator[Diagnostic]:
        for kernel in self.manifest.kernels:
            base = _base(kernel)
            python = kernel.frontend in PYTHON_FRONTENDS
            yield from self._source_ref((*base, "source"), python)
            if kernel.reference is not None:
                yield from self._source_ref((*base, "reference"), True)

    def _source_ref(self, path: JsonPath, python: bool) -> Iterator[Diagnostic]:
        text = self.written(path)  # as typed: messages quote it, ".." shows before normpath
        file, function = split_source(text)
        form = "path/to/file.py:function" if python else "a file path without ':function'"
        if python and function is None:
            yield self.doc.at(f"{show(text)} names no function", path, expected=form)
        elif not python and function is not None:
            yield self.doc.at(
                f"{show(text)} names a function, but hlo sources are files",
                path,
                expected=form,
                hint="remove ':' and what follows",
            )
        elif function is not None and name_problem(function):
            yield self.doc.at(name_problem(function) or "", path, expected=form)
            function = None
        problem = self._file_problem(file, python)
        if problem:
            message, hint = problem
            yield self.doc.at(message, path, expected=form, hint=hint)
        elif python and function is not None:
            yield from self._function(posixpath.normpath(file), function, path)

    def _function(self, file: str, function: str, path: JsonPath) -> Iterator[Diagnostic]:
        """The function must be defined in the file (parsed, not imported)."""
        if file not in self.modules:
            self.modules[file] = module_names(self.manifest.root / file)
        names = self.modules[file]
        if isinstance(names, str):
            yield self.doc.at(
                f"cannot parse {show(file)}: {names}",
                path,
                hint=f"the build imports {file} to find {function!r}",
            )
        elif not names.has(function):
            shown = ", ".join(names.functions[:_LISTED]) or "none"
            yield self.doc.at(
                f"{show(file)} defines no {function!r}",
                path,
                expected=f"a function of {file} (it defines: {shown})",
                hint=did_you_mean(function, list(names.functions) or list(names.names)),
            )

    def _file_problem(self, file: str, python: bool) -> tuple[str, str | None] | None:
        problem = _relative_path_problem(file)
        if problem:
            return problem, "paths are relative to the directory of nkibuild.yaml"
        if python and not file.endswith(".py"):
            return f"{show(file)} is not a Python file", "Python code is read from a .py file"
        relative = posixpath.normpath(file)
        if relative not in self.files:
            self.files[relative] = _existing_file_problem(self.manifest.root, relative)
        return self.files[relative]

    def hlo_inputs_only(self) -> Iterator[Diagnostic]:
        reasons = {
            "constants": "an HloModuleProto has its constants built in",
            "variants": "an HloModuleProto has fixed shapes; declare one kernel per shape",
        }
        for kernel in (k for k in self.manifest.kernels if k.frontend == "hlo"):
            for section, reason in reasons.items():
                path = (*_base(kernel), section)
                if self.written(path) is not _ABSENT:  # even empty: the key is wrong here
                    yield self.doc.at(
                        f"the hlo frontend takes no {section}", path, key=True, hint=reason
                    )

    def nkipy_narrowed_inputs(self) -> Iterator[Diagnostic]:
        """nkipy traces 64-bit inputs as 32-bit: the NEFF would take another dtype than
        the one declared, which the bundle would then refuse at every call."""
        for kernel in (k for k in self.manifest.kernels if k.frontend == "nkipy"):
            for spec in kernel.inputs:
                narrowed = NKIPY_NARROWED.get(spec.dtype)
                if narrowed:
                    yield self.doc.at(
                        f"nkipy traces {spec.dtype} inputs as {narrowed}",
                        (*_base(kernel), "inputs", spec.name, "dtype"),
                        expected=narrowed,
                        hint=f"declare {narrowed}: the traced kernel and its NEFF take {narrowed}",
                    )

    def variant_inputs(self) -> Iterator[Diagnostic]:
        for kernel in self.manifest.kernels:
            inputs = [spec.name for spec in kernel.inputs]
            written = self.written((*_base(kernel), "variants"))
            # The model's variants list declared inputs only: read the names as written.
            for variant, entries in ({} if written is _ABSENT else written).items():
                for input_name in entries:
                    if input_name not in inputs:
                        yield self.doc.at(
                            f"variant {variant!r} names {show(input_name)}, not an input",
                            (*_base(kernel), "variants", variant, input_name),
                            key=True,
                            expected="one of " + ", ".join(inputs),
                            hint=did_you_mean(input_name, inputs),
                        )

    def scalar_inputs(self) -> Iterator[Diagnostic]:
        """spike passes every tensor through np.ascontiguousarray, which makes a 0-d
        array 1-d: a NEFF taking a 0-d input could never be called with it."""
        for kernel in self.manifest.kernels:
            base, paths = _base(kernel), {}
            for variant in kernel.variants:
                for spec in (s for s in variant.inputs if s.shape == ()):
                    restated = (*base, "variants", variant.name, spec.name)
                    declared = (*base, "inputs", spec.name)  # unless the variant restates it
                    paths.setdefault(
                        restated if self.written(restated) is not _ABSENT else declared, spec.name
                    )
            for path, name in paths.items():
                yield self.doc.at(
                    f"input {name!r} is 0-d: the Neuron runtime cannot pass a 0-d tensor",
                    path,
                    expected="a shape of at least one dimension",
                    hint="declare shape [1]: the kernel then takes a one-element array",
                )

    def constant_names(self) -> Iterator[Diagnostic]:
        for kernel in self.manifest.kernels:
            inputs = {spec.name for spec in kernel.inputs}
            for constant, _ in kernel.constants:
                if constant in inputs:
                    yield self.doc.at(
                        f"constant {constant!r} has the name of an input",
                        (*_base(kernel), "constants", constant),
                        key=True,
                        hint="rename one: both are passed to the kernel as keyword arguments",
                    )

    def _targets(self, kernel: Kernel) -> tuple[str, ...]:
        return kernel.targets or self.manifest.default_targets

    def override_targets(self) -> Iterator[Diagnostic]:
        for kernel in self.manifest.kernels:
            targets = self._targets(kernel)
            for target, _ in kernel.overrides:
                if target not in targets:
                    yield self.doc.at(
                        f"override for {target}, which kernel {kernel.name!r} does not target",
                        (*_base(kernel), "overrides", target),
                        key=True,
                        expected="one of the kernel's targets: " + ", ".join(targets),
                        hint=f"add {target} to the targets, or remove this override",
                    )

    def lnc_on_trn1(self) -> Iterator[Diagnostic]:
        offenders: dict[JsonPath, list[str]] = defaultdict(list)
        for kernel in (k for k in self.manifest.kernels if "trn1" in self._targets(k)):
            # The last layer that sets lnc decides: defaults < kernel < overrides.trn1.
            # "auto" is None in the model, so it inherits like an absent key.
            lncs = [
                ((*path, "lnc"), layer.lnc)
                for path, target, layer in self._layers(kernel)
                if target in (None, "trn1") and layer.lnc is not None
            ]
            if lncs and lncs[-1][1] == 2:
                offenders[lncs[-1][0]].append(kernel.name)
        for path, names in offenders.items():
            yield self.doc.at(
                f"lnc 2 on trn1 (for {_kernels_phrase(names)})",
                path,
                expected="lnc auto or 1 on trn1",
                hint="trn1 supports only lnc 1 (neuronx-cc refuses lnc 2 there with NCC_EARG001): "
                "set lnc: 1 under overrides.trn1, or lnc: 2 only under overrides of trn2/trn3",
            )

    def nki_lnc_flags(self) -> Iterator[Diagnostic]:
        """An nki kernel is extracted with its unit's lnc (NEURON_LOGICAL_NC_CONFIG, the
        launch grid) and compiled with `--lnc` of the same: compiler-args must not set
        another (neuronx-cc refuses the mismatch, NCC_EVRF066)."""
        offenders: dict[JsonPath, list[str]] = defaultdict(list)
        for kernel in (k for k in self.manifest.kernels if k.frontend == "nki"):
            for path, _, layer in self._layers(kernel):
                for index, arg in enumerate(layer.compiler_args or ()):
                    if arg.split("=")[0] in LNC_FLAGS:
                        offenders[(*path, "compiler-args", index)].append(kernel.name)
        for path, names in offenders.items():
            yield self.doc.at(
                f"compiler-args set the lnc of {_kernels_phrase(names)} (frontend: nki)",
                path,
                expected="the lnc key",
                hint="set `lnc:` instead: nkibuild extracts an nki kernel with its lnc "
                "(NEURON_LOGICAL_NC_CONFIG) and compiles it with the same --lnc",
            )

    def _layers(self, kernel: Kernel) -> Iterator[tuple[JsonPath, str | None, CompileSettings]]:
        """The kernel's compile settings, bottom layer first, each with its path and, for
        an override, its target."""
        yield ("defaults",), None, self.manifest.defaults
        yield _base(kernel), None, kernel.settings
        for target, layer in kernel.overrides:
            yield (*_base(kernel), "overrides", target), target, layer

    def deps(self) -> Iterator[Diagnostic]:
        for kernel in self.manifest.kernels:
            for index, pattern in enumerate(kernel.deps):
                problem = _relative_path_problem(pattern, dotdot=False)
                if problem:
                    yield self.doc.at(
                        problem,
                        (*_base(kernel), "deps", index),
                        expected="a glob pattern relative to the manifest's directory",
                    )

    def encodable(self) -> Iterator[Diagnostic]:
        """Every string must be writable as UTF-8: YAML's `"\\ud800"` escape gives a lone
        surrogate, which no generated file (METADATA, pyproject.toml, a loader) can hold."""
        for path, text, is_key in _strings(self.doc.data, ()):
            if any("\ud800" <= char <= "\udfff" for char in text):
                yield self.doc.at(
                    f"{show(text)} contains a lone surrogate, which cannot be written as UTF-8",
                    path,
                    key=is_key,
                    hint="write the character itself, or a pair of surrogates as one \\U escape",
                )


def _strings(node: Any, path: JsonPath) -> Iterator[tuple[JsonPath, str, bool]]:
    """(path, string, whether it is a key) for every string in a YAML document."""
    if isinstance(node, str):
        yield path, node, False
    elif isinstance(node, dict):
        for key, value in node.items():
            if isinstance(key, str):
                yield (*path, key), key, True
            yield from _strings(value, (*path, key))
    elif isinstance(node, list):
        for index, item in enumerate(node):
            yield from _strings(item, (*path, index))


def _kernels_phrase(names: Sequence[str]) -> str:
    listed = ", ".join(repr(n) for n in names)
    return f"kernel {listed}" if len(names) == 1 else f"kernels {listed}"


def _relative_path_problem(text: str, *, dotdot: bool = True) -> str | None:
    """Why `text` is not a path (or glob) inside the manifest's directory, or None;
    `dotdot`: whether ".." parts are allowed at all (as long as they stay inside)."""
    if not text:
        return "the path is empty"
    if "\\" in text:
        return f"{show(text)} contains '\\'; use '/' as the separator"
    if PurePosixPath(text).is_absolute() or PureWindowsPath(text).drive:
        return f"{show(text)} is absolute"
    parts = PurePosixPath(text).parts
    if not dotdot and ".." in parts:
        return f"{show(text)} contains '..'"
    normalized = posixpath.normpath(text)
    if normalized == ".." or normalized.startswith("../"):
        return f"{show(text)} points outside the manifest's directory"
    if "\0" in text:
        return f"{show(text)} contains a NUL character"
    return None


def _existing_file_problem(root: Path, relative: str) -> tuple[str, str | None] | None:
    """The check every reader of project files makes (nkibuild.confine), phrased for
    the manifest; a cached plan is reused only while it still passes (context.py)."""
    problem = file_problem(root / relative, (root,))
    if problem is None:
        return None
    if problem.kind == "missing":
        return f"{show(relative)} does not exist", _similar_file(root, relative)
    if problem.kind == "outside":
        return (
            f"{show(relative)} leads outside the manifest's directory through a symlink",
            "copy the file into the project instead of linking to it",
        )
    if problem.kind == "unreadable":  # unrepresentable name, symlink loop, no permission
        return f"cannot access {show(relative)}", None
    return f"{show(relative)} is not a file", None


def _similar_file(root: Path, relative: str) -> str | None:
    parent = posixpath.dirname(relative)
    try:
        siblings = [p.name for p in (root / parent).iterdir() if p.is_file()]
    except (OSError, ValueError):
        return None
    close = difflib.get_close_matches(posixpath.basename(relative), siblings, n=1)
    return f"did you mean {posixpath.join(parent, close[0])!r}?" if close else None
