"""Generated source run in memory as a module, with its lines kept for tracebacks."""

from __future__ import annotations

import hashlib
import linecache
import types

__all__ = ["load_source"]


def load_source(source: str, backend: str, name: str) -> types.ModuleType:
    """The module ``splitformer_generated.<backend>.<name>`` whose text is ``source``, its lines kept under a file name
    that carries their digest: TorchScript reads a function's source from there, and another scheme of the same name
    derived later must not replace it (``torch.jit.script`` compiled that one's code, silently)."""
    filename = f"<splitformer {backend}/{name}.py {hashlib.sha256(source.encode()).hexdigest()[:16]}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    module = types.ModuleType(f"splitformer_generated.{backend}.{name}")
    module.__file__ = filename
    # dont_inherit: this module's `from __future__ import annotations` would turn the annotations into strings,
    # which TorchScript cannot resolve
    exec(compile(source, filename, "exec", dont_inherit=True), module.__dict__)  # noqa: S102 - code generated here
    return module
