"""The emitted modules of a derived program, generated in memory (never written to disk)."""

from __future__ import annotations

from functools import cache
from types import ModuleType

from splitformer.symbolic.adjoint import Adjoint
from splitformer.symbolic.derivation import derive
from splitformer.symbolic.errors import SplitformerError
from splitformer.symbolic.program import Program
from splitformer.symbolic.scheme import Scheme
from splitformer.symbolic.stack import final_norm_scheme

from ..in_memory import load_source
from ..lowering import lower
from ..render import render_module

__all__ = ["emitted_modules", "emitted_with_adjoint", "emitted_with_adjoints", "compiled", "torch_installed",
           "TORCH_MISSING"]

#: Why a check left the PyTorch module out.
TORCH_MISSING = "torch is not installed (pip install 'splitformer[torch]')"


@cache
def torch_installed() -> bool:
    """Whether torch is installed here (``splitformer check`` runs the NumPy checks either way). An installed torch
    that does not import (a library it cannot load, too little memory) is ``SplitformerError`` saying why: pip
    would not mend it."""
    try:
        import torch  # noqa: F401 - only whether it imports
    except ModuleNotFoundError as error:
        if error.name == "torch":
            return False
        raise SplitformerError(f"torch is installed but cannot be imported: {error}") from None
    except Exception as error:  # noqa: BLE001 - ImportError of its library, OSError, MemoryError: said in one line
        raise SplitformerError(f"torch is installed but cannot be imported: {type(error).__name__}: "
                               f"{str(error)[:300]}") from None
    return True


def emitted_modules(scheme: Scheme, program: Program, backends: tuple[str, ...] | None = None) -> dict:
    """The generated modules of ``program`` by backend, compiled from their source in memory;
    by default NumPy's, and PyTorch's where torch is installed."""
    if backends is None:
        backends = ("numpy", "torch") if torch_installed() else ("numpy",)
    block, final_norm = lower(program), lower(derive(final_norm_scheme()))
    return {backend: compiled(render_module(scheme, block, final_norm, backend), backend, program.name)
            for backend in backends}


def emitted_with_adjoint(scheme: Scheme, program: Program, adjoint: Adjoint | None = None,
                         backend: str = "numpy") -> ModuleType:
    """The generated module of ``program`` (NumPy's by default) as ``splitformer derive`` writes it: with its derived
    adjoint (``vjp``; torch's ``Block(backward="derived")``) from ``adjoint``, the program's, when given."""
    return emitted_with_adjoints(scheme, program, adjoint, (backend,))[backend]


def emitted_with_adjoints(scheme: Scheme, program: Program, adjoint: Adjoint | None,
                          backends: tuple[str, ...]) -> dict[str, ModuleType]:
    """``emitted_with_adjoint`` for each of ``backends``, the program and its adjoint lowered once for all."""
    from ..pipeline import lower_backward, lower_scheme

    block, final_norm = lower_scheme(scheme, program)
    backward = lower_backward(scheme, program, adjoint=adjoint)
    return {backend: compiled(render_module(scheme, block, final_norm, backend, *backward), backend, program.name)
            for backend in backends}


def compiled(source: str, backend: str, name: str) -> ModuleType:
    """The module whose source is ``source`` (generated code), executed in memory."""
    return load_source(source, backend, name)
