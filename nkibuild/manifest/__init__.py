"""The nkibuild.yaml manifest: loading, validation and the typed model.

Importing this package is cheap on purpose (the CLI's --help and the cached
no-op build import it): PyYAML, jsonschema and the validator are imported by
`load_manifest` only.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nkibuild.errors import Location, ManifestError
from nkibuild.manifest.model import (
    AUTO_CAST,
    AUTO_CAST_TYPES,
    DEFAULT_VARIANT,
    FRONTENDS,
    TARGETS,
    CacheSettings,
    CompileSettings,
    Constant,
    Kernel,
    Manifest,
    Package,
    SourceRef,
    TensorSpec,
    Tolerance,
    Variant,
)
from nkibuild.quantities import parse_duration, parse_size

if TYPE_CHECKING:
    from nkibuild.manifest.yamlsource import JsonPath, YamlDocument

__all__ = [
    "AUTO_CAST",
    "AUTO_CAST_TYPES",
    "DEFAULT_SETTINGS",
    "DEFAULT_TARGETS",
    "DEFAULT_VARIANT",
    "FRONTENDS",
    "TARGETS",
    "CacheSettings",
    "CompileSettings",
    "Constant",
    "Kernel",
    "Manifest",
    "ManifestError",
    "Package",
    "SourceRef",
    "TensorSpec",
    "Variant",
    "load_manifest",
]

# What an absent key means; the schema documents the same values as "default"
# (tests keep the two in step).
DEFAULT_TARGETS: tuple[str, ...] = ("trn2",)
DEFAULT_SETTINGS = CompileSettings(
    optlevel=2,
    auto_cast="none",
    auto_cast_type="bf16",
    lnc=None,  # auto: decided per target when the plan is resolved
    fast_loading=False,
    compiler_args=(),
)


def load_manifest(path: str | os.PathLike[str]) -> Manifest:
    """Read, validate and model the manifest at `path`.

    Raises ManifestError carrying every problem found (each with a location).
    """
    from nkibuild.manifest.validate import validate
    from nkibuild.manifest.yamlsource import load_yaml

    absolute = Path(os.path.abspath(path))
    doc, raw = load_yaml(absolute, display=os.fspath(path))
    validate(doc, absolute.parent)
    return _manifest(doc, absolute, hashlib.sha256(raw).hexdigest())


def _manifest(doc: YamlDocument, path: Path, sha256: str) -> Manifest:
    from nkibuild.plan import layer_settings

    data = doc.data
    defaults = data.get("defaults", {})
    return Manifest(
        path=path,
        package=_package(data["package"]),
        default_targets=tuple(defaults.get("targets", DEFAULT_TARGETS)),
        defaults=layer_settings(DEFAULT_SETTINGS, _settings(defaults)),
        kernels=tuple(_kernel(name, kernel, doc) for name, kernel in data["kernels"].items()),
        compiler_path=_compiler_path(data.get("compiler", {}), path.parent),
        cache=CacheSettings(
            remote=data.get("cache", {}).get("remote"),
            read_only=data.get("cache", {}).get("read-only", False),
        ),
        verify=data.get("verify", False),
        sha256=sha256,
    )


def _package(data: Mapping[str, Any]) -> Package:
    from nkibuild.manifest.validate import derived_import_name

    return Package(
        name=data["name"],
        version=data["version"],
        import_name=data.get("import-name") or derived_import_name(data["name"]),
        description=data.get("description", ""),
        license=data.get("license"),
        requires_python=data.get("requires-python", Package.requires_python),
        neuron_sdk=data.get("neuron-sdk"),
        split_targets=data.get("split-targets", False),
    )


def _settings(data: Mapping[str, Any]) -> CompileSettings:
    """The compile settings a mapping sets; None for every key it leaves out."""
    values: dict[str, Any] = {}
    for field in fields(CompileSettings):
        key = field.name.replace("_", "-")
        if key in data:
            values[field.name] = _setting_value(key, data[key])
    return CompileSettings(**values)


def _compiler_path(data: Mapping[str, Any], root: Path) -> Path | None:
    if "path" not in data:
        return None
    return root / Path(data["path"]).expanduser()  # an absolute path replaces root


def _setting_value(key: str, value: Any) -> Any:
    if key == "compile-memory":
        return parse_size(value)
    if key == "compile-timeout":
        return parse_duration(value)
    if key == "lnc":
        return None if value == "auto" else value
    if key == "compiler-args":
        return tuple(value)
    return value


def _kernel(name: str, data: Mapping[str, Any], doc: YamlDocument) -> Kernel:
    base: JsonPath = ("kernels", name)
    inputs = tuple(
        TensorSpec(input_name, tuple(spec["shape"]), spec["dtype"])
        for input_name, spec in data["inputs"].items()
    )
    reference = data.get("reference")
    return Kernel(
        name=name,
        frontend=data["frontend"],
        source=_source(data["source"], doc.location((*base, "source"))),
        inputs=inputs,
        constants=tuple(
            (key, _constant(value)) for key, value in data.get("constants", {}).items()
        ),
        variants=_variants(data.get("variants"), inputs, doc, base),
        targets=tuple(data["targets"]) if "targets" in data else None,
        settings=_settings(data),
        overrides=tuple((t, _settings(layer)) for t, layer in data.get("overrides", {}).items()),
        reference=_source(reference, doc.location((*base, "reference"))) if reference else None,
        deps=tuple(data.get("deps", ())),
        tolerance=Tolerance(**data.get("tolerance", {})),
        location=doc.key_location(base),
    )


def _source(text: str, location: Location) -> SourceRef:
    from nkibuild.manifest.validate import normalize_path, split_source

    path, function = split_source(text)
    return SourceRef(normalize_path(path), function, location)


def _constant(value: Any) -> Constant:
    return tuple(_constant(item) for item in value) if isinstance(value, list) else value


def _variants(
    data: Mapping[str, Any] | None,
    inputs: tuple[TensorSpec, ...],
    doc: YamlDocument,
    base: JsonPath,
) -> tuple[Variant, ...]:
    if data is None:
        return (Variant(DEFAULT_VARIANT, inputs, doc.key_location(base)),)
    return tuple(
        Variant(
            name,
            tuple(_changed(spec, changes.get(spec.name)) for spec in inputs),
            doc.key_location((*base, "variants", name)),
        )
        for name, changes in data.items()
    )


def _changed(spec: TensorSpec, change: list[int] | Mapping[str, Any] | None) -> TensorSpec:
    """An input as a variant sees it: a bare list is a new shape, a mapping a shape/dtype."""
    if change is None:
        return spec
    if isinstance(change, list):
        return replace(spec, shape=tuple(change))
    return replace(
        spec,
        shape=tuple(change.get("shape", spec.shape)),
        dtype=change.get("dtype", spec.dtype),
    )
