"""Fuzzing the manifest loader: whatever the file holds, the result is a Manifest or a
ManifestError whose every diagnostic has a position; never another exception.

The default run is short; `pytest -m slow` runs 10,000 examples.
"""

from __future__ import annotations

import copy
import keyword
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nkibuild import dtypes
from nkibuild.errors import ManifestError
from nkibuild.manifest import load_manifest
from nkibuild.manifest.model import AUTO_CAST, AUTO_CAST_TYPES, FRONTENDS, TARGETS, Manifest
from nkibuild.manifest.schemagen import manifest_schema
from nkibuild.plan import resolve

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
EXAMPLE_TEXT = (EXAMPLES / "nkibuild.yaml").read_text(encoding="utf-8")
EXAMPLE_DATA: dict[str, Any] = yaml.safe_load(EXAMPLE_TEXT)

FAST = settings(
    max_examples=100, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
SLOW = settings(
    max_examples=10_000, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One copy of examples/ per module; each example only rewrites nkibuild.yaml."""
    root = tmp_path_factory.mktemp("fuzz") / "project"
    shutil.copytree(EXAMPLES, root, ignore=shutil.ignore_patterns("build", "dist", "__pycache__"))
    return root


def check(project: Path, document: str | bytes) -> None:
    """The property every input must satisfy."""
    path = project / "nkibuild.yaml"
    path.write_bytes(document.encode("utf-8") if isinstance(document, str) else document)
    try:
        manifest = load_manifest(path)
    except ManifestError as error:
        assert error.diagnostics
        for diagnostic in error.diagnostics:
            location = diagnostic.location
            assert location is not None, diagnostic
            assert location.line >= 1 and location.column >= 1, diagnostic
        error.render().encode("utf-8")  # printable: no lone surrogates from the input
        return
    check_model(manifest)


def check_model(manifest: Manifest) -> None:
    assert manifest.kernels and manifest.default_targets
    for kernel in manifest.kernels:
        names = [spec.name for spec in kernel.inputs]
        assert names and kernel.variants
        for variant in kernel.variants:
            assert [spec.name for spec in variant.inputs] == names
            for spec in variant.inputs:
                assert spec.dtype in dtypes.NAMES
                assert all(type(d) is int and d >= 1 for d in spec.shape)
        assert {target for target, _ in kernel.overrides} <= set(
            kernel.targets or manifest.default_targets
        )
    for unit in resolve(manifest):
        # What the loader let through, the compiler accepts: trn1 only runs lnc 1.
        assert unit.lnc == 1 if unit.target == "trn1" else unit.lnc in (1, 2)
        assert all(isinstance(arg, str) for arg in unit.compile_args())


# ------------------------------------------------------------------ strategies

identifiers = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True)
names = st.one_of(
    identifiers,
    st.sampled_from(["class", "None", "__init__", "x", "y", "match", "_", "lhsT", "a b"]),
    st.text(max_size=10),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**6), max_value=10**6),
    st.floats(),
    st.text(max_size=12),
    st.sampled_from(["trn1", "trn2", "auto", "jax", "hlo", "float32", "0.1", "", "kernels/"]),
)
json_values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(names, children, max_size=4)
    ),
    max_leaves=12,
)


def _known_keys() -> list[str]:
    schema = manifest_schema()
    return sorted(
        {key for node in [schema, *schema["$defs"].values()] for key in node.get("properties", {})}
    )


KNOWN_KEYS = _known_keys()
# Copies: a sampled list must not end up in two places (or inside itself) after mutations.
interesting = st.one_of(
    json_values,
    st.sampled_from(
        [
            0, -1, 1, 2, 3, 1.5, True, None, [], {}, [1, 2], [0], "trn1", "trn3", "auto", "hlo",
            "nkipy", "bf16", "matmult", "kernels/jax_kernels.py", "kernels/softmax.hlo.pb",
            "kernels/reference.py:softmax", "kernels/../../x.py:f", "/abs.py:f", "kernels\\a.py:f",
            "kernels/jax_kernels.py:class", "kernels:f", "**/*.py", "../*.py",
        ]
    ),
).map(copy.deepcopy)  # fmt: skip


def dump(data: object) -> str:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


top_level_documents = st.dictionaries(
    st.one_of(st.sampled_from(["format-version", "package", "defaults", "kernels"]), names),
    json_values,
    max_size=5,
)
random_documents = st.one_of(json_values, top_level_documents).map(dump)


def _paths(node: object, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _paths(value, (*path, index))


def _mutate(draw: Callable[..., Any], data: Any) -> Any:
    path = draw(st.sampled_from(list(_paths(data))))
    if not path:
        return draw(interesting)
    parent = data
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    operation = draw(st.sampled_from(["delete", "rename", "replace", "insert", "insert"]))
    if operation == "delete":
        del parent[last]
    elif operation == "replace":
        parent[last] = draw(interesting)
    elif isinstance(parent, dict) and operation == "rename":
        parent[draw(st.one_of(names, st.sampled_from(KNOWN_KEYS)))] = parent.pop(last)
    elif isinstance(parent, dict):
        parent[draw(st.one_of(names, st.sampled_from(KNOWN_KEYS)))] = draw(interesting)
    else:
        parent.insert(last, draw(interesting))
    return data


@st.composite
def mutated_examples(draw: Callable[..., Any]) -> str:
    data = copy.deepcopy(EXAMPLE_DATA)
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        data = _mutate(draw, data)
    return dump(data)


YAML_BITS = [
    ":", ": ", "- ", "{", "}", "[", "]", ",", "&a ", "*a", "*b", "!!str ", "!!binary ", "!tag ",
    "!!python/name:os.system ", "<<: *a\n", "\t", "\n", "\n---\n", "'", '"', "#", "|\n", ">\n",
    "? ", "%YAML 1.1\n", "\\", "\x00", "\ufeff", "\x85", "  ", "~", "0x1F", "1e999", ".nan",
    "2024-01-01", "\u2028", "é", "🙂",
]  # fmt: skip


@st.composite
def mutated_texts(draw: Callable[..., Any]) -> bytes:
    text = EXAMPLE_TEXT
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        start = draw(st.integers(min_value=0, max_value=len(text)))
        end = draw(st.integers(min_value=start, max_value=min(len(text), start + 12)))
        insert = draw(st.one_of(st.sampled_from(YAML_BITS), st.text(max_size=4)))
        text = text[:start] + insert + text[end:]
    raw = text.encode("utf-8", "surrogatepass")
    if draw(st.booleans()):
        return raw
    # Flip a byte: not even UTF-8 anymore, sometimes.
    index = draw(st.integers(min_value=0, max_value=max(0, len(raw) - 1)))
    return raw[:index] + bytes([draw(st.integers(0, 255))]) + raw[index + 1 :]


def _maybe(draw: Callable[..., Any], strategy: st.SearchStrategy[Any]) -> Any:
    return draw(strategy) if draw(st.booleans()) else None


settings_values = {
    "optlevel": st.sampled_from([1, 2, 3, 0]),
    "auto-cast": st.sampled_from([*AUTO_CAST, "bf16"]),
    "auto-cast-type": st.sampled_from([*AUTO_CAST_TYPES, "fp32"]),
    "lnc": st.sampled_from(["auto", 1, 2, 2, 3]),
    "fast-loading": st.booleans(),
    "compiler-args": st.lists(st.text(max_size=6), max_size=2),
}
target_lists = st.lists(st.sampled_from(TARGETS), min_size=1, max_size=3, unique=True)


@st.composite
def compile_settings(draw: Callable[..., Any]) -> dict[str, Any]:
    keys = draw(st.lists(st.sampled_from(sorted(settings_values)), max_size=3, unique=True))
    return {key: draw(settings_values[key]) for key in keys}


shapes = st.lists(st.integers(min_value=0, max_value=2048), max_size=3)
kernel_names = st.one_of(identifiers, st.sampled_from(keyword.kwlist[:5]))
SOURCES = {
    "jax": ["kernels/jax_kernels.py:scaled_add", "kernels/reference.py:softmax", "kernels/x.py:f"],
    "nki": ["kernels/jax_kernels.py:softmax"],
    "nkipy": ["kernels/reference.py:scaled_add"],
    "hlo": ["kernels/softmax.hlo.pb", "kernels/softmax.hlo.pb:f"],
}


@st.composite
def kernels(draw: Callable[..., Any]) -> dict[str, Any]:
    frontend = draw(st.sampled_from(FRONTENDS))
    inputs = draw(
        st.dictionaries(
            identifiers,
            st.fixed_dictionaries(
                {"shape": shapes, "dtype": st.sampled_from([*dtypes.NAMES, "float33"])}
            ),
            min_size=1,
            max_size=2,
        )
    )
    kernel: dict[str, Any] = {
        "frontend": frontend,
        "source": draw(st.sampled_from(SOURCES[frontend])),
        "inputs": inputs,
        **draw(compile_settings()),
    }
    variant_inputs = st.sampled_from([*inputs, "nope"])
    optional = {
        "targets": target_lists,
        "overrides": st.dictionaries(st.sampled_from(TARGETS), compile_settings(), max_size=2),
        "variants": st.dictionaries(
            identifiers, st.dictionaries(variant_inputs, shapes, max_size=2), max_size=2
        ),
        "constants": st.dictionaries(
            identifiers, st.one_of(scalars, st.lists(scalars)), max_size=2
        ),
        "reference": st.sampled_from(["kernels/reference.py:softmax", "kernels/nope.py:f"]),
        "deps": st.lists(st.sampled_from(["kernels/*.py", "**/*", "../x", "/abs"]), max_size=2),
    }
    for key, strategy in optional.items():
        value = _maybe(draw, strategy)
        if value is not None:
            kernel[key] = value
    return kernel


@st.composite
def plausible_manifests(draw: Callable[..., Any]) -> str:
    defaults = draw(compile_settings())
    targets = _maybe(draw, target_lists)
    if targets is not None:
        defaults["targets"] = targets
    data = {
        "format-version": 1,
        "package": {
            "name": draw(st.sampled_from(["demo", "acme-kernels", "1x", "a.b_c", "x-"])),
            "version": draw(st.sampled_from(["0.1.0", "1.0rc1", "one"])),
        },
        "defaults": defaults,
        "kernels": draw(st.dictionaries(kernel_names, kernels(), min_size=1, max_size=2)),
    }
    return dump(data)


any_document = st.one_of(
    random_documents, mutated_examples(), mutated_texts(), plausible_manifests()
)

# ------------------------------------------------------------------------ tests


@FAST
@given(document=random_documents)
def test_random_documents(project: Path, document: str) -> None:
    check(project, document)


@FAST
@given(document=mutated_examples())
def test_mutated_example(project: Path, document: str) -> None:
    check(project, document)


@FAST
@given(document=mutated_texts())
def test_mutated_example_text(project: Path, document: bytes) -> None:
    check(project, document)


@FAST
@given(document=plausible_manifests())
def test_plausible_manifests(project: Path, document: str) -> None:
    check(project, document)


@pytest.mark.slow
@pytest.mark.campaign
@SLOW
@given(document=any_document)
def test_everything_slowly(project: Path, document: str | bytes) -> None:
    check(project, document)
