"""Checks a `spike` package against spike-api.json (../shared/testdata): the public names
of spike's Python layer and of its native core `spike._spike`, with each function's and
method's parameters (names, kinds, defaults), each class's bases, properties, static and
class methods, and BenchmarkResult's fields.

The check runs in a clean interpreter (`-I`) with the package's directory first on
`sys.path` (None: the installed spike), so nothing of this process is imported there.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CHECK = r"""
import dataclasses, importlib, inspect, json, logging, sys
api_file, runtime, exact = sys.argv[1], sys.argv[2], sys.argv[3] == "exact"
if runtime:
    sys.path.insert(0, runtime)
api = json.load(open(api_file))["modules"]
problems = []
KINDS = {"positional": "POSITIONAL_OR_KEYWORD", "var_positional": "VAR_POSITIONAL",
         "keyword": "KEYWORD_ONLY", "var_keyword": "VAR_KEYWORD"}

def module_named(key):
    # "__init__" is the package; "_spike (native core, from .pyi)" the core.
    name = key.split()[0]
    return importlib.import_module("spike" if name == "__init__" else "spike." + name)

def compare_parameters(where, function, declared):
    try:
        found = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError) as error:
        problems.append(f"{where}: no signature ({error})")
        return
    got = [(p.name, p.kind.name, p.default) for p in found]
    want = [(p["name"], KINDS[p["kind"]],
             eval(p["default"], {"logging": logging}) if "default" in p else inspect._empty)
            for p in declared]
    if got != want:
        problems.append(f"{where}: parameters {got} != {want}")

def compare_member(where, cls, name, member):
    static = inspect.getattr_static(cls, name, None)
    decorators = member.get("decorators", [])
    if "field" in member:
        fields = [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else []
        if name not in fields:
            problems.append(f"{where}: not a dataclass field")
    elif static is None:
        problems.append(f"{where}: missing")
    elif "property" in decorators:
        if not isinstance(static, property):
            problems.append(f"{where}: not a property")
    else:
        for wrapper in (staticmethod, classmethod):
            if (wrapper.__name__ in decorators) != isinstance(static, wrapper):
                problems.append(f"{where}: {wrapper.__name__} mismatch")
        compare_parameters(where, getattr(static, "__func__", static), member["params"])

def compare_class(where, cls, declared):
    bases = [b.__name__ for b in cls.__bases__ if b is not object]
    if bases != declared["bases"]:
        problems.append(f"{where}: bases {bases} != {declared['bases']}")
    for name, member in declared["members"].items():
        compare_member(f"{where}.{name}", cls, name, member)
    if exact:  # nothing public beyond what spike offers
        extra = {n for n in vars(cls) if not n.startswith("_")} - set(declared["members"])
        if extra:
            problems.append(f"{where}: not in spike's API: {sorted(extra)}")

for key, names in api.items():
    module = module_named(key)
    for name, declared in names.items():
        where = f"{module.__name__}.{name}"
        if name == "__all__":
            if sorted(getattr(module, "__all__", [])) != sorted(declared):
                problems.append(f"{where}: {getattr(module, '__all__', None)} != {declared}")
        elif not hasattr(module, name):
            problems.append(f"{where}: missing")
        elif declared["kind"] == "class":
            compare_class(where, getattr(module, name), declared)
        else:
            compare_parameters(where, getattr(module, name), declared["params"])
    if exact:
        own = {n for n, v in vars(module).items() if not n.startswith("_")
               and getattr(v, "__module__", None) == module.__name__}
        extra = own - set(names)
        if extra:
            problems.append(f"{module.__name__}: not in spike's API: {sorted(extra)}")
print(json.dumps(problems))
"""


def api_problems(api: Path, runtime: Path | None, *, exact: bool) -> list[str]:
    """What the spike under `runtime` (None: the installed one) lacks of `api`, and with
    `exact`, what public classes, functions and members it has beyond it."""
    mode = "exact" if exact else "offers"
    result = subprocess.run(
        [sys.executable, "-I", "-c", CHECK, str(api), str(runtime or ""), mode],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)
