"""The toolchain value: NEURON_CC_FLAGS as extraction and cache keys see it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from conftest import run_nkibuild
from helpers import softmax_manifest, softmax_project

from nkibuild.toolchain import (
    neuron_cc_flags,
    parse_version_line,
    resolve_toolchain,
    without_cache_dir,
)
from nkibuild.toolchain.worker_pool import WorkerKey, worker_environment


@pytest.mark.parametrize(
    ("flags", "kept", "dropped"),
    [
        ("--cache_dir=/tmp/c --verbose", "--verbose", ["--cache_dir=/tmp/c"]),
        ("--verbose --cache_dir /tmp/c -O2", "--verbose -O2", ["--cache_dir", "/tmp/c"]),
        ("--verbose  -O2", "--verbose  -O2", []),  # untouched, spacing and all
        ("--cache_dir='/tmp/a b' --x", "--x", ["--cache_dir=/tmp/a b"]),
    ],
)
def test_cache_dir_is_taken_out_of_neuron_cc_flags(flags: str, kept: str, dropped: list) -> None:
    assert without_cache_dir(flags) == (kept, dropped)


def test_workers_never_see_cache_dir_and_keys_never_include_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEURON_CC_FLAGS", "--cache_dir=/elsewhere --verbose")
    key = WorkerKey(str(tmp_path), "python", "nki", "trn2")
    env = worker_environment(key, tmp_path / "dumps")
    assert env["NEURON_CC_FLAGS"] == "--verbose"
    assert env["NEURON_COMPILE_CACHE_URL"] == str(tmp_path / "dumps")
    flags, notices = neuron_cc_flags()
    assert flags == "--verbose"
    (notice,) = notices
    assert "--cache_dir=/elsewhere" in notice and "ignored for extraction" in notice
    toolchain = resolve_toolchain("fake")
    assert toolchain.neuron_cc_flags == flags and toolchain.notices == notices


def test_a_build_says_once_that_it_ignores_cache_dir(tmp_path: Path) -> None:
    project = softmax_project(tmp_path / "p", softmax_manifest())
    env = {"NEURON_CC_FLAGS": "--cache_dir=/nowhere"}
    result = run_nkibuild(["build", "--toolchain", "fake"], project, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("warning: NEURON_CC_FLAGS sets --cache_dir=/nowhere") == 1
    key = json.loads((project / "build/compile/softmax/default/trn2/key.json").read_text())
    assert "cache_dir" not in json.dumps(key)


@pytest.mark.parametrize(
    ("line", "version"),
    [
        ("NeuronX Compiler version 2.23.6484.0+3b612583", "2.23.6484.0+3b612583"),
        # Real output can go on after the token; only the token may enter cache keys.
        ("NeuronX Compiler version 2.21.1.0+7d1 (AMI: DLAMI 2024, us-west-2)", "2.21.1.0+7d1"),
        ("NeuronX Compiler version ", None),
        ("Python version 3.10", None),
    ],
)
def test_the_version_is_the_token_after_the_prefix(line: str, version: str | None) -> None:
    assert parse_version_line(line) == version


def write_compiler(venv: Path, version: str) -> Path:
    """A neuronx-cc launcher in a virtualenv layout, with the package's dist-info."""
    launcher = venv / "bin" / "neuronx-cc"
    launcher.parent.mkdir(parents=True, exist_ok=True)
    launcher.write_text(f"#!/bin/sh\necho 'NeuronX Compiler version {version} (extra words)'\n")
    launcher.chmod(0o755)
    record = venv / "lib/python3.11/site-packages/neuronx_cc-2.0.dist-info/RECORD"
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(f"neuronx_cc/__init__.py,{version}\n")
    return launcher


def test_an_upgrade_behind_an_unchanged_launcher_is_noticed(tmp_path: Path) -> None:
    launcher = write_compiler(tmp_path / "venv", "2.1.0.0+aaa")
    first = resolve_toolchain("neuron", compiler=launcher)
    assert first.compiler_version == "2.1.0.0+aaa"
    stat = launcher.stat()
    # The package is upgraded in place; the launcher keeps its bytes and times.
    launcher.write_text(launcher.read_text().replace("2.1.0.0+aaa", "2.2.0.0+bbb"))
    os.utime(launcher, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    record = next((tmp_path / "venv").rglob("RECORD"))
    record.write_text("neuronx_cc/__init__.py,upgraded and longer\n")
    assert resolve_toolchain("neuron", compiler=launcher).compiler_version == "2.2.0.0+bbb"


def test_an_upgrade_behind_a_wrapper_script_is_noticed(tmp_path: Path) -> None:
    # The launcher is a wrapper (no virtualenv beside it): nothing of it changes.
    sdk = write_compiler(tmp_path / "sdk", "2.1.0.0+aaa")
    wrapper = tmp_path / "bin/neuronx-cc"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec {sdk} "$@"\n')
    wrapper.chmod(0o755)
    assert resolve_toolchain("neuron", compiler=wrapper).compiler_version == "2.1.0.0+aaa"
    before = wrapper.stat()
    write_compiler(tmp_path / "sdk", "2.2.0.0+bbb")
    assert (wrapper.stat().st_mtime_ns, wrapper.stat().st_ctime_ns) == (
        before.st_mtime_ns,
        before.st_ctime_ns,
    )
    assert resolve_toolchain("neuron", compiler=wrapper).compiler_version == "2.2.0.0+bbb"


def test_the_compiler_gets_paths_relative_to_its_work_dir(tmp_path: Path) -> None:
    # A real NEFF records its --output path: an absolute one would differ per checkout.
    recorded = tmp_path / "argv.txt"
    wrapper = tmp_path / "bin" / "neuronx-cc"
    wrapper.parent.mkdir()
    wrapper.write_text(
        "#!/bin/sh\n"
        f'echo "$PWD $*" >> {recorded}\n'
        f'exec {sys.executable} -m nkibuild.toolchain_double.fake_neuronxcc "$@"\n'
    )
    wrapper.chmod(0o755)
    project = softmax_project(tmp_path / "p", softmax_manifest(defaults="{targets: [trn2]}"))
    result = run_nkibuild(["build", "--toolchain", "neuron", "--compiler", str(wrapper)], project)
    assert result.returncode == 0, result.stderr
    (compile_line,) = [line for line in recorded.read_text().splitlines() if " compile " in line]
    cwd, _, argv = compile_line.partition(" ")
    assert Path(cwd).parent == project / "build/compile/softmax/default/trn2"
    assert "XLA model.hlo_module.pb --output model.neff --logfile compile.log" in argv
    assert str(tmp_path) not in argv


def test_the_double_fakes_nkipy_only_without_a_real_tracer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nkibuild import toolchain_double

    # PyPI's placeholder `nkipy` (no nkipy.core.trace) does not count as the real one.
    (tmp_path / "nkipy").mkdir()
    (tmp_path / "nkipy" / "__init__.py").write_text("'a placeholder'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "nkipy" or m.startswith("nkipy.")]:
        monkeypatch.delitem(sys.modules, name)
    toolchain = resolve_toolchain("fake")
    assert str(toolchain_double.FAKE_NKIPY_DIR) in toolchain.worker_path


# --- the NKI in use and its extraction route ---------------------------------------------


def installed(site: Path, nki: str | None = None, *packages: str) -> None:
    """A site dir holding an `nki` distribution of version `nki` and bare packages."""
    if nki:
        info = site / f"nki-{nki}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: nki\nVersion: {nki}\n")
    for package in packages:  # "nkipy/core/trace.py": a tracer, "torch_xla/__init__.py"
        (site / package).parent.mkdir(parents=True, exist_ok=True)
        (site / package).write_text("")


@pytest.mark.parametrize(
    ("nki", "packages", "route"),
    [
        ("0.5.0", ["nkipy/__init__.py", "nkipy/core/trace.py"], "nkipy"),
        ("0.7.0", ["nkipy/__init__.py", "nkipy/core/trace.py", "torch_xla/__init__.py"], "nkipy"),
        (
            "0.3.0",
            ["nkipy/__init__.py", "nkipy/core/trace.py", "torch_xla/__init__.py"],
            "torch-xla",
        ),
        ("0.5.0", ["torch_xla/__init__.py"], "torch-xla"),  # no nkipy: torch-xla as before
        ("0.5.0", ["nkipy/__init__.py"], None),  # PyPI's placeholder nkipy has no tracer
        (None, ["torch_xla/__init__.py"], None),  # torch-xla without nki
    ],
)
def test_the_route_is_chosen_by_what_is_installed(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    nki: str | None,
    packages: list,
    route: str | None,
) -> None:
    from nkibuild.toolchain.nki import NkiFrontend, detect

    installed(tmp_path, nki, *packages)
    monkeypatch.setattr(
        sys, "path", [str(tmp_path), *[p for p in sys.path if "site-packages" not in p]]
    )
    for name in [m for m in sys.modules if m.split(".")[0] in ("nkipy", "torch_xla")]:
        monkeypatch.delitem(sys.modules, name)
    assert detect("neuron") == NkiFrontend(nki, route)


@pytest.mark.parametrize(
    ("version", "route", "grid"),
    [("0.2.0", "torch-xla", True), ("0.3.0", "torch-xla", True), ("0.4.0", "nkipy", True),
     ("0.6.0", "nkipy", True), ("0.7.0", "nkipy", False)],
)  # fmt: skip
def test_the_double_reports_the_nki_release_it_imitates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str, route: str, grid: bool
) -> None:
    monkeypatch.setenv("NKIBUILD_FAKE_NKI_VERSION", version)
    nki = resolve_toolchain("fake").nki
    assert (nki.version, nki.route, nki.launch_grid) == (version, route, grid)


def test_doctor_says_which_route_nki_kernels_take(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nkibuild.toolchain.doctor import diagnose, render

    monkeypatch.setenv("NKIBUILD_FAKE_NKI_VERSION", "0.3.0")
    lines = render(diagnose("fake"))
    assert "nki kernels: extracted through torch-xla graph extraction (nki 0.3.0)" in lines
    monkeypatch.setattr(sys, "path", [p for p in sys.path if "site-packages" not in p])
    report = diagnose("auto")["nki_route"]  # this interpreter without its packages: neither
    assert report["route"] is None
    assert "install either" in report["says"] and "nkipy" in report["says"]
    assert "torch-xla" in report["says"]
