"""Which names a scheme may use: they become file names, module names and attributes.

A scheme name becomes ``<name>.py`` and an importable module (``-`` → ``_``); an operator
name becomes an attribute of the emitted ``torch.nn.Module`` and a prefix of the NumPy
locals. Names are matched whole (``re.fullmatch``: ``$`` would accept a trailing newline),
bounded in length, and must not be Python keywords or attributes the module already has.
"""

from __future__ import annotations

import keyword
import re

from .errors import SplitformerError

__all__ = ["IMPORTED_MODULES", "check_scheme_name", "check_operator_name", "check_identifier", "check_line", "check_distinct", "MODULE_ATTRIBUTES",
           "MAX_NAME", "MAX_LINE"]

MAX_NAME = 64
_SCHEME = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
_OPERATOR = re.compile(r"[a-z][a-z0-9_]*")
_IDENTIFIER = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")

#: Attributes of ``torch.nn.Module`` and of the emitted ``Block``/``Stack``/``Model`` (an operator named
#: like one would replace it); tests/test_bad_input.py checks this against torch's own list and the emitted classes.
MODULE_ATTRIBUTES = frozenset({
    "add_module", "apply", "bfloat16", "buffers", "call_super_init", "children", "compile", "cpu", "cuda",
    "double", "dump_patches", "eval", "extra_repr", "float", "forward", "get_buffer", "get_extra_state",
    "get_parameter", "get_submodule", "half", "ipu", "load_state_dict", "modules", "mtia", "named_buffers",
    "named_children", "named_modules", "named_parameters", "parameters", "register_backward_hook",
    "register_buffer", "register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook",
    "register_full_backward_pre_hook", "register_load_state_dict_post_hook", "register_load_state_dict_pre_hook",
    "register_module", "register_parameter", "register_state_dict_post_hook", "register_state_dict_pre_hook",
    "requires_grad_", "set_extra_state", "set_submodule", "share_memory", "state_dict", "to", "to_empty",
    "train", "training", "type", "xpu", "zero_grad",
    # the emitted Block and Stack
    "d_model", "n_heads", "d_ff", "eps", "bias", "layers", "final_norm", "has_final_norm", "load_params",
    "reset_parameters", "n_layers", "dropout", "batch_first", "n_kv_heads", "rope_theta", "backward_mode",
    "n_buckets", "tied",
    # the emitted network Models (ViT, CvT, grid steps)
    "input_shape", "options", "n_channels", "n_classes", "stride", "stages", "logits",
    "smart_apply",  # added to torch.nn.Module once transformers is imported
})


#: The modules the emitted code imports: a generated module of one of these names, run from its own folder, would be
#: imported in its place (``numpy/numpy.py`` importing itself as ``np``).
IMPORTED_MODULES = frozenset({"collections", "math", "numbers", "numpy", "threading", "torch", "warnings", "weakref"})


def check_scheme_name(name: str) -> str:
    """``name`` if it can name a scheme, its files and its module; ``SplitformerError`` otherwise."""
    if type(name) is not str:  # exact: a str subclass can print other text
        raise SplitformerError(f"a scheme name is a str, got {type(name).__name__}")
    if not _SCHEME.fullmatch(name) or len(name) > MAX_NAME:
        raise SplitformerError(f"{_shown(name)} is not a scheme name (lower-case words joined by '-', "
                               f"at most {MAX_NAME} characters)")
    module = name.replace("-", "_")
    if keyword.iskeyword(module):
        raise SplitformerError(f"{name!r} is a Python keyword: its module could not be imported")
    if module in IMPORTED_MODULES:
        raise SplitformerError(f"{name!r} is the name of a module the generated code imports ({module}): its module "
                               "would stand in for it")
    return name


def check_operator_name(name: str) -> str:
    """``name`` if it can name an operator; ``SplitformerError`` naming the clash otherwise."""
    if type(name) is not str:
        raise SplitformerError(f"an operator name is a str, got {type(name).__name__}")
    if not _OPERATOR.fullmatch(name) or len(name) > MAX_NAME:
        raise SplitformerError(f"{_shown(name)} is not an operator name (a lower-case identifier, "
                               f"at most {MAX_NAME} characters)")
    if keyword.iskeyword(name):
        raise SplitformerError(f"operator name {name!r} is a Python keyword")
    if name in MODULE_ATTRIBUTES:
        raise SplitformerError(f"operator name {name!r} clashes with the attribute {name!r} of the emitted "
                               "torch.nn.Module")
    return name


def check_identifier(name: object, what: str) -> str:
    """``name`` if it can stand as a Python identifier in emitted code (not a keyword); else ``SplitformerError``."""
    if type(name) is not str:  # exact: a str subclass can print other text
        raise SplitformerError(f"{what}: a name is a str, got {type(name).__name__}")
    if not _IDENTIFIER.fullmatch(name) or keyword.iskeyword(name):
        raise SplitformerError(f"{what} {name[:MAX_NAME]!r} is not an identifier (ASCII letters, digits, '_', "
                               f"at most {MAX_NAME}, no keyword)")
    return name


def _shown(name: str) -> str:
    """A name for a one-line message: escaped, and cut when long."""
    return repr(name if len(name) <= MAX_NAME else name[:MAX_NAME] + "…")


#: The longest one-line text (a summary, a label) that reaches generated code.
MAX_LINE = 200


def check_line(text: object, what: str) -> str:
    """``text`` if it is one printable line that is safe in a docstring and a report; else ``SplitformerError``.

    Emitted code escapes text on its own (``codegen.render``'s ``doc`` filter); this check keeps
    what a user wrote readable there, the same for a scheme file, a ``Scheme`` object and a plug-in.
    """
    if type(text) is not str:
        raise SplitformerError(f"{what}: expected str, got {type(text).__name__}")
    if len(text) > MAX_LINE or "\n" in text or '"""' in text or "\\" in text or not text.isprintable():
        raise SplitformerError(f"{what}: must be one printable line of at most {MAX_LINE} characters, without "
                               "backslashes or triple quotes")
    return text


def check_distinct(names: list[str], what: str) -> None:
    """``SplitformerError`` when two of ``names`` (of schemes or networks given to ``what``) are one: their results are
    told apart by name (rows and curves, check ids, plot files), so one would silently stand for both."""
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise SplitformerError(f"{what}: a scheme is given twice: {', '.join(twice)} (results are told apart by "
                               "name; rename one)")
