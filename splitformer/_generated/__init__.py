"""The package of the modules splitformer derives in memory (``splitformer.codegen.in_memory``): each lives here in the
process that derived it. Another process has none of them, so unpickling an object of one (``torch.load`` of a whole
model saved elsewhere) ends in one error saying how to keep such a model."""

import sys
from importlib.abc import MetaPathFinder

__all__: list[str] = []


class _DerivedElsewhere(MetaPathFinder):
    """Finds no module under this package: it says where they come from instead."""

    def find_spec(self, name, path, target=None):
        if name.startswith(__name__ + "."):
            raise ModuleNotFoundError(
                f"No module named {name!r}: modules splitformer derives in memory live in the process that derived "
                "them (an object saved there reads one), and this process has none: save the model's state_dict "
                "(rebuild the model here, then load it), or write the derived module to a file (Derivation.write) "
                "and import that", name=name)
        return None


if not any(isinstance(finder, _DerivedElsewhere) for finder in sys.meta_path):
    sys.meta_path.append(_DerivedElsewhere())
