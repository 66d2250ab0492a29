"""What nkibuild prints and writes is escaped; numbers and environment values are
checked (issue 15, parts 4 and 5).

Printed text: a NEFF, an HLO module or a log cannot drive the terminal or forge a
line. Written text: METADATA, pyproject.toml and the generated loaders are correct
for every value the schema accepts (hypothesis). Numbers and variables: NaN,
infinity, 400 digits, `~user` paths and bad SOURCE_DATE_EPOCH values are errors that
name the setting, through the real CLI.
"""

from __future__ import annotations

import email.parser
import importlib
import re
import sys
from pathlib import Path

import pytest
from conftest import run_nkibuild
from helpers import softmax_manifest, softmax_project, write_project
from hypothesis import given, settings
from hypothesis import strategies as st
from packaging.specifiers import SpecifierSet

from nkibuild.bundle import codegen
from nkibuild.bundle.wheel import core_metadata
from nkibuild.errors import BuildError, Diagnostic, Location
from nkibuild.manifest.model import Kernel, Package, SourceRef, TensorSpec, Variant
from nkibuild.manifest.semantic import RESERVED_KERNEL_NAMES, name_problem
from nkibuild.text import printable
from nkibuild.toolchain_double.hlo_writer import build_hlo_module
from nkibuild.toolchain_double.neff_writer import NeffTensor, write_neff

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ESC = "\x1b"
# Terminal and line-forging payloads: colours, a title change, clear screen, a bidi
# override, a carriage return over the line, a forged line, NUL and DEL.
PAYLOADS = [
    f"{ESC}[31mred{ESC}[0m",
    f"{ESC}]0;owned\x07",
    f"{ESC}[2J{ESC}[H",
    "evil\u202egnp.exe",
    "ok\rFAKE",
    "x\nerror: forged line",
    "nul\x00del\x7f",
    "c1\x9bcsi",
    "ls\u2028ps\u2029",
]


# What a terminal would interpret, written out here rather than asked of `printable`
# (which would then check itself): C0 but tab and newline, DEL, C1, bidi controls and
# the Unicode line and paragraph separators.
RAW_CONTROL = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]"
)


def no_raw_controls(text: str) -> bool:
    """Only line breaks and tabs may be raw; nothing a terminal would interpret."""
    return RAW_CONTROL.search(text) is None


@pytest.mark.parametrize("payload", PAYLOADS)
def test_printable_escapes_every_payload(payload: str) -> None:
    shown = printable(payload)
    assert "\n" not in shown and no_raw_controls(shown)
    assert printable(shown) == shown  # escaping twice changes nothing more


def test_errors_render_file_derived_text_escaped() -> None:
    payload = "".join(PAYLOADS)
    error = BuildError(
        f"bad {payload}",
        unit="k/v",
        command=["cc", payload],
        log_tail=f"l1 {payload}\nl2\t{ESC}[1m",
    )
    rendered = error.render()
    assert no_raw_controls(rendered) and "\\x1b[31m" in rendered
    # nkibuild's own lines stay; the log keeps one line per line of the log
    assert rendered.splitlines()[0].startswith("k/v: bad ")
    diagnostic = Diagnostic(
        payload, Location(f"m{ESC}.yaml", 1, 2), f"$.{payload}", payload, payload
    )
    assert no_raw_controls(diagnostic.render()) and len(diagnostic.render().splitlines()) == 4


def hostile_neff(path: Path) -> Path:
    write_neff(
        path,
        compiler_version=f"2.23{ESC}[2J\nforged: line",
        inputs=[
            NeffTensor(f"x{ESC}]0;pwn\x07", "float16", (2,)),
            NeffTensor("y\u202egnp", "float16", (2,)),
        ],
        outputs=[NeffTensor("o\nchecksum:   ok", "float16", (2,))],
        num_tpb=1,
        placeholder=False,
        build=f"b{ESC}[31m",
    )
    return path


def test_inspect_escapes_every_field_from_the_file(tmp_path: Path) -> None:
    result = run_nkibuild(["inspect", str(hostile_neff(tmp_path / "m.neff"))], tmp_path)
    assert result.returncode == 0, result.stderr
    assert no_raw_controls(result.stdout)
    lines = result.stdout.splitlines()
    assert len(lines) == 12  # no forged line
    assert "  compiler:   neuronx-cc 2.23\\x1b[2J\\nforged: line" in lines
    assert "    o\\nchecksum:   ok: float16[2]" in lines
    data = run_nkibuild(["inspect", "--json", str(tmp_path / "m.neff")], tmp_path).stdout
    assert data.isascii() and ESC not in data


def test_a_hostile_hlo_parameter_name_is_escaped_in_the_error(tmp_path: Path) -> None:
    name = f"p0{ESC}[2J\nerror: forged"
    module = build_hlo_module("m", [(name, "float32", (4, 8))], [("float32", (4, 8))])
    manifest = (
        "format-version: 1\npackage: {name: hostile, version: 1.0.0}\n"
        "defaults: {targets: [trn2]}\nkernels:\n  k:\n    frontend: hlo\n    source: k.pb\n"
        "    inputs: {x: {shape: [8, 4], dtype: float32}}\n"
    )
    project = write_project(tmp_path / "p", manifest, {"k.pb": module})
    result = run_nkibuild(["build", "--toolchain", "fake"], project, timeout=60)
    assert result.returncode == 1
    assert "HLO parameter 0 (p0\\x1b[2J\\nerror: forged) is float32[4,8]" in result.stderr
    assert no_raw_controls(result.stderr + result.stdout)
    assert not any(line.startswith("error: forged") for line in result.stderr.splitlines())


# Values the schema accepts for free-text fields: any text but lone surrogates (which the
# manifest check refuses: no UTF-8 file can hold them).
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
SPECIFIERS = st.sampled_from([">=3.10", ">=3.10,<4", "~=3.11", "==3.12.*", "!=3.11.1,>=3.9"])
SPACING = st.sampled_from(["", " ", "\n", "\t", "\r\n", " \n "])


METADATA_VALUES = {
    "description": TEXT,
    "license": st.none() | TEXT,
    "requires": SPECIFIERS,
    "neuron_sdk": st.none() | SPECIFIERS,
    "before": SPACING,
    "after": SPACING,
}


def metadata_and_pyproject_hold(
    description: str,
    license: str | None,
    requires: str,
    neuron_sdk: str | None,
    before: str,
    after: str,
) -> None:
    package = Package(
        "demo-kernels",
        "1.0",
        "demo_kernels",
        description=description,
        license=license,
        requires_python=before + requires + after,
        neuron_sdk=None if neuron_sdk is None else before + neuron_sdk + after,
    )
    text = codegen.pyproject(package, ["numpy"], extras={"trn2": ["demo-kernels-trn2"]})
    project = tomllib.loads(text)["project"]  # valid TOML for any Unicode
    assert project["description"] == description
    assert project["requires-python"] == package.requires_python
    assert project.get("license") == (license or None)
    lines = core_metadata(package)
    assert all(no_raw_controls(line) and "\n" not in line for line in lines)
    headers = email.parser.Parser().parsestr("\n".join(lines) + "\n\n")
    expected = ["Metadata-Version", "Name", "Version", "Summary", "Requires-Python"]
    assert headers.keys() == expected + (["License"] if license else [])
    assert headers["Requires-Python"] == str(SpecifierSet(requires))


test_metadata_and_pyproject_hold_any_accepted_value = settings(
    max_examples=300, deadline=None, derandomize=True
)(given(**METADATA_VALUES)(metadata_and_pyproject_hold))
test_metadata_and_pyproject_campaign = pytest.mark.campaign(
    pytest.mark.slow(
        settings(max_examples=10_000, deadline=None, derandomize=True)(
            given(**METADATA_VALUES)(metadata_and_pyproject_hold)
        )
    )
)


# Names the loaders use themselves, builtins they call and stdlib modules they import:
# every one a kernel or an input may legally be called.
SHADOWING = [
    "importlib", "annotations", "builtins", "typing", "TYPE_CHECKING", "Any", "ArrayLike",
    "Kernel", "getattr", "globals", "sorted", "AttributeError", "name", "kernel", "module",
    "str", "list", "dict", "print", "sys", "os", "json",
]  # fmt: skip
IDENTIFIERS = st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,12}", fullmatch=True)


def kernel_names(name: str) -> bool:
    return name_problem(name) is None and name not in RESERVED_KERNEL_NAMES


def input_names(name: str) -> bool:
    return name_problem(name) is None and name != "mode"


STUB_RUNTIME = """
class Kernel:
    def __init__(self, package, name):
        self.name = name
        self.variants = self.targets = self.signature = ()
        self.load = self.benchmark = None
        self.frontend = "jax"

    def __call__(self, *args, mode=None):
        return (self.name, args, mode)
"""


LOADER_NAMES = {
    "kernels": st.lists(
        st.sampled_from(SHADOWING) | IDENTIFIERS, min_size=1, max_size=4, unique=True
    ).map(lambda names: [n for n in names if kernel_names(n)] or ["k"]),
    "inputs": st.lists(
        st.sampled_from([*SHADOWING, "_kernel", "_Kernel", "_x"]) | IDENTIFIERS,
        min_size=1,
        max_size=4,
        unique=True,
    ).map(lambda names: [n for n in names if input_names(n)] or ["x"]),
}


def loaders_work(kernels: list[str], inputs: list[str]) -> None:
    """Generate a bundle package (with a stub runtime), import it, call every kernel."""
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        generate_and_call(Path(directory), kernels, inputs)


def generate_and_call(tmp_path: Path, kernels: list[str], inputs: list[str]) -> None:
    import uuid

    package_name = f"bundle_{uuid.uuid4().hex}"
    specs = tuple(TensorSpec(name, (2,), "float32") for name in inputs)
    source = SourceRef("k.py", "f")
    models = [
        Kernel(name, "jax", source, specs, variants=(Variant("default", specs),))
        for name in kernels
    ]
    package = Package(package_name.replace("_", "-"), "1.0", package_name)
    pkg = tmp_path / package_name
    (pkg / "_kernels").mkdir(parents=True)
    (pkg / "__init__.py").write_text(codegen.package_init(package, models))
    (pkg / "_kernels" / "__init__.py").write_text("")
    (pkg / "_runtime.py").write_text(STUB_RUNTIME)
    for model in models:
        (pkg / "_kernels" / f"{model.name}.py").write_text(
            codegen.kernel_module(package_name, model)
        )
    sys.path.insert(0, str(tmp_path))
    try:
        module = importlib.import_module(package_name)
        for _ in range(2):  # first use loads through __getattr__, then from globals
            for name in kernels:
                args = tuple(range(len(inputs)))
                assert getattr(module, name)(*args) == (name, args, None)
        assert set(kernels) <= set(dir(module))
        with pytest.raises(AttributeError):
            module.not_a_kernel  # noqa: B018
    finally:
        sys.path.remove(str(tmp_path))
        for loaded in [m for m in sys.modules if m.startswith(package_name)]:
            del sys.modules[loaded]


test_generated_loaders_are_immune_to_shadowing_names = settings(
    max_examples=40, deadline=None, derandomize=True
)(given(**LOADER_NAMES)(loaders_work))
test_generated_loaders_campaign = pytest.mark.campaign(
    pytest.mark.slow(
        settings(max_examples=1_000, deadline=None, derandomize=True)(
            given(**LOADER_NAMES)(loaders_work)
        )
    )
)


def test_a_lone_surrogate_is_refused_at_validate_time(tmp_path: Path) -> None:
    manifest = softmax_manifest('{name: s, version: 1.0.0, description: "a \\ud800 b"}')
    project = softmax_project(tmp_path / "p", manifest)
    result = run_nkibuild(["validate"], project)
    assert result.returncode == 2
    assert "nkibuild.yaml:2:" in result.stderr and "lone surrogate" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_requires_python_with_a_newline_gives_valid_metadata(tmp_path: Path) -> None:
    import zipfile

    manifest = softmax_manifest(
        '{name: s, version: 1.0.0, requires-python: ">=3.10\\n", description: "a\\nForged: x"}'
    )
    project = softmax_project(tmp_path / "p", manifest)
    result = run_nkibuild(["build", "--toolchain", "fake"], project, timeout=120)
    assert result.returncode == 0, result.stderr
    (wheel,) = (project / "dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        text = archive.read("s-1.0.0.dist-info/METADATA").decode()
    headers = email.parser.Parser().parsestr(text)
    assert headers["Requires-Python"] == ">=3.10" and headers["Summary"] == "a Forged: x"
    assert headers.get_all("Requires-Dist") == ["numpy"]  # still a header, not the body
    assert headers.get_payload() == ""
    assert "Forged" not in headers


# Part 5: numbers and environment values, through the CLI.
HUGE = "9" * 400

# (`nan`, `inf` and `-5s` in a variable were already refused by the syntax.)
ENV_CASES = [
    ("NKIBUILD_COMPILE_TIMEOUT", HUGE, "is longer than a year"),
    ("NKIBUILD_COMPILE_TIMEOUT", HUGE + "s", "is longer than a year"),
    ("NKIBUILD_COMPILE_TIMEOUT", "400d", "is longer than a year"),
    ("NKIBUILD_MAX_COMPILE_MEMORY", HUGE + "G", "is larger than 1 EiB"),
    ("NKIBUILD_MAX_COMPILE_MEMORY", HUGE, "is larger than 1 EiB"),
    ("NKIBUILD_MAX_COMPILE_MEMORY", "2048000T", "is larger than 1 EiB"),
]


@pytest.mark.parametrize(("variable", "value", "message"), ENV_CASES)
def test_bad_numbers_in_the_environment_name_the_variable(
    tmp_path: Path, variable: str, value: str, message: str
) -> None:
    project = softmax_project(tmp_path / "p", softmax_manifest())
    result = run_nkibuild(["build", "--toolchain", "fake"], project, env={variable: value})
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith(f"{variable}: ") and message in result.stderr
    assert "Traceback" not in result.stderr


OPTION_CASES = [
    ("--compile-timeout", HUGE, "is longer than a year"),
    ("--compile-timeout", HUGE + ".5h", "is longer than a year"),
    ("--max-compile-memory", HUGE + "T", "is larger than 1 EiB"),
    ("--max-compile-memory", HUGE + "KiB", "is larger than 1 EiB"),
]


@pytest.mark.parametrize(("option", "value", "message"), OPTION_CASES)
def test_bad_numbers_on_the_command_line_name_the_option(
    tmp_path: Path, option: str, value: str, message: str
) -> None:
    project = softmax_project(tmp_path / "p", softmax_manifest())
    result = run_nkibuild(["build", "--toolchain", "fake", f"{option}={value}"], project)
    assert result.returncode == 2
    assert f"argument {option}: " in result.stderr and message in result.stderr
    assert "Traceback" not in result.stderr


MANIFEST_CASES = [
    ("compile-timeout: .nan", "nan is not a number"),
    ("compile-timeout: .inf", "inf is not a finite duration"),
    (f"compile-timeout: {HUGE}", "is longer than a year"),
    (f"compile-timeout: '{HUGE}s'", "is longer than a year"),
    (f"compile-memory: '{HUGE}G'", "is larger than 1 EiB"),
    (f"compile-memory: '{HUGE}'", "is larger than 1 EiB"),
    ("compile-timeout: 1.0e+400", "inf is not a finite duration"),  # YAML's float: inf
    ("compile-timeout: .NaN", "nan is not a number"),
]


@pytest.mark.parametrize(("setting", "message"), MANIFEST_CASES)
def test_bad_numbers_in_the_manifest_are_diagnostics(
    tmp_path: Path, setting: str, message: str
) -> None:
    manifest = softmax_manifest(defaults="{targets: [trn2], " + setting + "}")
    project = softmax_project(tmp_path / "p", manifest)
    result = run_nkibuild(["validate"], project)
    assert result.returncode == 2, result.stdout
    assert "nkibuild.yaml:3:" in result.stderr and "Traceback" not in result.stderr
    assert message in result.stderr, result.stderr


def test_a_tilde_user_compiler_path_is_an_error_naming_the_setting(tmp_path: Path) -> None:
    manifest = softmax_manifest(top="compiler: {path: ~nosuchuser-nkibuild/bin/neuronx-cc}")
    project = softmax_project(tmp_path / "p", manifest)
    result = run_nkibuild(["validate"], project)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "nkibuild.yaml:4:" in result.stderr
    assert "no home directory for user 'nosuchuser-nkibuild'" in result.stderr
    project = softmax_project(tmp_path / "q", softmax_manifest())
    for args, env in (
        (["--compiler", "~nosuchuser-nkibuild/neuronx-cc"], {}),
        ([], {"NKIBUILD_NEURONX_CC": "~nosuchuser-nkibuild/neuronx-cc"}),
    ):
        result = run_nkibuild(["build", "--toolchain", "neuron", *args], project, env=env)
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert "its '~' names no user with a home directory" in result.stderr
        assert "NKIBUILD_NEURONX_CC" in result.stderr


def test_a_tilde_compiler_path_is_expanded(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "bin").mkdir(parents=True)
    project = softmax_project(tmp_path / "q", softmax_manifest())
    result = run_nkibuild(
        ["build", "--toolchain", "neuron", "--compiler", "~/bin/neuronx-cc"],
        project,
        env={"HOME": str(home)},
    )
    assert result.returncode == 2
    assert f"the configured neuronx-cc {home}/bin/neuronx-cc is not an executable" in result.stderr


EPOCH_CASES = [
    ("abc", "is not a whole number of seconds"),
    ("1e9", "is not a whole number of seconds"),
    ("-5", "is not a whole number of seconds"),
    ("1700000000.5", "is not a whole number of seconds"),
    ("\u0661\u0662", "is not a whole number of seconds"),  # Arabic-Indic digits: isdigit()
    (HUGE, "is after 2107"),
    ("4354819199", "is after 2107"),
]


def test_bad_source_date_epochs_name_the_variable(tmp_path: Path) -> None:
    project = softmax_project(tmp_path / "p", softmax_manifest())
    assert run_nkibuild(["build", "--toolchain", "fake"], project).returncode == 0
    for value, message in EPOCH_CASES:
        for wheel in (project / "dist").glob("*.whl"):
            wheel.unlink()
        result = run_nkibuild(
            ["build", "--toolchain", "fake", "wheel"], project, env={"SOURCE_DATE_EPOCH": value}
        )
        output = result.stdout + result.stderr
        assert result.returncode == 1, (value, output)
        assert "SOURCE_DATE_EPOCH=" in output and message in output, (value, output)
        assert "Traceback" not in output
    fine = run_nkibuild(
        ["build", "--toolchain", "fake", "wheel"], project, env={"SOURCE_DATE_EPOCH": " 0 "}
    )
    assert fine.returncode == 0, fine.stderr


def test_a_new_source_date_epoch_alone_writes_the_wheel_again(tmp_path: Path) -> None:
    import zipfile

    project = softmax_project(tmp_path / "p", softmax_manifest())
    assert run_nkibuild(["build", "--toolchain", "fake"], project).returncode == 0
    epoch = {"SOURCE_DATE_EPOCH": "1700000000"}  # 2023-11-14 22:13:20 UTC
    again = run_nkibuild(["build", "--toolchain", "fake"], project, env=epoch)
    assert again.returncode == 0, again.stderr
    assert "done   wheel" in again.stdout and "done   bundle" not in again.stdout
    (wheel,) = (project / "dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        assert {info.date_time for info in archive.infolist()} == {(2023, 11, 14, 22, 13, 20)}
    same = run_nkibuild(["build", "--toolchain", "fake"], project, env=epoch)
    assert "0 ran" in same.stdout, same.stdout


def test_an_sdist_refuses_a_bad_source_date_epoch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nkibuild import build as backend

    project = softmax_project(tmp_path / "p", softmax_manifest())
    monkeypatch.chdir(project)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "tomorrow")
    with pytest.raises(backend.BackendError, match="SOURCE_DATE_EPOCH='tomorrow' is not a whole"):
        backend.build_sdist(str(tmp_path / "out"))


@pytest.mark.parametrize("days", ["nan", "-1", "inf", "1e400", "-0.5"])
def test_cache_prune_refuses_a_max_age_that_is_not_a_number_of_days(
    tmp_path: Path, days: str
) -> None:
    """NaN pruned nothing and said so with exit 0; a negative age pruned everything."""
    result = run_nkibuild(
        ["cache", "prune", "--cache-dir", str(tmp_path / "cache"), f"--max-age={days}"], tmp_path
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"argument --max-age: '{days}' is not a number of days from 0 to 36500" in result.stderr


# ------------------------------------------- issue 30 class 4: a bundle call is right


def numpy_dtype(name: str) -> object:
    import ml_dtypes
    import numpy as np

    return getattr(ml_dtypes, name, None) or np.dtype(name)


def cast_is_exact(dtype: str, value: float) -> bool:
    """What NumPy (ml_dtypes for bfloat16 and fp8) makes of `value` in `dtype`: the
    runtime pads with `np.asarray(value).astype(dtype)`. Ints and bool are refused
    when a cast would change the value (NumPy wraps or truncates without a word)."""
    import math
    import warnings

    import numpy as np

    if dtype == "bool" or dtype.startswith(("int", "uint")):
        info = (0, 1) if dtype == "bool" else (np.iinfo(dtype).min, np.iinfo(dtype).max)
        return value.is_integer() and info[0] <= value <= info[1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # overflow to inf is what is being asked
        cast = float(np.asarray(value).astype(numpy_dtype(dtype)))
    return (math.isnan(value) and math.isnan(cast)) or cast == value


DTYPES = [
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "bfloat16", "float8_e5m2", "float8_e4m3fn", "float8_e4m3",
]  # fmt: skip
EDGES = [0.0, -0.0, 1.0, -1.0, 0.5, 0.1, 2.0, 255.0, 256.0, -128.0, -129.0, 127.0, 448.0,
         449.0, 240.0, 57344.0, 65504.0, 65520.0, 2.0**-24, 2.0**-25, 2.0**-9, 2.0**-10,
         2.0**24 + 1, 2.0**31, 2.0**63, 2.0**64, 1e-50, 1e300, float("inf"), float("-inf"),
         float("nan")]  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_pad_value_check_agrees_with_numpy_at_the_edges(dtype: str) -> None:
    from nkibuild.manifest.buckets import holds_exactly

    for value in EDGES:
        assert holds_exactly(dtype, value) == cast_is_exact(dtype, value), value


@settings(max_examples=300, deadline=None, derandomize=True)
@given(dtype=st.sampled_from(DTYPES), value=st.floats(width=64) | st.integers(-(2**70), 2**70))
def test_the_pad_value_check_agrees_with_numpy(dtype: str, value: float | int) -> None:
    from nkibuild.manifest.buckets import holds_exactly

    # YAML ints come as ints; the runtime pads with float(value): one it would round
    # is held by no dtype, nor is one beyond float64's range.
    rounded = isinstance(value, int) and float(value) != value
    exact = not rounded and cast_is_exact(dtype, float(value))
    assert holds_exactly(dtype, value) == exact
    assert not holds_exactly(dtype, 10**400)


def padded_softmax(dtype: str, value: str, variant_dtype: str | None = None) -> str:
    variants = (
        f"    variants:\n      other: {{logits: {{dtype: {variant_dtype}}}}}\n"
        if variant_dtype
        else ""
    )
    manifest = softmax_manifest(
        kernel=f"    padding: {{inputs: {{logits: [1]}}, value: {value}}}\n{variants}"
    )
    return manifest.replace("dtype: float32", f"dtype: {dtype}")


@pytest.mark.parametrize(
    ("dtype", "value", "variant_dtype", "refused"),
    [
        ("int32", "0.5", None, "int32"),
        ("int8", "300", None, "int8"),
        ("uint8", "-1", None, "uint8"),
        ("bool", "2", None, "bool"),
        ("int32", "-.inf", None, "int32"),
        ("int16", ".nan", None, "int16"),
        ("float16", "1.0e+5", None, "float16"),
        ("float32", "0.1", None, "float32"),
        ("float8_e4m3fn", "-.inf", None, "float8_e4m3fn"),
        ("float64", "1" + "0" * 400, None, "float64"),
        ("float32", "-.inf", "int32", "int32"),  # only a variant's dtype cannot
        ("float32", "-.inf", None, None),
        ("float16", "0.5", None, None),
        ("uint8", "255", None, None),
        ("bfloat16", ".nan", None, None),
    ],
)
def test_a_pad_value_an_input_cannot_hold_exactly_is_refused_at_validate(
    tmp_path: Path, dtype: str, value: str, variant_dtype: str | None, refused: str | None
) -> None:
    project = softmax_project(tmp_path / "p", padded_softmax(dtype, value, variant_dtype))
    result = run_nkibuild(["validate"], project)
    assert "Traceback" not in result.stderr
    if refused is None:
        assert result.returncode == 0, result.stderr
        return
    assert result.returncode == 2
    line = (
        project.joinpath("nkibuild.yaml")
        .read_text()
        .splitlines()
        .index(f"    padding: {{inputs: {{logits: [1]}}, value: {value}}}")
    )
    assert f"nkibuild.yaml:{line + 1}:" in result.stderr
    assert f"cannot be held exactly by 'logits' ({refused})" in result.stderr


@pytest.mark.parametrize(
    ("declared", "variants", "at"),
    [
        ("{shape: [], dtype: float32}", "", "      logits: {shape: [], dtype: float32}"),
        ("{shape: [64, 1024], dtype: float32}", "      zero: {logits: []}", "      zero: {"),
        ("{shape: [64, 1024], dtype: float32}", "      zero: {logits: {shape: []}}", "      zero"),
    ],
)
def test_a_0d_input_is_refused_at_validate(
    tmp_path: Path, declared: str, variants: str, at: str
) -> None:
    manifest = softmax_manifest(kernel=f"    variants:\n{variants}\n" if variants else "")
    manifest = manifest.replace("{shape: [64, 1024], dtype: float32}", declared)
    project = softmax_project(tmp_path / "p", manifest)
    result = run_nkibuild(["validate"], project)
    assert result.returncode == 2, result.stderr
    lines = manifest.splitlines()
    line = next(i for i, text in enumerate(lines) if text.startswith(at)) + 1
    assert f"nkibuild.yaml:{line}:" in result.stderr
    assert "input 'logits' is 0-d: the Neuron runtime cannot pass a 0-d tensor" in result.stderr
    assert result.stderr.count("is 0-d") == 1 and "Traceback" not in result.stderr


@pytest.mark.parametrize("order", [">", "<"])
@pytest.mark.parametrize("dtype", ["f2", "f4", "f8", "i2", "i4", "i8", "u2", "u4", "u8"])
def test_arrays_reach_the_device_in_native_byte_order(order: str, dtype: str) -> None:
    import numpy as np

    from nkibuild.bundle.runtime import as_neff_storage

    native = (np.arange(24, dtype=dtype).reshape(4, 6) * 3 + 1).astype(f"={dtype}")
    for array in (native.astype(order + dtype), native.astype(order + dtype).T):
        stored = as_neff_storage(array)
        assert stored.dtype.isnative and stored.dtype.name == native.dtype.name
        # spike copies the buffer's bytes (np.ascontiguousarray): they must be these.
        expected = np.ascontiguousarray(native if array.base is None else native.T)
        assert np.ascontiguousarray(stored).tobytes() == expected.tobytes()


def test_bool_and_fp8_are_still_viewed_as_the_neffs_storage() -> None:
    import ml_dtypes
    import numpy as np

    from nkibuild.bundle.runtime import as_neff_storage

    flags = np.array([True, False, True])
    assert as_neff_storage(flags).dtype == np.uint8
    assert as_neff_storage(flags).tobytes() == flags.tobytes()
    fp8 = np.array([1.0, -2.0], dtype=ml_dtypes.float8_e4m3fn)
    assert as_neff_storage(fp8).dtype == np.int8
    assert as_neff_storage(fp8).tobytes() == fp8.tobytes()


REFERENCE_IMPORTS = {
    "import helpers": {"kernels/helpers.py": "X = 1\n"},
    "from helpers import X": {"kernels/helpers.py": "X = 1\n"},
    "import helpers.deep": {"kernels/helpers/__init__.py": "", "kernels/helpers/deep.py": ""},
    "import util": {"util.py": "X = 1\n"},  # at the project root
    "from . import helpers": {"kernels/helpers.py": "X = 1\n"},
    "from .helpers import X": {},
    "def inner():\n    import helpers": {"kernels/helpers.py": "X = 1\n"},
}


@pytest.mark.parametrize("code", list(REFERENCE_IMPORTS))
def test_a_reference_that_imports_project_files_fails_the_build(tmp_path: Path, code: str) -> None:
    from helpers import build

    reference = (
        "import numpy as np\n"
        f"{code}\n\n\ndef softmax(logits):\n    return np.exp(logits) / np.exp(logits).sum()\n"
    )
    files = {"kernels/reference.py": reference, **REFERENCE_IMPORTS[code]}
    # Listing the helper in `deps` makes the kernel rebuild on it; it is still not shipped.
    manifest = softmax_manifest(reference=True, kernel="    deps: [kernels/*.py, util.py]\n")
    project = softmax_project(tmp_path / "p", manifest, files)
    summary = build(project)
    assert not summary.ok
    (failure,) = summary.failures
    assert failure.name == "bundle"
    line = code.count("\n") + 2
    assert f"kernels/reference.py:{line}: the reference imports " in failure.detail
    assert "which the bundle does not ship with it" in failure.detail
    assert not list((project / "dist").glob("*.whl"))


def test_a_reference_that_no_longer_parses_fails_the_build(tmp_path: Path) -> None:
    project = softmax_project(tmp_path / "p", softmax_manifest(reference=True))
    build = ["build", "bundle", "--toolchain", "fake"]
    assert run_nkibuild(build, project).returncode == 0  # the plan is cached
    shipped = project / "build/bundle/softmax-kernels/softmax_kernels/reference"
    before = (shipped / "kernels_reference.py").read_bytes()
    (project / "kernels/reference.py").write_text("def softmax(x):\n    return x +\n")
    result = run_nkibuild(build, project)
    assert result.returncode != 0
    assert "kernels/reference.py" in result.stderr and "Traceback" not in result.stderr
    assert (shipped / "kernels_reference.py").read_bytes() == before


def test_a_reference_importing_installed_packages_only_is_shipped(tmp_path: Path) -> None:
    from helpers import build, imported_bundle

    reference = (
        "import json\nimport numpy as np\nfrom numpy import exp\n\n\n"
        "def softmax(logits):\n    return exp(logits) / np.exp(logits).sum(-1, keepdims=True)\n"
    )
    files = {"kernels/reference.py": reference, "kernels/helpers.py": "X = 1\n"}
    project = softmax_project(tmp_path / "p", softmax_manifest(reference=True), files)
    assert build(project, "bundle").ok
    import numpy as np

    with imported_bundle(project / "build/bundle/softmax-kernels", "softmax_kernels") as package:
        logits = np.ones((64, 1024), dtype=np.float32)
        result = package.softmax(logits, mode="reference")
    assert np.allclose(result, 1 / 1024)
