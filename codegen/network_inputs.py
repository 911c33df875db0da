"""The declared inputs of the generated network modules: what the torch ``Model`` and the NumPy functions take
and how each argument is checked before any work (``templates/inputs.py.j2`` renders signatures and checks).

A wrong type raises a TypeError, a bad value a ValueError, each naming the argument."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, replace

__all__ = ["Input", "signature", "NETWORK_INPUTS", "COSTATES", "declared_inputs", "numpy_functions"]

#: Each kind's check: an expression giving the argument's checked value (``{name}``, ``{least}``, ``{choices}``).
_CHECKS = {
    "int": '_integer("{name}", {name}, {least})',
    "ints": '_integers("{name}", {name}, {least})',
    "pair": '_pair("{name}", {name}, {least})',
    "bool": '_flag("{name}", {name})',
    "eps": "_epsilon({name})",
    "choice": '_choice("{name}", {name}, {choices})',
    "mapping": '_mapping("{name}", {name})',
    "image": '_input("{name}", {name})',
    "stages": "_stage_configs({name})",
    "unread": '_unread("{name}", {name}, {default})',
    "dtype": "_floating({name})",
}


@dataclass(frozen=True)
class Input:
    """One argument: its name, kind (a key of ``_CHECKS``; ``None``: passed on unchecked; ``"unread"``: no
    operator reads it, only its default is taken), the least value of a count, its default (as Python source;
    ``None``: required), whether it is keyword-only."""

    name: str
    kind: str | None = None
    least: int = 1
    default: str | None = None
    keyword: bool = False
    choices: tuple[str, ...] = ()

    @property
    def check(self) -> str | None:
        """The statement that checks the argument and rebinds it to its checked value; ``None``: none."""
        if self.kind is None:
            return None
        choices = "(" + ", ".join(f'"{choice}"' for choice in self.choices) + ")"
        check = _CHECKS[self.kind].format(name=self.name, least=self.least, choices=choices, default=self.default)
        if self.default == "None":
            check = f"None if {self.name} is None else {check}"
        return f"{self.name} = {check}"


def signature(head: str, inputs: list[Input], first: str = "", extra: tuple[str, ...] = (), width: int = 120) -> str:
    """``head(first, inputs…):`` wrapped at ``width`` under the first argument; ``extra`` arguments (``grad_out``,
    ``grad_cls=None``) follow the positional ones, or the keyword ones when they have a default."""
    def spelled(item: Input) -> str:
        return item.name if item.default is None else f"{item.name}={item.default}"

    positional = [first] if first else []
    positional += [spelled(item) for item in inputs if not item.keyword] + [name for name in extra if "=" not in name]
    keywords = [spelled(item) for item in inputs if item.keyword] + [name for name in extra if "=" in name]
    parts = positional + (["*", *keywords] if keywords and any(item.keyword for item in inputs) else keywords)
    return textwrap.fill(", ".join(parts) + "):", width=width, initial_indent=f"{head}(",
                         subsequent_indent=" " * (len(head) + 1), break_on_hyphens=False, break_long_words=False)


def _keywords(*inputs: Input) -> list[Input]:
    return [replace(item, keyword=True) for item in inputs]


_FACTORY = (Input("device", default="None"), Input("dtype", "dtype", default="None"),
            Input("backward", "choice", default='"autograd"', choices=("autograd", "derived")))

#: The declared inputs of each network composition (``NetworkProgram.composition``): ``torch`` (``Model``'s constructor), ``numpy`` (every function's, a
#: costate apart).
NETWORK_INPUTS = {
    "token": {
        "torch": _keywords(*(Input(name, "int", least) for name, least in (
            ("n_layers", 0), ("d_model", 1), ("n_heads", 1), ("d_ff", 1), ("n_channels", 1), ("patch_size", 1))),
            Input("image_size", "pair"), Input("n_classes", "int", 0, "0"), Input("eps", "eps", default="1e-12"),
            *_FACTORY),
        "numpy": [Input("pixel_values", "image"), Input("params", "mapping"),
                  *_keywords(Input("patch_size", "int"), Input("n_heads", "int"), Input("eps", "eps", default="1e-12"),
                             Input("image_size", "pair", default="None"))],
    },
    "grid": {
        "torch": [Input("n_channels", "int"), Input("d", "int"),
                  *_keywords(Input("stride", "int", default="1"), Input("transfer", "bool", default="False"),
                             Input("eps", "eps", default="1e-5"), *_FACTORY)],
        "numpy": [Input("u", "image"), Input("params", "mapping"),
                  *_keywords(Input("stride", "int", default="1"), Input("eps", "eps", default="1e-5"))],
    },
    "cvt": {
        "torch": [Input("n_channels", "int"), *(Input(name, "ints") for name in ("embed_dims", "depths", "d_ffs")),
                  Input("stages", "stages"), Input("n_classes", "int", 0, "0"), Input("eps", "eps", default="1e-5"),
                  *_FACTORY],
        "numpy": [Input("pixel_values", "image"), Input("params", "mapping"),
                  *_keywords(Input("stages", "stages"), Input("eps", "eps", default="1e-5"))],
    },
}


#: The costates each composition's ``vjp`` takes besides its inputs (CvT: its class node's, optional).
COSTATES = {"token": ("grad_out",), "grid": ("grad_out",), "cvt": ("grad_out", "grad_cls=None")}


def numpy_functions(composition: str, head: bool) -> list[str]:
    """The public functions of a composition's NumPy module, each as its one-line signature (``head``: it has a
    readout, so ``logits`` and ``vjp_logits`` too)."""
    inputs = NETWORK_INPUTS[composition]["numpy"]
    heads = [("forward", ()), ("logits", ()), ("vjp", COSTATES[composition]), ("vjp_logits", ("grad_logits",))]
    return [signature(name, inputs, extra=extra, width=1 << 20)[:-1] for name, extra in heads
            if head or "logits" not in name]


def declared_inputs(composition: str, backend: str, reads_stride: bool = True) -> list[Input]:
    """The declared inputs of a network composition in ``backend``: a grid step's ``stride`` takes its default only when no
    operator reads it (``unet-level``, whose network file fixes each convolution's stride), so that another value is
    refused, not ignored."""
    inputs = NETWORK_INPUTS[composition][backend]
    return inputs if reads_stride else [replace(item, kind="unread") if item.name == "stride" else item for item in inputs]
