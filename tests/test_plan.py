"""The resolution rules of `nkibuild.plan.resolve`, one by one, on small manifests."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from helpers import RemovesWhenLoaded, write_project

from nkibuild.compiler import compiler_command
from nkibuild.manifest import load_manifest
from nkibuild.plan import BuildUnit, extract_specs, resolve
from nkibuild.toolchain import Toolchain

FILES: dict[str, bytes | str] = {"k.py": "def f(x):\n    return x\n", "k.pb": b"\x08\x01"}
X = {"shape": [128, 512], "dtype": "float32"}
Y = {"shape": [128, 64], "dtype": "float32"}


def kernel(frontend: str = "jax", extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A kernel entry; `hlo` reads the dummy `k.pb`, the others `k.py:f`."""
    source = "k.pb" if frontend == "hlo" else "k.py:f"
    return {"frontend": frontend, "source": source, "inputs": {"x": X}, **(extra or {})}


def plan(
    tmp_path: Path,
    kernels: Mapping[str, Mapping[str, Any]],
    defaults: Mapping[str, Any] | None = None,
) -> tuple[BuildUnit, ...]:
    """Write a manifest (JSON is YAML) with these kernels and resolve it."""
    doc: dict[str, Any] = {
        "format-version": 1,
        "package": {"name": "plan-test", "version": "1.0"},
        "kernels": dict(kernels),
    }
    if defaults is not None:
        doc["defaults"] = dict(defaults)
    root = write_project(tmp_path / "project", json.dumps(doc, indent=2), FILES)
    return resolve(load_manifest(root / "nkibuild.yaml"))


def names(units: tuple[BuildUnit, ...]) -> list[str]:
    return [unit.name for unit in units]


def by_name(units: tuple[BuildUnit, ...]) -> dict[str, BuildUnit]:
    return {unit.name: unit for unit in units}


# --- targets ---------------------------------------------------------------------------


def test_targets_come_from_defaults(tmp_path: Path) -> None:
    units = plan(tmp_path, {"k": kernel()}, {"targets": ["trn3", "trn1"]})
    assert names(units) == ["k/default/trn3", "k/default/trn1"]
    assert [u.target for u in units] == ["trn3", "trn1"]


def test_kernel_targets_override_default_targets(tmp_path: Path) -> None:
    kernels = {"own": kernel(extra={"targets": ["trn3"]}), "inherits": kernel()}
    units = plan(tmp_path, kernels, {"targets": ["trn1", "trn2"]})
    assert names(units) == ["own/default/trn3", "inherits/default/trn1", "inherits/default/trn2"]


@pytest.mark.parametrize("defaults", [None, {"optlevel": 3}], ids=["no-defaults", "no-targets"])
def test_default_target_is_trn2(tmp_path: Path, defaults: dict[str, Any] | None) -> None:
    units = plan(tmp_path, {"k": kernel()}, defaults)
    assert names(units) == ["k/default/trn2"]


# --- variants --------------------------------------------------------------------------


def test_units_expand_kernel_variant_target_in_manifest_order(tmp_path: Path) -> None:
    kernels = {
        "zeta": kernel(extra={"variants": {"wide": {"x": [128, 1024]}, "narrow": {"x": [128, 8]}}}),
        "alpha": kernel("hlo", {"targets": ["trn3"]}),
    }
    units = plan(tmp_path, kernels, {"targets": ["trn2", "trn1"]})
    assert names(units) == [
        "zeta/wide/trn2",
        "zeta/wide/trn1",
        "zeta/narrow/trn2",
        "zeta/narrow/trn1",
        "alpha/default/trn3",
    ]
    assert [(u.kernel, u.variant, u.target) for u in units][1] == ("zeta", "wide", "trn1")


def test_kernel_without_variants_has_one_variant_named_default(tmp_path: Path) -> None:
    (unit,) = plan(tmp_path, {"k": kernel(extra={"inputs": {"x": X, "y": Y}})})
    assert unit.variant == "default"
    assert unit.extract.variant == "default"
    assert [str(t) for t in unit.extract.inputs] == ["x: float32[128,512]", "y: float32[128,64]"]


def test_variant_shapes_override_base_shapes_and_unnamed_inputs_keep_theirs(
    tmp_path: Path,
) -> None:
    variants = {"big": {"x": [1024, 512]}, "both": {"y": [4, 4], "x": [2, 2]}}
    units = plan(tmp_path, {"k": kernel(extra={"inputs": {"x": X, "y": Y}, "variants": variants})})
    shapes = {u.variant: [(t.name, t.shape) for t in u.extract.inputs] for u in units}
    assert shapes == {
        "big": [("x", (1024, 512)), ("y", (128, 64))],
        # Inputs stay in the kernel's declared order, whatever order the variant names them.
        "both": [("x", (2, 2)), ("y", (4, 4))],
    }


def test_variant_can_override_dtype_alone_or_with_shape(tmp_path: Path) -> None:
    variants = {
        "half": {"x": {"dtype": "bfloat16"}},
        "both": {"x": {"shape": [8, 8], "dtype": "float16"}},
        "same": {"y": [1, 64]},
    }
    units = plan(tmp_path, {"k": kernel(extra={"inputs": {"x": X, "y": Y}, "variants": variants})})
    specs = {u.variant: [str(t) for t in u.extract.inputs] for u in units}
    assert specs == {
        "half": ["x: bfloat16[128,512]", "y: float32[128,64]"],
        "both": ["x: float16[8,8]", "y: float32[128,64]"],
        "same": ["x: float32[128,512]", "y: float32[1,64]"],
    }


# --- lnc -------------------------------------------------------------------------------


@pytest.mark.parametrize("setting", [{}, {"lnc": "auto"}], ids=["absent", "auto"])
def test_lnc_auto_is_1_on_trn1_and_2_on_trn2_and_trn3(
    tmp_path: Path, setting: dict[str, Any]
) -> None:
    units = plan(tmp_path, {"k": kernel()}, {"targets": ["trn1", "trn2", "trn3"], **setting})
    assert {u.target: u.lnc for u in units} == {"trn1": 1, "trn2": 2, "trn3": 2}


def test_explicit_lnc_1_on_trn2(tmp_path: Path) -> None:
    (unit,) = plan(tmp_path, {"k": kernel(extra={"lnc": 1})}, {"targets": ["trn2"]})
    assert unit.lnc == 1
    assert unit.compile_args()[:4] == ["--target", "trn2", "--lnc", "1"]


def test_lnc_auto_on_a_kernel_inherits_the_defaults_number(tmp_path: Path) -> None:
    # The schema: "auto" is the same as leaving the key out; the layer below decides.
    kernels = {"k": kernel(extra={"lnc": "auto", "overrides": {"trn3": {"lnc": "auto"}}})}
    units = plan(tmp_path, kernels, {"targets": ["trn2", "trn3"], "lnc": 1})
    assert {u.target: u.lnc for u in units} == {"trn2": 1, "trn3": 1}


# --- layering: defaults < kernel < per-target override -----------------------------------

# (test id, manifest key, BuildUnit attribute, defaults, kernel and override values). Each
# layer differs from the one it overrides; two-valued settings need two rows for that.
LAYERED = [
    ("optlevel", "optlevel", "optlevel", 1, 3, 2),
    ("auto-cast", "auto-cast", "auto_cast", "matmult", "all", "none"),
    ("auto-cast-type", "auto-cast-type", "auto_cast_type", "fp16", "tf32", "fp8_e4m3"),
    ("lnc-kernel", "lnc", "lnc", 1, 2, 1),
    ("lnc-override", "lnc", "lnc", 2, 2, 1),
    ("fast-loading-kernel", "fast-loading", "fast_loading", True, False, True),
    ("fast-loading-override", "fast-loading", "fast_loading", False, False, True),
    ("compiler-args", "compiler-args", "compiler_args", ["-a"], ["--model-type", "cnn"], []),
]


def _plain(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


@pytest.mark.parametrize(
    ("key", "attribute", "low", "mid", "high"),
    [row[1:] for row in LAYERED],
    ids=[row[0] for row in LAYERED],
)
def test_settings_layer_defaults_then_kernel_then_target_override(
    tmp_path: Path, key: str, attribute: str, low: Any, mid: Any, high: Any
) -> None:
    kernels = {
        "plain": kernel(),
        "kernel_level": kernel(extra={key: mid}),
        "override_only": kernel(extra={"overrides": {"trn3": {key: high}}}),
        "all_layers": kernel(extra={key: mid, "overrides": {"trn3": {key: high}}}),
    }
    units = plan(tmp_path, kernels, {"targets": ["trn2", "trn3"], key: low})
    got = {u.name: getattr(u, attribute) for u in units}
    low, mid, high = _plain(low), _plain(mid), _plain(high)
    assert got == {
        "plain/default/trn2": low,
        "plain/default/trn3": low,
        "kernel_level/default/trn2": mid,
        "kernel_level/default/trn3": mid,
        "override_only/default/trn2": low,
        "override_only/default/trn3": high,
        "all_layers/default/trn2": mid,
        "all_layers/default/trn3": high,
    }


def test_an_override_changes_only_the_key_it_sets(tmp_path: Path) -> None:
    extra = {"optlevel": 3, "auto-cast": "all", "overrides": {"trn3": {"auto-cast-type": "fp16"}}}
    units = by_name(plan(tmp_path, {"k": kernel(extra=extra)}, {"targets": ["trn2", "trn3"]}))
    trn2, trn3 = units["k/default/trn2"], units["k/default/trn3"]
    assert (trn2.optlevel, trn2.auto_cast, trn2.auto_cast_type) == (3, "all", "bf16")
    assert (trn3.optlevel, trn3.auto_cast, trn3.auto_cast_type) == (3, "all", "fp16")


def test_built_in_defaults_when_no_layer_sets_anything(tmp_path: Path) -> None:
    (unit,) = plan(tmp_path, {"k": kernel()})
    settings = (unit.optlevel, unit.auto_cast, unit.auto_cast_type, unit.fast_loading)
    assert settings == (2, "none", "bf16", False)
    assert unit.compiler_args == ()
    assert unit.lnc == 2


# --- compile_args ----------------------------------------------------------------------


def test_compile_args_of_a_plain_trn2_unit(tmp_path: Path) -> None:
    (unit,) = plan(tmp_path, {"k": kernel()})
    assert unit.compile_args() == [
        "--target", "trn2", "--lnc", "2", "--optlevel", "2", "--auto-cast", "none",
    ]  # fmt: skip


def test_compile_args_omit_auto_cast_type_when_auto_cast_is_none(tmp_path: Path) -> None:
    (unit,) = plan(tmp_path, {"k": kernel(extra={"auto-cast-type": "fp16"})})
    assert unit.auto_cast_type == "fp16"
    assert "--auto-cast-type" not in unit.compile_args()


@pytest.mark.parametrize("auto_cast", ["matmult", "all"])
def test_compile_args_add_auto_cast_type_when_auto_casting(tmp_path: Path, auto_cast: str) -> None:
    (unit,) = plan(tmp_path, {"k": kernel(extra={"auto-cast": auto_cast})}, {"targets": ["trn1"]})
    assert unit.compile_args() == [
        "--target", "trn1", "--lnc", "1", "--optlevel", "2",
        "--auto-cast", auto_cast, "--auto-cast-type", "bf16",
    ]  # fmt: skip


def test_compile_args_with_every_setting_and_user_args_last_verbatim(tmp_path: Path) -> None:
    user_args = ["--optlevel", "1", "--internal-flags=a b", "--model-type=transformer", "-O3"]
    extra = {
        "optlevel": 3,
        "auto-cast": "matmult",
        "auto-cast-type": "fp8_e4m3",
        "fast-loading": True,
        "compiler-args": user_args,
    }
    units = plan(tmp_path, {"k": kernel(extra=extra)}, {"targets": ["trn3"], "lnc": 1})
    assert units[0].compile_args() == [
        "--target", "trn3", "--lnc", "1", "--optlevel", "3",
        "--auto-cast", "matmult", "--auto-cast-type", "fp8_e4m3",
        "--enable-fast-loading-neuron-binaries",
        *user_args,
    ]  # fmt: skip


def test_fast_loading_flag_follows_auto_cast_when_auto_cast_is_none(tmp_path: Path) -> None:
    (unit,) = plan(tmp_path, {"k": kernel(extra={"fast-loading": True})})
    assert unit.compile_args()[-3:] == [
        "--auto-cast", "none", "--enable-fast-loading-neuron-binaries",
    ]  # fmt: skip


# --- extraction specs ------------------------------------------------------------------


@pytest.mark.parametrize("frontend", ["jax", "hlo"])
def test_extract_spec_is_shared_by_every_target(tmp_path: Path, frontend: str) -> None:
    units = plan(tmp_path, {"k": kernel(frontend)}, {"targets": ["trn1", "trn2", "trn3"]})
    assert len(units) == 3
    assert all(u.extract.target is None for u in units)
    assert units[0].extract == units[1].extract == units[2].extract
    (spec,) = extract_specs(units)
    assert (spec.name, spec.kernel, spec.variant, spec.frontend) == (
        "k/default",
        "k",
        "default",
        frontend,
    )


def test_extract_specs_are_one_per_variant_in_first_seen_order(tmp_path: Path) -> None:
    kernels = {
        "k": kernel(extra={"variants": {"b": {"x": [8, 8]}, "a": {"x": [4, 4]}}}),
        "h": kernel("hlo"),
    }
    units = plan(tmp_path, kernels, {"targets": ["trn1", "trn2"]})
    specs = extract_specs(units)
    assert [s.name for s in specs] == ["k/b", "k/a", "h/default"]
    assert specs[0].inputs[0].shape == (8, 8)
    assert str(specs[0].source) == "k.py:f"
    assert str(specs[2].source) == "k.pb"


def test_nki_extract_specs_depend_on_the_target(tmp_path: Path) -> None:
    extra = {"variants": {"small": {"x": [8, 8]}, "large": {"x": [64, 64]}}}
    units = plan(tmp_path, {"k": kernel("nki", extra)}, {"targets": ["trn1", "trn2"]})
    assert all(u.extract.target == u.target for u in units)
    assert [u.extract.name for u in units] == names(units)
    specs = extract_specs(units)
    assert [s.name for s in specs] == [
        "k/small/trn1",
        "k/small/trn2",
        "k/large/trn1",
        "k/large/trn2",
    ]


def test_constants_and_deps_reach_the_extract_spec(tmp_path: Path) -> None:
    extra = {"constants": {"alpha": 0.5, "axes": [0, [1, 2]]}, "deps": ["*.py"]}
    (unit,) = plan(tmp_path, {"k": kernel(extra=extra)})
    assert unit.extract.constants == (("alpha", 0.5), ("axes", (0, (1, 2))))
    assert unit.extract.deps == ("*.py",)


# --- JSON ------------------------------------------------------------------------------


def test_unit_to_json_is_serializable_and_complete(tmp_path: Path) -> None:
    extra = {
        "constants": {"alpha": 0.5, "axes": [0, [1, 2]], "mode": "fast"},
        "variants": {"half": {"x": {"dtype": "bfloat16"}}},
        "auto-cast": "all",
        "compiler-args": ["--verbose"],
    }
    units = plan(tmp_path, {"k": kernel(extra=extra)}, {"targets": ["trn1"]})
    data = json.loads(json.dumps(units[0].to_json()))  # no default=: plain JSON types only
    assert data["name"] == "k/half/trn1"
    assert data["compile_args"] == units[0].compile_args()
    assert data["compile_args"][-1] == "--verbose"
    assert data["compiler_args"] == ["--verbose"]
    assert (data["kernel"], data["variant"], data["target"], data["extract"]) == (
        "k",
        "half",
        "trn1",
        "k/half",
    )
    assert (data["frontend"], data["source"], data["lnc"]) == ("jax", "k.py:f", 1)
    assert data["inputs"] == [{"name": "x", "shape": [128, 512], "dtype": "bfloat16"}]
    assert data["constants"] == {"alpha": 0.5, "axes": [0, [1, 2]], "mode": "fast"}


# --- compiler command ------------------------------------------------------------------


def test_compiler_command_order_puts_user_args_last(tmp_path: Path) -> None:
    extra = {"compiler-args": ["--output", "elsewhere.neff", "--verbose"]}
    (unit,) = plan(tmp_path, {"k": kernel(extra=extra)})
    toolchain = Toolchain(
        name="neuron",
        compiler_command=("/opt/neuron/bin/neuronx-cc",),
        compiler_version="2.0.0",
        python=sys.executable,
        neuron_cc_flags="",
    )
    hlo, out, log = Path("/b/model.pb"), Path("/b/model.neff"), Path("/b/compile.log")
    assert compiler_command(unit, toolchain, hlo, out, log) == [
        "/opt/neuron/bin/neuronx-cc",
        "compile", "--framework", "XLA", "/b/model.pb",
        "--output", "/b/model.neff",
        "--logfile", "/b/compile.log",
        "--target", "trn2", "--lnc", "2", "--optlevel", "2", "--auto-cast", "none",
        "--output", "elsewhere.neff", "--verbose",
    ]  # fmt: skip


def test_compiler_command_keeps_a_multi_part_prefix(tmp_path: Path) -> None:
    (unit,) = plan(tmp_path, {"k": kernel()})
    prefix = (sys.executable, "-m", "nkibuild.toolchain_double.fake_neuronxcc")
    toolchain = Toolchain("fake", prefix, "2.23.0.0+nkibuild.fake", sys.executable, "")
    command = compiler_command(unit, toolchain, Path("in.pb"), Path("o.neff"), Path("l.log"))
    assert command[:5] == [*prefix, "compile", "--framework"]
    expected_tail = ["XLA", "in.pb", "--output", "o.neff", "--logfile", "l.log"]
    assert command[5:] == [*expected_tail, *unit.compile_args()]


# --- frontend defaults -------------------------------------------------------------------


def test_nkipy_units_compile_as_nkipy_does(tmp_path: Path) -> None:
    # nkipy's own compile path: --lnc 1 --internal-tensorizer-opt-level=2, on every target.
    units = plan(tmp_path, {"k": kernel("nkipy")}, defaults={"targets": ["trn1", "trn2"]})
    assert [(u.target, u.lnc) for u in units] == [("trn1", 1), ("trn2", 1)]
    assert all(u.compile_args()[-1] == "--internal-tensorizer-opt-level=2" for u in units)
    (jax_unit,) = plan(tmp_path / "j", {"k": kernel("jax")}, defaults={"targets": ["trn2"]})
    assert jax_unit.lnc == 2 and "--internal-tensorizer-opt-level=2" not in jax_unit.compile_args()


def test_a_manifest_overrides_nkipys_defaults(tmp_path: Path) -> None:
    extra = {"lnc": 2, "compiler-args": ["--internal-tensorizer-opt-level=nki", "--verbose"]}
    (unit,) = plan(tmp_path, {"k": kernel("nkipy", extra)}, defaults={"targets": ["trn2"]})
    assert unit.lnc == 2
    args = unit.compile_args()
    assert args[-2:] == ["--internal-tensorizer-opt-level=nki", "--verbose"]
    assert "--internal-tensorizer-opt-level=2" not in args


def test_the_plan_cache_follows_the_home_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`~` in the compiler's path is expanded when the manifest is read: another HOME
    (another user sharing the checkout) must not get the cached expansion."""
    import shutil

    from helpers import EXAMPLE_KERNELS

    from nkibuild.plan import load_plan

    project = write_project(
        tmp_path / "project",
        "format-version: 1\n"
        "package: {name: home-kernels, version: 0.1.0}\n"
        "compiler: {path: ~/sdk/neuronx-cc}\n"
        "kernels:\n"
        "  softmax:\n"
        "    frontend: hlo\n"
        "    source: softmax.hlo.pb\n"
        "    inputs: {logits: {shape: [64, 1024], dtype: float32}}\n",
    )
    shutil.copyfile(EXAMPLE_KERNELS / "softmax.hlo.pb", project / "softmax.hlo.pb")
    state = project / "build" / "state"
    for home in ("alice", "bob", "alice"):
        monkeypatch.setenv("HOME", str(tmp_path / home))
        manifest, _ = load_plan(project / "nkibuild.yaml", state)
        assert manifest.compiler_path == tmp_path / home / "sdk" / "neuronx-cc"


def cached_plan_project(root: Path) -> Path:
    from helpers import softmax_manifest, softmax_project

    return softmax_project(root, softmax_manifest(reference=True))


def test_a_python_file_that_lost_its_function_is_refused_after_a_plan_was_loaded(
    tmp_path: Path,
) -> None:
    from nkibuild.errors import ManifestError
    from nkibuild.plan import load_plan

    project = cached_plan_project(tmp_path / "project")
    state = project / "build" / "state"
    load_plan(project / "nkibuild.yaml", state)
    reference = project / "kernels" / "reference.py"
    reference.write_text(reference.read_text().replace("def softmax(", "def soft_max("))
    with pytest.raises(ManifestError, match="defines no 'softmax'"):
        load_plan(project / "nkibuild.yaml", state)


def test_a_python_file_saved_while_the_manifest_is_validated_is_parsed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Saved after validation parsed it and before the cache took its stat: the cache
    must not vouch for its new text (found by review)."""
    import nkibuild.manifest
    from nkibuild.errors import ManifestError
    from nkibuild.plan import load_plan

    project = cached_plan_project(tmp_path / "project")
    reference = project / "kernels" / "reference.py"
    # The file's last change must lie clearly before the validation below, or the cache
    # would not vouch for it even without the save meanwhile (and the test could not fail).
    while time.time_ns() - reference.stat().st_ctime_ns < 100_000_000:
        time.sleep(0.01)
    load_manifest = nkibuild.manifest.load_manifest

    def saved_meanwhile(path: Path) -> object:
        manifest = load_manifest(path)
        reference.write_text(reference.read_text().replace("def softmax(", "def soft_max("))
        return manifest

    monkeypatch.setattr(nkibuild.manifest, "load_manifest", saved_meanwhile)
    load_plan(project / "nkibuild.yaml", project / "build" / "state")
    monkeypatch.setattr(nkibuild.manifest, "load_manifest", load_manifest)
    with pytest.raises(ManifestError, match="defines no 'softmax'"):
        load_plan(project / "nkibuild.yaml", project / "build" / "state")


def test_a_plan_cache_naming_a_function_is_not_run(tmp_path: Path) -> None:
    """Only the plan's own dataclasses and paths are unpickled: a build dir restored from
    elsewhere cannot run code through the cache, which is then validated anew."""
    import pickle

    from nkibuild.plan import PLAN_CACHE_FILE, load_plan

    project = cached_plan_project(tmp_path / "project")
    state = project / "build" / "state"
    first = load_plan(project / "nkibuild.yaml", state)
    canary = tmp_path / "canary"
    canary.write_text("still here")
    (state / PLAN_CACHE_FILE).write_bytes(pickle.dumps(RemovesWhenLoaded(canary)))
    assert load_plan(project / "nkibuild.yaml", state) == first
    assert canary.exists()


@pytest.mark.parametrize(
    "damage",
    [b"", b"\x80\x05N.", b"garbage", "truncated"],
    ids=["empty", "other-pickle", "garbage", "truncated"],
)
def test_a_damaged_plan_cache_gives_the_plan_of_the_manifest(
    tmp_path: Path, damage: bytes | str
) -> None:
    from nkibuild.plan import PLAN_CACHE_FILE, load_plan

    project = cached_plan_project(tmp_path / "project")
    state = project / "build" / "state"
    first = load_plan(project / "nkibuild.yaml", state)
    cache = state / PLAN_CACHE_FILE
    cache.write_bytes(cache.read_bytes()[:-9] if damage == "truncated" else damage)
    assert load_plan(project / "nkibuild.yaml", state) == first
