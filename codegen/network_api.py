"""The Python API of a derived network (``splitformer.derive("vit")``, or a network file).

``NetworkDerivation`` mirrors ``Derivation`` for networks: the generated modules in memory,
the files ``splitformer derive`` writes, the report and the checks ``splitformer check``
runs on a network::

    import splitformer

    network = splitformer.derive("vit")
    logits = network.numpy_module().logits
"""

from __future__ import annotations

import hashlib
import types
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from splitformer.symbolic.errors import SplitformerError
from splitformer.symbolic.model import NetworkSpec, check_network

from .in_memory import load_source
from .output import as_folder, write_files
from .pipeline import BACKEND_CHOICES, generate_model

__all__ = ["NetworkDerivation", "GeneratedModules", "check_write_options", "sealed_fields", "digest", "check_unchanged", "check_passes"]


class GeneratedModules:
    """The generated modules of a derivation (``source(backend)``), loaded in memory once each."""

    def numpy_module(self) -> types.ModuleType:
        """The generated NumPy module, in memory (what the file defines: ``forward``, ``PARAMETERS``…)."""
        return self._module("numpy")

    def torch_module(self) -> types.ModuleType:
        """The generated PyTorch module, in memory."""
        return self._module("torch")

    def _module(self, backend: str) -> types.ModuleType:
        if backend not in self._modules:
            self._modules[backend] = load_source(self.source(backend), backend, self.name)
        return self._modules[backend]


def check_passes(passes: object, where: str) -> None:
    """``SplitformerError`` unless ``passes`` is None (all) or a tuple of passes, the rewrites themselves (functions of
    a ``Module``: ``codegen.passes.PASSES``' values or a user's; ``splitformer.derive`` takes their names)."""
    if passes is not None and (type(passes) is not tuple or not all(callable(rewrite) for rewrite in passes)):
        raise SplitformerError(f"{where}: passes must be None or a tuple of passes (the functions; "
                               f"splitformer.derive takes their names), got {str(passes)[:60]!r}")


def digest(*values: object) -> bytes:
    """A digest of ``values`` by their reprs: dataclass fields, nested ones included (an operator table edited in place
    changes it; a cached property does not)."""
    return hashlib.sha256(repr(values).encode()).digest()


def check_unchanged(derivation: object, state: bytes, name: str) -> None:
    """``SplitformerError`` unless ``state`` is the digest ``derivation`` was checked with: what it emits comes from
    its fields, and an edit in place would reach the code and report unchecked (a module labelled as one network or
    scheme computing another, or text as code)."""
    if state != getattr(derivation, "_checked_state", None):
        raise SplitformerError(f"the {type(derivation).__name__} of {name!r} was edited in place after it was checked "
                               "(a field of its scheme, program or spec): derive again")


def sealed_fields(derivation: object, name: str, fields: tuple[str, ...]) -> None:
    """``SplitformerError`` when ``name`` is one of ``fields`` of a derivation already checked: its code and report
    come from them, so an edit would reach them unchecked (``dataclasses.replace`` makes a new one, checked)."""
    if name in fields and getattr(derivation, "_sealed", False):
        raise SplitformerError(f"{type(derivation).__name__}.{name} cannot be changed once made (the code and report "
                               "come from it): derive again, or use dataclasses.replace, which checks the new one")


def check_write_options(backend: object, force: object) -> None:
    """``write``'s options: a known backend (or ``all``) and a bool ``force``."""
    if not isinstance(backend, str) or backend not in BACKEND_CHOICES:
        raise SplitformerError(f"unknown backend {str(backend)[:40]!r} (known: {', '.join(BACKEND_CHOICES)})")
    if not isinstance(force, bool):
        raise SplitformerError(f"force: expected bool, got {type(force).__name__}")


@dataclass
class NetworkDerivation(GeneratedModules):
    """A derived network: its generated modules and report."""

    spec: NetworkSpec
    passes: tuple | None = None
    _modules: dict[str, types.ModuleType] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        check_network(self.spec)  # a spec object, however made or edited, is checked as its file is
        check_passes(self.passes, "NetworkDerivation")
        object.__setattr__(self, "_checked_state", digest(self.spec, self.passes))
        object.__setattr__(self, "_sealed", True)

    def _unchanged(self) -> None:
        check_unchanged(self, digest(self.spec, self.passes), self.spec.name)

    def __setattr__(self, name: str, value: object) -> None:
        sealed_fields(self, name, ("spec", "passes"))
        super().__setattr__(name, value)

    @property
    def name(self) -> str:
        """The module name of the generated code (``vit``)."""
        return self.spec.module_name

    @cached_property
    def _files(self) -> dict[Path, str]:
        self._unchanged()
        return generate_model(self.spec, ("numpy", "torch"), Path("."), self.passes)

    @property
    def report(self) -> str:
        """The derivation report (Markdown), as ``splitformer derive`` writes it."""
        self._unchanged()
        return self._files[Path("reports") / f"{self.name}.md"]

    def source(self, backend: str) -> str:
        """The text of the generated ``numpy`` or ``torch`` module."""
        if not isinstance(backend, str) or backend not in ("numpy", "torch"):
            raise SplitformerError(f"unknown backend {str(backend)[:40]!r} (known: numpy, torch)")
        self._unchanged()
        return self._files[Path(backend) / f"{self.name}.py"]

    def write(self, out: str | Path = "generated", backend: str = "all", force: bool = False) -> list[Path]:
        """Write the modules and the report under ``out`` (all or nothing); returns the paths."""
        check_write_options(backend, force)
        self._unchanged()
        out = as_folder(out, "out")
        files = generate_model(self.spec, BACKEND_CHOICES[backend], out, self.passes)
        write_files(files, force=force, root=out)
        return list(files)

    def check(self):
        """The network's checks, as ``splitformer check <network>`` runs them, as a ``CheckReport``."""
        from .verification.runner import network_checks

        self._unchanged()
        return network_checks(self.spec)

    def __repr__(self) -> str:
        return f"<NetworkDerivation of {self.spec.name!r} → {self.name}>"
