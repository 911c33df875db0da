"""timm's modules in the test environment, without torchvision (the project never depends on it).

timm imports torchvision at import time (``torchvision.ops.misc.FrozenBatchNorm2d`` for batch-norm
freezing, ``torchvision.transforms`` and ``torchvision.datasets`` for its data pipeline), none of
which the ViT adapters use; torchvision's wheels are tied to one torch build and the CPU torch
wheel has none to match. While timm is imported, stub modules stand in for those torchvision
modules (every name they are asked for is a placeholder class that cannot be built); they are
removed again at once, so nothing else (transformers) ever sees a torchvision. Where timm cannot
be imported the tests FAIL with the reason, unless ``SPLITFORMER_SKIP_TIMM=1`` opts out (then they
are skipped, loudly, with the same reason).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
import types

import pytest

__all__ = ["import_timm"]

#: The torchvision modules timm imports at import time.
_STUBBED = ("torchvision", "torchvision.ops", "torchvision.ops.misc", "torchvision.transforms",
            "torchvision.transforms.functional", "torchvision.datasets")


def _attribute(owner, name: str):
    """A placeholder for a name a stub is asked for, kept on the stub."""
    if name.startswith("__"):
        raise AttributeError(name)
    value = _placeholder(f"{getattr(owner, '__qualname__', None) or owner.__name__}.{name}")
    setattr(owner, name, value)
    return value


class _Placeholder(type):
    """A torchvision name timm reads at import time: a class (timm subclasses some) whose attributes
    are placeholders too (``InterpolationMode.BICUBIC``) and whose instances cannot be built."""

    __getattr__ = _attribute


def _placeholder(name: str) -> type:
    def refuse(self, *arguments, **options):
        raise RuntimeError(f"torchvision's {name} is a test stub (tests/timm_import.py): torchvision is not installed")

    return _Placeholder(name, (), {"__init__": refuse, "__qualname__": name})


class _StubModule(types.ModuleType):
    __getattr__ = _attribute


def _stubs() -> dict[str, types.ModuleType]:
    modules = {}
    for name in _STUBBED:
        module = _StubModule(name, "a test stub (tests/timm_import.py)")
        module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        module.__path__ = []  # a package whose other submodules are absent (ModuleNotFoundError, as timm expects)
        modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(modules[parent], child, module)
    return modules


def import_timm(module: str = "timm.models.vision_transformer") -> types.ModuleType:
    """Import ``module`` of timm (a stub for torchvision only while importing, where it is absent)."""
    stubs = {} if "torchvision" in sys.modules or importlib.util.find_spec("torchvision") else _stubs()
    sys.modules.update(stubs)
    try:
        return importlib.import_module(module)
    except ImportError as error:
        reason = f"timm cannot be imported ({type(error).__name__}: {error}); install it with `pip install timm`"
        if os.environ.get("SPLITFORMER_SKIP_TIMM") == "1":
            pytest.skip(reason + " [SPLITFORMER_SKIP_TIMM=1]", allow_module_level=True)
        pytest.fail(reason + "; or set SPLITFORMER_SKIP_TIMM=1 to skip the timm tests", pytrace=False)
    finally:
        for name in stubs:
            sys.modules.pop(name, None)
