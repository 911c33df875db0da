"""Generated source run in memory as a module, with its lines kept for tracebacks."""

from __future__ import annotations

import hashlib
import linecache
import sys
import threading
import types

from splitformer import _generated

__all__ = ["load_source"]

#: Held while a module loads: one load at a time.
_LOADING = threading.Lock()


def load_source(source: str, backend: str, name: str) -> types.ModuleType:
    """The module ``splitformer._generated.<backend>.<name>_<digest>`` whose text is ``source``, its lines kept under a
    file name that carries their digest: TorchScript reads a function's source from there, and another scheme of the
    same name derived later must not replace it (``torch.jit.script`` compiled that one's code, silently).

    The module is in ``sys.modules`` under that name: torch.export and torch.compile read the globals of a function
    they inline by importing its module's name. As with an import, the same text loads once per process (a later call
    returns the module loaded first) and stays loaded: some 230 kB a distinct torch module, 140 kB a NumPy one."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    filename = f"<splitformer {backend}/{name}.py {digest}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    module_name = f"{_generated.__name__}.{backend}.{name}_{digest}"
    with _LOADING:  # a second caller of the same text waits for the first one's module, never sees it half run
        loaded = sys.modules.get(module_name)
        if loaded is not None:
            return loaded
        module = types.ModuleType(module_name)
        module.__file__ = filename
        # dont_inherit: this module's `from __future__ import annotations` would turn the annotations into strings,
        # which TorchScript cannot resolve
        exec(compile(source, filename, "exec", dont_inherit=True), module.__dict__)  # noqa: S102 - code generated here
        _packages(module_name)
        sys.modules[module_name] = module  # once it has run: a load that raises leaves nothing
        return module


def _packages(module_name: str) -> None:
    """The packages above ``module_name`` in ``sys.modules`` (empty ones below ``splitformer._generated``): ``pickle``
    imports a class's module by its dotted name, which needs each parent there (``pickle.dumps`` and ``torch.save`` of
    a module's object failed); another process finds none (``splitformer._generated`` says so)."""
    parts = module_name.split(".")
    for depth in range(1, len(parts)):
        name = ".".join(parts[:depth])
        if name not in sys.modules:
            package = types.ModuleType(name, "modules splitformer derived in this process (not on disk)")
            package.__path__ = []
            sys.modules[name] = package
