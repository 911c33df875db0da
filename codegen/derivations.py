"""What every derivation (a scheme's ``Derivation``, a network's ``NetworkDerivation``) shares: its generated
modules loaded in memory, the options of ``write``, and the seal that keeps its fields as they were checked (an edit
in place would reach the emitted code and report unchecked)."""

from __future__ import annotations

import hashlib
import types

from splitformer.symbolic.errors import SplitformerError

from .in_memory import load_source
from .pipeline import BACKEND_CHOICES

__all__ = ["GeneratedModules", "check_passes", "check_write_options"]


class GeneratedModules:
    """The generated modules of a derivation (``source(backend)``), loaded in memory once each, and its seal: the
    fields ``SEALED`` its code and report come from cannot be set once it is checked, and an edit in place (a field
    of its scheme, program or spec) is refused at the next use, where it would reach them unchecked."""

    #: The fields the code and report come from.
    SEALED: tuple[str, ...] = ()

    def numpy_module(self) -> types.ModuleType:
        """The generated NumPy module, in memory (what the file defines: ``forward``, ``PARAMETERS``…)."""
        return self._module("numpy")

    def torch_module(self) -> types.ModuleType:
        """The generated PyTorch module, in memory."""
        return self._module("torch")

    def source(self, backend: str) -> str:
        """The text of the generated ``numpy`` or ``torch`` module."""
        if not isinstance(backend, str) or backend not in ("numpy", "torch"):
            raise SplitformerError(f"unknown backend {str(backend)[:40]!r} (known: numpy, torch)")
        self._unchanged()
        return self._source(backend)

    def _module(self, backend: str) -> types.ModuleType:
        if backend not in self._modules:
            self._modules[backend] = load_source(self.source(backend), backend, self.name)
        return self._modules[backend]

    def _state(self) -> bytes:
        """A digest of the sealed fields by their reprs: dataclass fields, nested ones included (an operator table
        edited in place changes it; a cached property does not)."""
        return hashlib.sha256(repr([getattr(self, name) for name in self.SEALED]).encode()).digest()

    def _seal(self) -> None:
        """Record the state the derivation was checked in; from now on its sealed fields cannot be set."""
        object.__setattr__(self, "_checked_state", self._state())
        object.__setattr__(self, "_sealed", True)

    def _unchanged(self) -> None:
        if self._state() != getattr(self, "_checked_state", None):
            raise SplitformerError(f"the {type(self).__name__} of {self.title!r} was edited in place after it was "
                                   "checked (a field of its scheme, program or spec): derive again")

    def __setattr__(self, name: str, value: object) -> None:
        if name in self.SEALED and getattr(self, "_sealed", False):
            raise SplitformerError(f"{type(self).__name__}.{name} cannot be changed once made (the code and report "
                                   "come from it): derive again, or use dataclasses.replace, which checks the new one")
        super().__setattr__(name, value)


def check_passes(passes: object, where: str) -> None:
    """``SplitformerError`` unless ``passes`` is None (all) or a tuple of passes, the rewrites themselves (functions of
    a ``Module``: ``codegen.passes.PASSES``' values or a user's; ``splitformer.derive`` takes their names)."""
    if passes is not None and (type(passes) is not tuple or not all(callable(rewrite) for rewrite in passes)):
        raise SplitformerError(f"{where}: passes must be None or a tuple of passes (the functions; "
                               f"splitformer.derive takes their names), got {str(passes)[:60]!r}")


def check_write_options(backend: object, force: object) -> None:
    """``write``'s options: a known backend (or ``all``) and a bool ``force``."""
    if not isinstance(backend, str) or backend not in BACKEND_CHOICES:
        raise SplitformerError(f"unknown backend {str(backend)[:40]!r} (known: {', '.join(BACKEND_CHOICES)})")
    if not isinstance(force, bool):
        raise SplitformerError(f"force: expected bool, got {type(force).__name__}")
