"""The emitted modules of a derived program, generated in memory (never written to disk)."""

from __future__ import annotations

from functools import cache
from types import ModuleType

from splitformer.symbolic.derivation import derive
from splitformer.symbolic.program import Program
from splitformer.symbolic.scheme import Scheme
from splitformer.symbolic.stack import final_norm_scheme

from ..lowering import lower
from ..render import render_module

__all__ = ["emitted_modules", "torch_installed", "TORCH_MISSING"]

#: Why a check left the PyTorch module out.
TORCH_MISSING = "torch is not installed (pip install 'splitformer[torch]')"


@cache
def torch_installed() -> bool:
    """Whether ``import torch`` works here (``splitformer check`` runs the NumPy checks either way)."""
    try:
        import torch  # noqa: F401 - only whether it imports
    except ImportError:
        return False
    return True


def emitted_modules(scheme: Scheme, program: Program, backends: tuple[str, ...] | None = None) -> dict:
    """The generated modules of ``program`` by backend, compiled from their source in memory;
    by default NumPy's, and PyTorch's where torch is installed."""
    if backends is None:
        backends = ("numpy", "torch") if torch_installed() else ("numpy",)
    block, final_norm = lower(program), lower(derive(final_norm_scheme()))
    modules = {}
    for backend in backends:
        source = render_module(scheme, block, final_norm, backend)
        module = ModuleType(f"splitformer_emitted_{backend}_{program.name}")
        exec(compile(source, f"<emitted {backend} {program.name}>", "exec"), module.__dict__)  # noqa: S102 - our own output
        modules[backend] = module
    return modules
