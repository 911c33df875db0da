"""Is a source module what its class name says? Adapters read parameters and configuration, so
they refuse a module whose computation those do not describe.

Refused, each in one line naming the (sub)module: forward, forward-pre, backward and
backward-pre hooks (the module's own or torch's global ones); a class outside torch,
transformers, timm and x-transformers (with its einops helpers) that overrides a method of the library class it derives from (its
``forward`` or any helper the forward calls), or any method replaced on the instance (``forward``,
``_sa_block``, ``feed_forward_chunk``); a transformers attention dispatched (``config._attn_implementation``)
to a function other than the built-in eager or sdpa one;
parameters and buffers whose class is not exactly ``torch.nn.Parameter`` or ``torch.Tensor`` (a tensor
subclass's ``__torch_function__`` may compute otherwise than its stored values, which adapters read);
parameters on the ``meta`` device (no values to read) or of a non-floating dtype; an embedding
table with ``max_norm`` (its forward renormalizes, in place, the rows it looks up); a part whose
``_compiled_call_impl`` is set; (``check_parts``) a submodule replaced by one of another class
(``layer.linear1 = nn.Identity()``); (``check_only_parts``, an allowlist) a submodule or parameter
the adapter does not map (timm's ``Attention(gated=True)`` adds a ``gate`` Linear its forward
applies); a library method that is another class's (``LlamaMLP.forward = GPT2MLP.forward``); a function the
forward calls replaced in its module (``calls.check_calls``); a forward that kernels' ``kernelize`` set on the
instance (a hub kernel's), and the same checks on the modules kernels makes of functions (``hub_kernels``). Plain
attributes a part's class does not have as built, or holds with another value, are ``as_built``'s to refuse.

A part is known by its ``library_class``, the library class it runs, never by its own name: a user
class ``Dropout(nn.Tanh)`` is a ``Tanh``.
"""

from __future__ import annotations

import inspect
import sys
import types
from typing import Any

from splitformer.symbolic.errors import SplitformerError

from .calls import as_in_source, assigns, check_calls, check_function_module
from .hub_kernels import default_condition, function_module, kernel_repository, unwrapped
from .places import LIBRARIES, PLACES, functions_of, inside, is_library

__all__ = ["check_computation", "check_runs_its_classes", "check_parts", "check_exact_class", "check_only_parts",
           "library_class", "library_name", "qualified_name", "runs_one_of", "shown_class", "LIBRARIES"]

#: Methods a subclass may define without changing what the module computes.
_HARMLESS = frozenset({"__init__", "__new__", "__init_subclass__", "extra_repr", "__repr__", "__str__"})

#: What the attention dispatch returns for eager: the model's own function (nothing registered under the name).
_EAGER = object()

_HOOKS = (("_forward_hooks", "forward hook"), ("_forward_pre_hooks", "forward pre-hook"),
          ("_backward_hooks", "backward hook"), ("_backward_pre_hooks", "backward pre-hook"))


def check_runs_its_classes(owner: str, module: Any) -> None:
    """Refuse hooks (``module``'s parts' or torch's global ones), methods replaced on an instance and tensors of
    another class than torch's: what ``module`` computes is then what its classes' methods compute with the
    values its tensors hold (a generated ``Stack`` written from or into, too). The modules kernels makes of
    functions (``hub_kernels``: a part's private copies, those its forward calls) are checked as parts."""
    _check_global_hooks()
    checked: set[type] = set()
    called: set[Any] = set()
    parts = [(f"{owner}.{name}" if name else owner, part) for name, part in module.named_modules()]
    for where, part in parts:  # the list grows by the function modules found on the way
        _check_part(where, part, checked)
        parts.extend(_kernel_copies(where, part))
        if function_module(part):
            parts.extend(check_function_module(where, part, called))
        parts.extend(check_calls(f"{where} ({type(part).__name__})", type(part), called))


def _output_capture(hook: Any) -> bool:
    """``hook`` is transformers' own output capture, which a model installs on its layers the first time it runs with
    ``output_hidden_states`` or ``output_attentions``: it records a layer's output and returns nothing. Known by its
    code object (the one ``install_output_capuring_hook`` makes) and its module's globals, not by a name."""
    capture = sys.modules.get("transformers.utils.output_capturing")
    install = getattr(capture, "install_output_capuring_hook", None)
    code = getattr(hook, "__code__", None)
    return (install is not None and code is not None and code in install.__code__.co_consts
            and getattr(hook, "__globals__", None) is vars(capture))


def _check_part(where: str, part: Any, checked: set[type]) -> None:
    """Refuse ``part``'s tensors of another class, hooks, compiled call, methods replaced on the instance or on a
    library class of its MRO (classes in ``checked`` are skipped, and added)."""
    _check_plain_tensors(where, part)
    for attribute, kind in _HOOKS:
        if any(not _output_capture(hook) for hook in (getattr(part, attribute, None) or {}).values()):
            raise SplitformerError(f"{where} has a {kind}; adapters read parameters, not what a hook "
                                   "computes: remove it (handle.remove()) before adapting")
    if vars(part).get("_compiled_call_impl") is not None:
        raise SplitformerError(f"{where} has _compiled_call_impl set (module.compile() or an assignment): calling "
                               "it runs that function, not forward; adapt the uncompiled module")
    shadowed = _instance_method(part)
    if shadowed is not None:
        raise SplitformerError(f"{where} has its {shadowed} replaced on the instance{_by_kernelize(part)}; adapters "
                               f"read {type(part).__name__}'s own computation")
    replaced = _foreign_method(type(part), checked)
    if replaced is not None:
        raise SplitformerError(f"{where} ({type(part).__name__}) runs {replaced[0].__qualname__}.{replaced[1]}, "
                               f"which is not the installed library's own ({replaced[2]}): a library method replaced on "
                               "the class; adapters read the library's computation")


def _kernel_copies(where: str, part: Any) -> list[tuple[str, Any]]:
    """The copies of function modules kernels' ``use_kernelized_func`` made for ``part`` (``_kernel_funcs``), named;
    anything else there is ``as_built``'s to refuse."""
    import torch

    copies = vars(part).get("_kernel_funcs")
    if not isinstance(copies, dict):
        return []
    return [(f"{where}._kernel_funcs[{name!r}]", copy) for name, copy in copies.items()
            if isinstance(copy, torch.nn.Module)]


def _by_kernelize(part: Any) -> str:
    """How kernels' ``kernelize`` replaced ``part``'s forward, for a message (``""`` when it did not)."""
    repository = kernel_repository(part)
    if repository is None:
        return ""
    return (f" by kernels' kernelize, with the hub kernel {repository} (transformers' from_pretrained kernelizes by "
            "default: load with use_kernels=False, or call model.reset_kernels())")


def check_computation(owner: str, module: Any) -> None:
    """Refuse ``module`` (named ``owner``) when its parameters and class do not fix what it computes."""
    check_runs_its_classes(owner, module)
    for name, part in module.named_modules():
        where = f"{owner}.{name}" if name else owner
        if _renormalizes(part):
            raise SplitformerError(f"{where} ({type(part).__name__}) has max_norm={part.max_norm}: its forward "
                                   "renormalizes the rows it looks up; adapters read a plain table (set max_norm=None)")
        _check_attention_dispatch(where, part)
        overridden = _overridden_method(type(part))
        if overridden is not None:
            raise SplitformerError(f"{where} ({type(part).__name__}) overrides {overridden[1]} of "
                                   f"{overridden[0].__name__}; adapters read the library class's computation only")
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        if tensor.is_meta:
            raise SplitformerError(f"{owner}.{name} is on the meta device (no values to read); "
                                   "materialize and load the weights first (module.to_empty(device='cpu'), load_state_dict)")
    for name, parameter in module.named_parameters():
        if not parameter.is_floating_point():
            raise SplitformerError(f"{owner}.{name} has dtype {parameter.dtype}; adapters read floating-point parameters")
    _check_finite(owner, module)


def _check_finite(owner: str, module: Any) -> None:
    """Refuse weights holding NaN or ±inf, and a batch norm's running variance below 0: read as they are, every
    output would be NaN (a diverged run, a corrupt checkpoint)."""
    import torch

    statistics = [(name, buffer) for name, buffer in module.named_buffers() if name.rpartition(".")[2] in _STATISTICS]
    for name, tensor in [*module.named_parameters(), *statistics]:
        if not bool(torch.isfinite(tensor.detach()).all()):
            raise SplitformerError(f"{owner}.{name} holds NaN or infinite values; adapters read finite weights")
        if name.endswith("running_var") and bool((tensor.detach() < 0).any()):
            raise SplitformerError(f"{owner}.{name} holds a negative variance; a batch norm's running variance is >= 0")


#: A batch norm's running statistics: buffers the adapters read as parameters (``bn.mean``, ``bn.var``).
_STATISTICS = ("running_mean", "running_var")


#: torch's embedding tables, whose ``max_norm`` changes what their forward returns.
_EMBEDDINGS = frozenset({"torch.nn.modules.sparse.Embedding", "torch.nn.modules.sparse.EmbeddingBag"})


def _renormalizes(module: Any) -> bool:
    classes = {f"{klass.__module__}.{klass.__qualname__}" for klass in type(module).__mro__}
    return bool(classes & _EMBEDDINGS) and getattr(module, "max_norm", None) is not None


def _instance_method(module: Any) -> str | None:
    """The first method of ``module``'s class that an attribute of the instance shadows (``layer.forward =``,
    ``layer._sa_block =``): the forward calls the instance's, not the class's."""
    for name in vars(module):
        if name in _HARMLESS:
            continue
        static = inspect.getattr_static(type(module), name, None)
        if isinstance(static, (types.FunctionType, staticmethod, classmethod)):
            return name
    return None


def _foreign_method(cls: type, checked: set[type]) -> tuple[type, str, str] | None:
    """``(library class, method, where it comes from)`` of the first method of a library class in ``cls``'s MRO
    that is not a library's own function (``_outside``): one replaced on the class
    (``timm.layers.Mlp.forward = lambda self, x: …``). What kernels attaches as transformers is built is known by its
    code (``hub_kernels``): its default ``kernel_condition`` (read by ``kernelize`` only), and its
    ``use_kernelized_func`` wrapper, whose forward is the one it wraps. Classes in ``checked`` are skipped, and
    added."""
    for klass in cls.__mro__:
        if klass in checked or not is_library(klass):
            continue
        checked.add(klass)
        for name, value in vars(klass).items():
            if name in _HARMLESS or default_condition(klass, name, value):
                continue
            for function in map(unwrapped, functions_of(value)):
                found = _outside(function) or _borrowed(klass, name, function)
                if found is not None:
                    return klass, name, found
    return None


def _borrowed(klass: type, name: str, function: Any) -> str | None:
    """What ``function``, a library's own, is when it is not ``klass``'s ``name``: a method of a class outside
    ``klass``'s MRO (``LlamaAttention.forward = GPT2Attention.forward``), or a module-level function of another
    name that the class's module does not assign to ``name`` (torch's ``forward = _forward_unimplemented``;
    transformers' ``smart_apply`` on ``torch.nn.Module`` keeps its name)."""
    qualname = getattr(function, "__qualname__", "")
    if "<locals>" in qualname:
        return None
    path, _, own = qualname.rpartition(".")
    if not path:
        if own == name or assigns(sys.modules.get(klass.__module__), name, own):
            return None
        return f"{function.__module__}.{qualname}, a function of another name"
    found: Any = sys.modules.get(function.__module__)
    for part in path.split("."):
        found = vars(found).get(part) if isinstance(found, (types.ModuleType, type)) else None
    if isinstance(found, type) and found not in klass.__mro__:
        return f"{found.__module__}.{qualname}, a method of another class"
    if as_in_source(function) is False:
        return f"{function.__module__}.{qualname} in name only: its code is not what its source defines there"
    return None


def _outside(function: Any) -> str | None:
    """Where ``function`` comes from when it is not a library's own, ``None`` when it is: each layer of it (a
    ``functools.wraps`` wrapper and what it wraps) has its code in a library's installed folder, the standard
    library's or typing_extensions' (a decorator's wrapper: ``torch.no_grad``, ``contextlib``), and one layer has
    its code in the installed folder of the library its ``__module__`` names (transformers adds
    ``Module.smart_apply`` to torch). Anything callable without Python code (``Mlp.forward = torch.tanh``, a
    ``partial``: neither binds ``self``) is not a method of a library class."""
    layers = [function]
    while hasattr(layers[-1], "__wrapped__") and len(layers) < 16:
        layers.append(layers[-1].__wrapped__)
    files = []
    for layer in layers:
        code = getattr(layer, "__code__", None)
        if code is None:
            return f"a {type(layer).__name__} of {getattr(layer, '__module__', None) or 'no module'}, no Python code"
        files.append(code.co_filename)
        if not any(inside(code.co_filename, folder) for folder in PLACES):
            return f"defined in {code.co_filename}"
    if not any(inside(file, _package(layer)) for layer, file in zip(layers, files)):
        return f"defined in {files[-1]}"
    return None


def _package(function: Any) -> str:
    """The library whose function ``function`` says it is (its ``__module__``'s top level), or ``""``."""
    package = str(getattr(function, "__module__", None) or "").split(".")[0]
    return package if package in LIBRARIES else ""


def _check_plain_tensors(where: str, module: Any) -> None:
    """Refuse a parameter or buffer of ``module`` whose class is not exactly ``torch.nn.Parameter`` or
    ``torch.Tensor``: a subclass (``nn.Parameter(w.as_subclass(MyTensor))``) runs every operation of the
    forward through its own ``__torch_function__``, while adapters read the values it stores."""
    import torch

    for kind in ("_parameters", "_buffers"):
        for name, tensor in vars(module).get(kind, {}).items():
            if tensor is not None and type(tensor) not in (torch.nn.Parameter, torch.Tensor):
                raise SplitformerError(f"{where}.{name} is a {type(tensor).__name__}, not a torch.nn.Parameter or "
                                       "torch.Tensor: its class may change what the forward computes with it; adapters "
                                       "read plain tensors (torch.nn.Parameter(tensor.as_subclass(torch.Tensor)))")


def _check_attention_dispatch(where: str, module: Any) -> None:
    """Refuse a transformers module whose ``config._attn_implementation`` dispatches to an attention function
    other than the built-in eager or sdpa one (``transformers.AttentionInterface.register`` is global)."""
    config = vars(module).get("config")
    modeling = sys.modules.get("transformers.modeling_utils")
    if modeling is None or not hasattr(config, "_attn_implementation"):
        return
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    implementation = config._attn_implementation
    expected = {None: _EAGER, "eager": _EAGER, "sdpa": sdpa_attention_forward}
    function = modeling.ALL_ATTENTION_FUNCTIONS.get(implementation, _EAGER)
    if implementation not in expected or function is not expected[implementation]:
        shown = "nothing" if function is _EAGER else getattr(function, "__qualname__", repr(function))
        raise SplitformerError(f"{where}.config._attn_implementation is {implementation!r}, which transformers' "
                               f"AttentionInterface dispatches to {shown}; adapters read the built-in eager and sdpa "
                               "attention only (model.set_attn_implementation('sdpa'))")


def library_class(part: Any) -> type | None:
    """The library class whose computation ``part`` runs: its own class, or the library class a user class
    derives from (the first in its MRO, whose own MRO must be the rest of it); ``None`` for anything else.
    Adapters read a part by this class's name, never by the user class's (``class Dropout(nn.Tanh)`` is a Tanh)."""
    mro = type(part).__mro__
    first = next((index for index, klass in enumerate(mro) if is_library(klass)), None)
    if first is None or mro[first:] != mro[first].__mro__:
        return None
    return mro[first]


def library_name(part: Any) -> str | None:
    """The name of ``part``'s ``library_class`` (``None`` when it has none)."""
    klass = library_class(part)
    return None if klass is None else klass.__name__


def runs_one_of(part: Any, names: tuple[str, ...] | frozenset[str]) -> bool:
    """``part``'s library class is one of ``names``, or a class its library derives from one of them
    (torch's ``NonDynamicallyQuantizableLinear`` is a ``Linear``); a user class never counts by its own name.
    A dotted name (``timm.models.vision_transformer.Block``: module and name) is that one class exactly, where a
    library has several classes of one name (timm's beit, nest, volo and sam have a ``Block`` and an ``Attention``)."""
    klass = library_class(part)
    if klass is None:
        return False
    return qualified_name(klass) in names or any(base.__name__ in names for base in klass.__mro__ if is_library(base))


def dropout_rates(module: Any) -> list[float]:
    """The nonzero dropout probabilities ``module``'s parts apply in training: their ``Dropout`` modules' and the rates
    they pass to an attention function themselves (transformers' ``attention_dropout``, Llama's), sorted."""
    rates = {part.p for part in module.modules() if runs_one_of(part, ("Dropout",))}
    rates |= {rate for part in module.modules() for rate in [getattr(part, "attention_dropout", None)]
              if isinstance(rate, (int, float)) and not isinstance(rate, bool)}
    return sorted(rate for rate in rates if rate > 0)


def check_exact_class(owner: str, part: Any, qualified: str) -> None:
    """Refuse ``part`` (named ``owner``) unless its library class is exactly ``qualified`` (``runs_one_of``)."""
    if not runs_one_of(part, (qualified,)):
        klass = library_class(part)
        found = qualified_name(klass) if klass is not None else shown_class(part)
        raise SplitformerError(f"{owner} is {found}, not {qualified}; the adapter reads that class's computation only")


def qualified_name(klass: type) -> str:
    """``klass``'s module and name, ``timm.layers.mlp.Mlp``."""
    return f"{klass.__module__}.{klass.__qualname__}"


def shown_class(part: Any) -> str:
    """``part``'s class as a message names it: the user class and the library class it runs."""
    if library_class(part) is type(part):
        return type(part).__name__
    return f"{type(part).__name__} (a user class running {library_name(part) or 'no library class'})"


def _overridden_method(cls: type) -> tuple[type, str] | None:
    """``(library class, method)`` of the first library method that a class deriving from it redefines."""
    mro = cls.__mro__
    first = next((index for index, klass in enumerate(mro) if is_library(klass)), len(mro))
    library = mro[first:]
    for klass in mro[:first]:  # the user's classes: those the library class is derived into
        for name, value in vars(klass).items():
            if name in _HARMLESS or not (callable(value) or isinstance(value, (staticmethod, classmethod, property))):
                continue
            base = next((lib for lib in library if name in vars(lib)), None)
            if base is not None:
                return base, name
    return None


def _check_global_hooks() -> None:
    from torch.nn.modules import module as torch_module

    for attribute, kind in _HOOKS:
        if getattr(torch_module, f"_global{attribute}", None):
            raise SplitformerError(f"a global module {kind} is registered (torch.nn.modules.module."
                                   "register_module_*); it changes what every module computes: remove it before adapting")


def check_parts(owner: str, module: Any, parts: dict[str, str | tuple[str, ...] | None]) -> None:
    """Refuse ``module`` when a submodule (dotted path) does not run the named library class (its own class or
    one a user class derives from, ``library_class``; a tuple names alternatives, ``None`` any class the adapter
    checks itself)."""
    for path, expected in parts.items():
        try:
            part = module.get_submodule(path)
        except AttributeError:
            raise SplitformerError(f"{owner} has no {path} (a {expected}); it is not the library's layout") from None
        names = (expected,) if isinstance(expected, str) else expected or ()
        if names and not runs_one_of(part, names):
            raise SplitformerError(f"{owner}.{path} is {shown_class(part)}, not {' or '.join(names)}, the class the "
                                   "reading maps there")


def check_only_parts(owner: str, module: Any, parts: dict[str, str | tuple[str, ...] | None],
                     parameters: frozenset[str]) -> None:
    """``check_parts``, and refuse any other submodule or parameter: what the adapter does not map
    may be what the forward computes with (an allowlist, not a list of known extras)."""
    for path, part in module.named_modules():
        if path and path not in parts:
            raise SplitformerError(f"{owner}.{path} ({type(part).__name__}) is not a part the adapter maps; "
                                   "the scheme has no counterpart of what it computes")
    for name, _ in module.named_parameters():
        if name not in parameters:
            raise SplitformerError(f"{owner} has the parameter {name}, which the adapter does not map; "
                                   "the scheme has no counterpart of what it computes")
    check_parts(owner, module, parts)
