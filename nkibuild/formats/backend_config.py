"""File paths inside NKI custom-calls' backend configs (base64 JSON): find and rewrite them.

Pure byte-and-JSON work on an HLO module, shared by the frontends (which relocate the
files an artifact refers to) and by the toolchain double's compiler (which reads
them as neuronx-cc does).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

from nkibuild.formats.hlo import HloFormatError, rewrite_backend_configs
from nkibuild.formats.jsonlimits import JsonLimitError, JsonLimits, JsonSyntaxError, load_json

NKI_CUSTOM_CALLS = frozenset({"AwsNeuronCustomNativeKernel", "AwsNeuronNkiKernel"})
# A config names a kernel and a few files; even one carrying a serialized kernel is
# a few MB. Beyond these bounds decoding is refused, not attempted.
MAX_CONFIG_BYTES = 64 << 20  # base64 text
CONFIG_JSON = JsonLimits(max_bytes=MAX_CONFIG_BYTES, max_depth=64)
_TARGET_BYTES = tuple(name.encode() for name in sorted(NKI_CUSTOM_CALLS))


class BackendConfigError(HloFormatError):
    """A custom-call config that is base64 JSON beyond the bounds nkibuild reads."""


def rewrite_paths(
    data: bytes, wanted: Callable[[str], bool], replace: Callable[[str], str]
) -> bytes:
    """`data` with each string of its NKI custom-calls' configs for which `wanted` holds
    replaced by `replace(string)`; `data` itself when there is nothing to replace."""
    if not names_nki_target(data):
        return data

    def rewrite(target: str, backend_config: bytes) -> bytes | None:
        if target not in NKI_CUSTOM_CALLS:
            return None
        decoded = decode(backend_config)
        if decoded is None:
            return None  # not base64 JSON: nothing nkibuild knows how to relocate
        config, altchars = decoded
        new = map_strings(config, lambda value: replace(value) if wanted(value) else value)
        if new == config:
            return None
        text = json.dumps(new, sort_keys=True, separators=(",", ":")).encode()
        return base64.b64encode(text, altchars=altchars)

    return rewrite_backend_configs(data, rewrite)


def names_nki_target(data: bytes) -> bool:
    """Whether a serialized module may hold an NKI custom-call. One that does spells the
    call's target in its bytes (protobuf stores a string field as its UTF-8 bytes), so a
    module without them has none, and need not be parsed to find out: most modules (plain
    JAX or prebuilt HLO) call no NKI kernel, and each compile materializes its module."""
    if not isinstance(data, (bytes, bytearray)):  # a memoryview has no substring test
        return True
    return any(target in data for target in _TARGET_BYTES)


def decode(backend_config: bytes) -> tuple[Any, bytes | None] | None:
    """(JSON value, base64 altchars) or None when the config is not base64 JSON.

    Raises BackendConfigError for a config too large or too deeply nested to read:
    skipping it would also skip relocating (and confining) the files it names.
    """
    if len(backend_config) > MAX_CONFIG_BYTES:
        raise BackendConfigError(
            f"a custom-call backend_config of {len(backend_config)} bytes "
            f"(at most {MAX_CONFIG_BYTES} are read)"
        )
    altchars = b"-_" if (b"-" in backend_config or b"_" in backend_config) else None
    try:
        text = base64.b64decode(backend_config, altchars=altchars, validate=True)
        return load_json(text, CONFIG_JSON), altchars
    except JsonSyntaxError:
        return None
    except JsonLimitError as error:
        raise BackendConfigError(f"a custom-call backend_config is {error}") from None
    except ValueError:  # binascii.Error: not base64
        return None


def map_strings(value: Any, function: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return function(value)
    if isinstance(value, list):
        return [map_strings(item, function) for item in value]
    if isinstance(value, dict):
        return {key: map_strings(item, function) for key, item in value.items()}
    return value
