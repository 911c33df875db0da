"""Loading a user's own Python file: the explicit step that adds operators, projections, solvers, activations.

Scheme files never execute anything; a kind or a tableau defined in Python becomes usable
by name once its file is loaded (``splitformer derive --load my_kinds.py scheme.toml`` or
``load_plugin("my_kinds.py")``), because importing it runs its ``register_operator`` and
``register_tableau`` calls. Loading the same file again is a no-op.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import sys
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

from sympy.core.cache import clear_cache

from .errors import SplitformerError
from .file_kinds import non_regular_kind
from .activations import ACTIVATIONS
from .kinds import OPERATOR_KINDS
from .tableaux import TABLEAUX

__all__ = ["PluginError", "load_plugin", "load_plugins", "plugin_failures", "plugin_file"]


class PluginError(SplitformerError):
    """A plug-in file that cannot be loaded: ``path`` and ``reason`` apart, so that the command line names
    its ``--load`` option and the Python API its own call."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"plug-in {path}: {reason}")
        self.path, self.reason = path, reason


def _module_name(path: Path) -> str:
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    return f"splitformer_plugin_{re.sub(r'[^0-9a-zA-Z_]', '_', path.stem)}_{digest}"


def plugin_file(registered: type) -> str | None:
    """The plug-in file (``load_plugin``, ``--load``) whose import defined ``registered`` (an operator kind's class);
    ``None`` for the package's own and for classes defined elsewhere."""
    module = sys.modules.get(getattr(registered, "__module__", ""))
    marked = module is not None and getattr(module, "__splitformer_digest__", None) is not None
    return getattr(module, "__file__", None) if marked else None


def load_plugin(path: str | Path) -> ModuleType:
    """Import the Python file ``path`` once; errors become one ``SplitformerError`` line.

    All or nothing: a file that fails part way leaves none of the kinds and tableaux it
    registered before failing.
    """
    if not isinstance(path, (str, os.PathLike)) or isinstance(path, bytes):
        raise SplitformerError(f"load_plugin: expected the path of a .py file (str or pathlib.Path), "
                               f"got {type(path).__name__}")
    if not os.fspath(path):  # Path("") is ".": the message would name the current folder
        raise SplitformerError("plug-in file: empty name (expected a Python file, .py)")
    path = Path(path)
    if path.suffix != ".py":
        raise PluginError(path, "expected a Python file (.py)")
    try:
        if not path.exists():
            raise PluginError(path, "no such file")
        kind = non_regular_kind(path.stat().st_mode)
        if kind is not None:
            raise PluginError(path, f"it is {kind}, not a regular file")
        os.close(os.open(path, os.O_RDONLY))  # readable: else its import would fail with the exception's own text
        resolved = path.resolve()
    except OSError as error:
        raise PluginError(path, error.strerror or str(error)) from None
    name = _module_name(resolved)
    if name in sys.modules:
        loaded = sys.modules[name]
        if getattr(loaded, "__splitformer_digest__", None) not in (None, _digest(resolved)):
            warnings.warn(f"{path}: changed since this process loaded it; the kinds it registered then stay (a process "
                          "loads a plug-in once: load the edit in a new process or kernel)", stacklevel=2)
        return loaded
    spec = importlib.util.spec_from_file_location(name, resolved)
    module = importlib.util.module_from_spec(spec)
    module.__splitformer_digest__ = _digest(resolved)
    kinds, tableaux, activations = dict(OPERATOR_KINDS), dict(TABLEAUX), dict(ACTIVATIONS)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        _check_streams()
    except BaseException as error:
        clear_cache()
        del sys.modules[name]
        _restore(OPERATOR_KINDS, kinds, kept=_project_kinds())
        _restore(TABLEAUX, tableaux)
        _restore(ACTIVATIONS, activations)
        if isinstance(error, SplitformerError):
            raise PluginError(path, str(error)) from None
        if not isinstance(error, KeyboardInterrupt):  # a user's file: any other failure is reported in one line
            raise PluginError(path, f"{type(error).__name__}: {error}") from None
        raise
    clear_cache()  # a symbol the file made may equal the library's own (a str-subclass name): SymPy must not hand it out
    return module


def _digest(path: Path) -> str | None:
    """The SHA-256 of the file's bytes, or None where it cannot be read now."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _check_streams() -> None:
    """``SplitformerError`` if the plug-in closed ``sys.stdout`` or ``sys.stderr`` (reopened, to report it)."""
    for stream_name, descriptor in (("stdout", 1), ("stderr", 2)):
        if getattr(getattr(sys, stream_name), "closed", False):
            setattr(sys, stream_name, open(descriptor, "w", closefd=False, errors="backslashreplace"))
            raise SplitformerError(f"the plug-in closed sys.{stream_name}")


def _project_kinds() -> dict:
    """The kinds splitformer's own modules registered: a plug-in that fails after importing one of
    them for the first time (the vision kinds register on import) must not take them away."""
    return {kind: cls for kind, cls in OPERATOR_KINDS.items()
            if getattr(cls, "__module__", "").startswith("splitformer.")}


def _restore(registry: dict, saved: dict, kept: dict | None = None) -> None:
    """Put ``registry`` back to ``saved`` and ``kept`` (in place: other modules hold the same dict)."""
    registry.clear()
    registry.update(saved)
    registry.update(kept or {})


def load_plugins(paths: Iterable[str | Path]) -> list[ModuleType]:
    """``load_plugin`` for each path, in order."""
    return [load_plugin(path) for path in paths]


@contextmanager
def plugin_failures(scheme) -> Iterator[None]:
    """Turn an error that a plug-in kind of ``scheme`` causes while it is derived or emitted into one line.

    Operator kinds of the package are trusted (their errors are bugs and keep their traceback);
    a scheme using a user's kind gets ``SplitformerError`` naming the kind and the error.
    """
    try:
        yield
    except SplitformerError:
        raise
    except (Exception, SystemExit) as error:  # noqa: BLE001 - a user's code (sys.exit too: it ended a run with status 0)
        kinds = sorted({kind for kind in scheme.operators.values()
                        if not getattr(OPERATOR_KINDS.get(kind), "__module__", "splitformer.").startswith("splitformer.")})
        if not kinds:
            raise
        which = f"the plug-in kind {kinds[0]!r}" if len(kinds) == 1 else \
            f"one of the plug-in kinds {', '.join(map(repr, kinds))}"  # the error does not say which
        text = " ".join(str(error).split())  # SymPy's messages begin with a new line
        raise SplitformerError(f"scheme {scheme.name!r}: {which} cannot be derived: {type(error).__name__}: "
                               f"{text[:120]}") from None
