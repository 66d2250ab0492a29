"""The NKI a build's frontend workers import, and the route that puts its kernels into an
HLO module for neuronx-cc, chosen once from what is installed (docs/frontends.md):

- `nkipy`: nkipy's NKI op (`nkipy.core.nki_op.wrap_nki_kernel`) compiles the kernel with
  nki >= 0.4 and embeds it, as a custom-call, in a module nkipy traces. Needs no torch.
- `torch-xla`: the kernel runs on XLA tensors with graph extraction on, and the dumped
  module is harvested: Neuron SDK 2.29 (NKI 0.3) and earlier, the last torch-xla releases.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from nkibuild.errors import ManifestError

if TYPE_CHECKING:
    from nkibuild.manifest.model import Manifest

NKIPY_OP_FROM = (0, 4)  # nkipy's NKI op compiles through nki.framework, new in nki 0.4
GRID_UNTIL = (0, 7)  # kernel[lnc] launches before NKI 0.7; from 0.7 NEURON_LOGICAL_NC_CONFIG alone

NO_ROUTE = (
    "this environment cannot put NKI kernels into an HLO module; install either\n"
    "  - nkipy (github.com/aws-neuron/nkipy) with nki >= 0.4 (Neuron SDK 2.30 or later):\n"
    "    nkibuild embeds the kernel through nkipy's NKI op, no torch needed; or\n"
    "  - torch-neuronx with torch-xla and nki (Neuron SDK 2.29 or earlier): nkibuild runs\n"
    "    the kernel on XLA tensors and harvests the extracted graph.\n"
    "  To try nkibuild without them, pass --toolchain fake."
)


@dataclass(frozen=True)
class NkiFrontend:
    version: str | None = None  # of the nki the workers import; None: not installed
    route: str | None = None  # "nkipy", "torch-xla", or None: neither is installed

    @property
    def release(self) -> tuple[int, ...] | None:
        """(major, minor) of `version`, None when unknown."""
        parts = (self.version or "").split("+")[0].split(".")[:2]
        return tuple(map(int, parts)) if all(p.isdigit() for p in parts) and parts else None

    @property
    def launch_grid(self) -> bool:
        """Whether the kernel takes its LNC as `kernel[lnc]` too (NKI before 0.7)."""
        return (self.release or (0,)) < GRID_UNTIL

    def describe(self) -> str:
        how = "nkipy's NKI op" if self.route == "nkipy" else "torch-xla graph extraction"
        return f"nki kernels: extracted through {how} (nki {self.version})"


def detect(mode: str) -> NkiFrontend:
    """What a worker of this interpreter uses under toolchain `mode` (`validate` asks too:
    it resolves no compiler), found without importing anything: with `fake` the double's
    nki (NKIBUILD_FAKE_NKI_VERSION) and its nkipy or torch-xla, else what is installed."""
    from importlib import metadata

    nkipy = has_nkipy_tracer()
    if mode == "fake":
        from nkibuild.toolchain_double import fake_nki_version

        found = NkiFrontend(fake_nki_version())  # a real nkipy's NKI op needs the real nki:
        beta3 = not nkipy and (found.release or ()) >= NKIPY_OP_FROM  # with one, torch-xla
        return NkiFrontend(found.version, "nkipy" if beta3 else "torch-xla")
    try:
        found = NkiFrontend(metadata.version("nki"))
    except metadata.PackageNotFoundError:
        found = NkiFrontend()
    if nkipy and (found.release or ()) >= NKIPY_OP_FROM:
        return NkiFrontend(found.version, "nkipy")
    torch_xla = importlib.util.find_spec("torch_xla") is not None
    return NkiFrontend(found.version, "torch-xla" if torch_xla and found.version else None)


def has_nkipy_tracer() -> bool:
    """Whether an installed `nkipy` has its tracer (PyPI's placeholder has none), found
    without importing it: a no-op build must not pay for a frontend's import."""
    spec = importlib.util.find_spec("nkipy")
    locations = (spec.submodule_search_locations or []) if spec else []
    return any(Path(location, "core", "trace.py").is_file() for location in locations)


def check_manifest(manifest: Manifest, nki: NkiFrontend) -> None:
    """The manifest's NKI kernels against the NKI in use: ManifestError if they cannot build."""
    if not any(kernel.frontend == "nki" for kernel in manifest.kernels):
        return  # nothing to check: a build of other kernels never loads the checks
    from nkibuild.manifest.semantic import nki_diagnostics

    problems = nki_diagnostics(manifest, nki.version, nki.release)
    if problems:
        raise ManifestError(problems)
