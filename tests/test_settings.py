"""Build options: one table, one resolver (command line > environment > manifest > the
last build's, for commands reading its state > default), shared by the CLI, `nkibuild
release` and the PEP 517 backend."""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path
from typing import get_args

import pytest

from nkibuild.build import project_of
from nkibuild.errors import UsageError
from nkibuild.manifest.model import CacheSettings, Manifest, Package, ToolchainMode
from nkibuild.settings import (
    NO_CACHE,
    OPTIONS,
    BuildOptions,
    BuildSettings,
    config_settings,
    options_from_config,
    parse_flag,
    resolve_settings,
)
from nkibuild.toolchain import TOOLCHAIN_MODES

CACHE = Path("/cache")


def manifest(**values: object) -> Manifest:
    return Manifest(
        path=Path("/p/nkibuild.yaml"),
        format_version=1,
        package=Package("p", "1.0", "p"),
        kernels=(),
        **values,  # type: ignore[arg-type]
    )


def resolve(
    options: BuildOptions, environ: dict[str, str], **manifest_values: object
) -> BuildSettings:
    return resolve_settings(options, manifest(**manifest_values), environ)


def test_every_option_names_a_build_options_field() -> None:
    names = {f.name for f in fields(BuildOptions)}
    assert {option.field for option in OPTIONS} <= names
    assert len(config_settings()) == len(set(config_settings()))


def test_defaults() -> None:
    settings = resolve(BuildOptions(cache_dir=CACHE), {})
    assert settings.toolchain == "auto"
    assert settings.compiler is None
    assert (settings.cache.local_dir, settings.cache.remote_url) == (CACHE, None)
    assert settings.cache.read_only is False
    assert (settings.max_compile_memory, settings.compile_timeout) == (None, None)


def test_compiler_command_line_over_environment_over_manifest() -> None:
    env, from_manifest = {"NKIBUILD_NEURONX_CC": "/env/cc"}, {"compiler_path": Path("/m/cc")}
    cli = BuildOptions(compiler=Path("/cli/cc"))
    assert resolve(cli, env, **from_manifest).compiler == Path("/cli/cc")
    assert resolve(BuildOptions(), env, **from_manifest).compiler == Path("/env/cc")
    assert resolve(BuildOptions(), {"NKIBUILD_NEURONX_CC": ""}, **from_manifest).compiler == (
        Path("/m/cc")
    )


def test_toolchain_command_line_over_environment_over_manifest_over_last_build() -> None:
    last_build = {"toolchain": "neuron"}  # what `explain`, `list` and `verify` pass

    def toolchain(options: BuildOptions, environ: dict[str, str], **values: object) -> str:
        return resolve(replace(options, recorded=last_build), environ, **values).toolchain

    env = {"NKIBUILD_TOOLCHAIN": "auto"}
    assert toolchain(BuildOptions(toolchain="fake"), env, toolchain="neuron") == "fake"
    assert toolchain(BuildOptions(), env, toolchain="fake") == "auto"
    assert toolchain(BuildOptions(), {}, toolchain="fake") == "fake"
    assert toolchain(BuildOptions(), {}) == "neuron"
    assert resolve(BuildOptions(), {}).toolchain == "auto"  # a build records, never reads


def test_manifest_toolchain_modes_are_the_toolchains() -> None:
    # The model spells them out: workers import the toolchain, which must not import it.
    assert get_args(ToolchainMode) == TOOLCHAIN_MODES


def test_remote_cache_command_line_over_environment_over_manifest() -> None:
    env, from_manifest = {"NKIBUILD_REMOTE_CACHE": "s3://env"}, {"cache": CacheSettings("s3://m")}
    cli = BuildOptions(cache_dir=CACHE, remote_cache="s3://cli")
    assert resolve(cli, env, **from_manifest).cache.remote_url == "s3://cli"
    assert resolve(BuildOptions(cache_dir=CACHE), env, **from_manifest).cache.remote_url == (
        "s3://env"
    )
    assert resolve(BuildOptions(cache_dir=CACHE), {}, **from_manifest).cache.remote_url == "s3://m"


def test_read_only_flag_command_line_over_environment_over_manifest() -> None:
    read_only = {"cache": CacheSettings(read_only=True)}
    off = {"NKIBUILD_CACHE_READ_ONLY": "0"}

    def value(options: BuildOptions, environ: dict[str, str], **manifest_values: object) -> bool:
        return resolve(options, environ, **manifest_values).cache.read_only

    assert value(BuildOptions(cache_dir=CACHE, cache_read_only=True), off) is True
    # An explicit "0" in the environment wins over the manifest (the documented order);
    # a flag left off on the command line is "not given".
    assert value(BuildOptions(cache_dir=CACHE), off, **read_only) is False
    assert value(BuildOptions(cache_dir=CACHE), {}, **read_only) is True
    assert value(BuildOptions(cache_dir=CACHE), {"NKIBUILD_CACHE_READ_ONLY": "on"}) is True


def test_environment_values_are_parsed() -> None:
    environ = {
        "NKIBUILD_TOOLCHAIN": "fake",
        "NKIBUILD_CACHE_DIR": "/env-cache",
        "NKIBUILD_MAX_COMPILE_MEMORY": "2G",
        "NKIBUILD_COMPILE_TIMEOUT": "30m",
        "NKIBUILD_CACHE_READ_ONLY": "yes",
    }
    settings = resolve(BuildOptions(), environ)
    assert settings.toolchain == "fake"
    assert settings.cache.local_dir == Path("/env-cache")
    assert settings.max_compile_memory == 2 << 30
    assert settings.compile_timeout == 1800.0
    assert settings.cache.read_only is True


@pytest.mark.parametrize(
    ("variable", "text", "message"),
    [
        (
            "NKIBUILD_MAX_COMPILE_MEMORY",
            "lots",
            "NKIBUILD_MAX_COMPILE_MEMORY: 'lots' is not a size",
        ),
        ("NKIBUILD_COMPILE_TIMEOUT", "soon", "NKIBUILD_COMPILE_TIMEOUT: 'soon' is not a duration"),
        ("NKIBUILD_CACHE_READ_ONLY", "maybe", "NKIBUILD_CACHE_READ_ONLY: expected true or false"),
    ],
)
def test_bad_environment_values_are_usage_errors(variable: str, text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        resolve(BuildOptions(cache_dir=CACHE), {variable: text})


def test_no_cache_and_ray_needs_a_writable_cache() -> None:
    assert resolve(BuildOptions(use_cache=False), {}).cache == NO_CACHE
    with pytest.raises(UsageError, match="writable NEFF cache"):
        resolve(BuildOptions(cache_dir=CACHE, cache_read_only=True, executor="ray"), {})


def test_config_settings_map_onto_build_options() -> None:
    options = options_from_config(
        {
            "toolchain": "fake",
            "compiler": "/opt/cc",
            "cache-dir": "/c",
            "remote-cache": "s3://b/c",
            "cache-read-only": "on",
            "max-compile-memory": "512M",
            "compile-timeout": "90",
        }
    )
    assert options == BuildOptions(
        toolchain="fake",
        compiler=Path("/opt/cc"),
        cache_dir=Path("/c"),
        remote_cache="s3://b/c",
        cache_read_only=True,
        max_compile_memory=512 << 20,
        compile_timeout=90.0,
    )


def test_empty_or_false_config_settings_are_not_given() -> None:
    # So the environment and the manifest still count, as for an absent CLI option.
    options = options_from_config({"toolchain": "", "cache-read-only": "false"})
    assert options == BuildOptions()
    settings = resolve(options, {"NKIBUILD_TOOLCHAIN": "fake"}, cache=CacheSettings(read_only=True))
    assert (settings.toolchain, settings.cache.read_only) == ("fake", True)


def test_bad_config_setting_values() -> None:
    with pytest.raises(UsageError, match=r"config setting cache-read-only='maybe': expected"):
        options_from_config({"cache-read-only": "maybe"})
    with pytest.raises(UsageError, match=r"config setting max-compile-memory='x'"):
        options_from_config({"max-compile-memory": "x"})


def test_backend_knows_every_option_and_refuses_unknown_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    project = project_of({"toolchain": ["neuron", "fake"], "jobs": "3", "compile-timeout": "1h"})
    assert project.options == BuildOptions(toolchain="fake", compile_timeout=3600.0)
    assert (project.jobs, project.manifest, project.build_dir) == (
        3,
        tmp_path / "nkibuild.yaml",
        tmp_path / "build",
    )
    with pytest.raises(UsageError) as raised:
        project_of({"toolchian": "fake"})
    assert "unknown config setting(s) 'toolchian'" in str(raised.value)
    for name in config_settings():
        assert name in str(raised.value)


def test_parse_flag() -> None:
    assert [parse_flag(w) for w in ("1", "TRUE", " yes ", "on")] == [True] * 4
    assert [parse_flag(w) for w in ("", "0", "False", "no", "off")] == [False] * 5
    with pytest.raises(ValueError, match="expected true or false"):
        parse_flag("maybe")
