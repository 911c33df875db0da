"""Weight adapters: source modules (torch, transformers, timm) ↔ canonical parameters.

Each source family lives in its own module of this package and registers, by class name, in
``registry``, a *reader* with ``@adapter("hf", "BertLayer")`` (module → ``Adapted``) and a *writer* with
``@writer("hf", "BertLayer")`` (``Adapted`` → the module's state dict). ``from_torch``,
``from_hf`` and ``from_timm`` dispatch on the class name of what they are given, so none of
them imports transformers or timm; ``to_torch`` dispatches on ``Adapted.source``.

Before any reader runs, ``inspection.check_computation`` refuses a module whose parameters and
class do not fix what it computes (hooks, overridden methods, meta or non-floating tensors).
A reader reads the source's configuration and tensors and raises ``SplitformerError`` naming
what the target scheme does not implement; it never guesses. Keyword expectations
(``from_torch(layer, scheme="post-ln", eps=1e-5)``) are refused the same way when the source
disagrees.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import replace
from functools import partial
from typing import Any

import numpy as np

from splitformer.symbolic.errors import SplitformerError

from .adapted import Adapted
from .arrays import array, dtype_notes, floating_dtype, source_dtype, torch_floating_dtype
from .as_built import check_as_built
from .inspection import check_computation, dropout_rates, library_name
from .hf_vision import AdaptedModel
from .xtransformers_writer import xtransformers_state
from .hf_gpt2 import rounded_gelu_notes
from .sharing import check_shared_storage
from .registry import ADAPTERS, NETWORK_ADAPTERS, WRITERS, adapter, network_adapter, writer
from . import hf_bert, hf_gpt2, hf_llama, hf_vision, timm_vit, timm_vit_network, torch_decoder, torch_encoder, xtransformers  # noqa: F401  (each registers its readers and writers)

__all__ = ["Adapted", "AdaptedModel", "adapter", "network_adapter", "writer", "from_torch", "from_hf", "from_timm",
           "from_xtransformers", "to_torch", "to_xtransformers", "canonical", "ADAPTERS", "NETWORK_ADAPTERS", "WRITERS"]

_EXPECTABLE = ("scheme", "activation", "n_heads", "eps", "bias")


def _reader(library: str, name: str, network: Any) -> Any:
    """The reader of ``name`` (into the built-in ``network`` when one is named); a refusal listing the known ones."""
    if network is not None:
        reader = NETWORK_ADAPTERS.get((library, name, network))
        if reader is None:
            known = ", ".join(f"{cls} → {net}" for lib, cls, net in sorted(NETWORK_ADAPTERS) if lib == library) or "none"
            raise SplitformerError(f"no {library} reader of {name} into the network {network!r} (supported: {known})")
        return reader
    reader = ADAPTERS.get((library, name))
    if reader is None:
        known = ", ".join(sorted(cls for lib, cls in ADAPTERS if lib == library)) or "none"
        raise SplitformerError(f"no {library} adapter for {name} (supported: {known})")
    return reader


def _dispatch(library: str, module: Any, expected: dict[str, Any]) -> Adapted | AdaptedModel:
    name = library_name(module) or f"{type(module).__name__} (no library class)"  # what it runs, not what it is called
    reader = _reader(library, name, expected.pop("network", None))
    dtype = expected.pop("dtype", None)
    if dtype is not None:
        floating_dtype(dtype)
    check_computation(name, module)
    check_shared_storage(name, module)
    unknown = sorted(set(expected) - set(_EXPECTABLE))
    if unknown:
        raise SplitformerError(f"unknown expectation {unknown[0]!r} (known: {', '.join(_EXPECTABLE)}, dtype, network)")
    adapted = _read(name, reader, module)
    check_as_built(name, module, dropout=getattr(adapted, "dropout", None))  # after the reader: its refusals are more precise
    for key, wanted in expected.items():
        if wanted is not None and _expectable(name, adapted, key) != wanted:
            raise SplitformerError(f"{name} has {key}={_expectable(name, adapted, key)!r}, asked for {key}={wanted!r}")
    adapted = replace(adapted, notes=adapted.notes + dtype_notes(module) + _dropout_notes(module, adapted)
                      + rounded_gelu_notes(module),
                      source_dtype=source_dtype(module))
    if isinstance(adapted, Adapted) and isinstance(getattr(module, "training", None), bool):
        adapted = replace(adapted, training=module.training)  # build() returns its module in the source's mode
    return adapted if dtype is None else adapted.astype(dtype)


def _read(name: str, reader: Any, module: Any) -> Adapted | AdaptedModel:
    """``reader(module)``; a part it cannot read (``AttributeError`` on a part replaced by another class) is
    refused as ``check_as_built`` names how the module differs from the library's as built, else in one line."""
    try:
        return reader(module)
    except SplitformerError:
        raise
    except Exception as error:
        check_as_built(name, module)
        raise SplitformerError(f"{name} cannot be read as the library builds it ({type(error).__name__}: "
                               f"{str(error).splitlines()[0] if str(error) else ''}); adapters read the library's "
                               "module as built") from None


def _expectable(name: str, adapted: Adapted | AdaptedModel, key: str) -> Any:
    """What ``adapted`` has for an expectation ``key``; a whole network has ``n_heads`` and ``eps`` only."""
    if not isinstance(adapted, AdaptedModel):
        return getattr(adapted, key)
    if key not in ("n_heads", "eps") or key not in adapted.config:
        raise SplitformerError(f"{name} is read as the whole network {adapted.model!r}: it can be expected to have "
                               f"n_heads and eps, not {key}")
    return adapted.config[key]


def _dropout_notes(module: Any, adapted: Any) -> tuple[str, ...]:
    """What ``build`` does not carry: a source dropout other than one rate where a generated Block drops."""
    # x-transformers' stochastic depth: a rate per layer (layer_dropouts), no Dropout module
    depth = sorted({rate for part in module.modules() for rate in getattr(part, "layer_dropouts", None) or ()
                    if isinstance(rate, (int, float)) and rate > 0})
    skipped = (f"the source's layer dropout (stochastic depth, p = {', '.join(map(str, depth))}) is not carried: a "
               "generated Stack runs every layer",) if depth else ()
    if getattr(adapted, "dropout", 0.0) is not None:
        return skipped
    rates = dropout_rates(module)
    if not rates:
        return skipped
    return (f"the source's dropout (p = {', '.join(map(str, rates))}) is not carried: build() makes a Block "
            "without dropout (pass dropout= to the Block yourself to train with one)",) + skipped


def from_torch(module: Any, **expected: Any) -> Adapted:
    """``Adapted`` of a torch module (``nn.TransformerEncoderLayer``, ``nn.TransformerEncoder``, the decoder's two).

    ``expected``: ``scheme``, ``activation``, ``n_heads``, ``eps``, ``bias`` the source must
    have (a ``SplitformerError`` names a mismatch); ``dtype`` converts the parameters.
    """
    return _dispatch("torch", module, expected)


def from_hf(module: Any, **expected: Any) -> Adapted:
    """``Adapted`` of a ``transformers`` module (``BertLayer``, ``BertModel``, …); see ``from_torch``.

    ``ViTModel``/``ViTForImageClassification`` and the CvT models are read as whole networks
    (``AdaptedModel``; ``network="vit"``/``"cvt"`` may say so explicitly).
    """
    return _dispatch("hf", module, expected)


def from_timm(module: Any, **expected: Any) -> Adapted:
    """``Adapted`` of a ``timm`` module (ViT ``Block``, ``VisionTransformer``); see ``from_torch``.

    ``network="vit"``: a ``VisionTransformer`` as a whole ``vit`` network (``AdaptedModel``: patch
    embedding, class token, positions, blocks, final norm, head); what the network does not
    compute is refused by name.
    """
    return _dispatch("timm", module, expected)


def from_xtransformers(module: Any, **expected: Any) -> Adapted:
    """``Adapted`` of an x-transformers ``Encoder``, ``Decoder`` or ``TransformerWrapper`` (its
    ``attn_layers``): a stack whose scheme file (``Adapted.scheme_file``) is composed from the
    module's flags; a flag splitformer does not compute is refused by name. See ``from_torch``
    for ``expected``."""
    return _dispatch("xtransformers", module, expected)


def to_torch(params: Any, like: Adapted | None = None, *, final_norm: Any = None, dtype: Any = None) -> dict[str, Any]:
    """The source module's state dict holding ``params`` (load it with ``strict=True``).

    ``params``: an ``Adapted``; or canonical parameters of the same source, ``like`` being
    its ``Adapted``: one mapping, a list of mappings (with ``final_norm``, a mapping with ``gain`` and ``bias``,
    where the source ends with a final norm), or a generated ``Block``/``Stack`` (trained here). ``dtype``: the
    tensors' torch dtype (default: the source module's, so a bfloat16 source gets bfloat16 tensors back).
    Whole networks (``AdaptedModel``: ViT, CvT) have no writer.
    """
    dtype = torch_floating_dtype(dtype)
    if isinstance(params, AdaptedModel) or isinstance(like, AdaptedModel):
        raise SplitformerError("to_torch writes blocks and stacks; a whole network (AdaptedModel: ViT, CvT) has no "
                               "writer: write its blocks' parameters into the source yourself")
    if like is not None and not isinstance(like, Adapted):
        raise SplitformerError(
            f"to_torch's like must be the Adapted of the source module (from_hf, from_torch of its layer or stack), got "
            f"{type(like).__name__}" + ("; from_hf of a whole language model gives a LanguageModel: write each layer "
                                        "back, to_torch(lm.stack.layers[i], like=from_hf(hf_layers[i]))"
                                        if type(like).__name__ == "LanguageModel" else ""))
    if not isinstance(params, Adapted):
        if like is None:
            raise SplitformerError("to_torch needs like=Adapted of the source module for plain parameters")
        params = _holding(like, params, final_norm)
    elif final_norm is not None:
        raise SplitformerError("final_norm goes with plain parameters (a list of mappings); an Adapted holds its own")
    function = WRITERS.get(params.source)
    if function is None and params.source[0] == "xtransformers":
        raise SplitformerError("x-transformers modules are written with to_xtransformers(params, module): "
                               "the state dict's keys and layout come from the module")
    if function is None:
        raise SplitformerError(f"no writer for {params.source[0]} {params.source[1]}")
    _check_tied_copies(params)
    state = function(params)
    if dtype is None:
        import torch

        dtype = getattr(torch, params.source_dtype)
    return {key: value.to(dtype) for key, value in state.items()}


def to_xtransformers(params: Any, module: Any, *, final_norm: Any = None, dtype: Any = None) -> dict[str, Any]:
    """The state dict of the x-transformers ``module`` (``Encoder``, ``Decoder``, ``TransformerWrapper``)
    holding ``params``; load it with ``module.load_state_dict(state, strict=True)``.

    ``params``: an ``Adapted`` of a module with the same flags, or a generated ``Block``/``Stack`` (or
    canonical mappings, one per layer, with ``final_norm`` where the module ends with one) of the scheme
    ``from_xtransformers(module)`` composes. Entries the module does not read (a wrapper's embeddings and logits),
    and its buffers, keep the module's values; what its layout cannot hold is refused by name
    (``xtransformers_writer``). ``dtype``: the tensors' torch dtype (default: the module's).
    """
    dtype = torch_floating_dtype(dtype)
    like = from_xtransformers(module)
    if not isinstance(params, Adapted):
        params = _holding(like, params, final_norm, "to_xtransformers(layers, module, final_norm=")
    elif final_norm is not None:
        raise SplitformerError("to_xtransformers: final_norm goes with plain parameters; an Adapted holds its own")
    elif params.scheme_file != like.scheme_file or params.options != like.options:
        raise SplitformerError("to_xtransformers: the Adapted was read from a module with other flags "
                               f"(scheme {params.scheme!r}, the module's {like.scheme!r}): {_readings_differ(params, like)}")
    elif params.n_heads != like.n_heads:
        raise SplitformerError(f"to_xtransformers: the Adapted was read from a module of {params.n_heads} heads, "
                               f"the module has {like.n_heads}")
    else:  # its layers' count and shapes checked as a Stack's are (another depth or width is refused by name)
        params = like.with_params(params.layers, params.final_norm)
    unprobed = partial(_reader("xtransformers", type(module).__name__, None), probe=False)  # it reads 0, 1, … on purpose
    return xtransformers_state(params, module, unprobed, dtype)


def _readings_differ(ours: Adapted, theirs: Adapted) -> str:
    """Where two readings differ: the lines of their scheme files (``-`` ours, ``+`` theirs) and their options."""
    lines = [line for line in difflib.unified_diff(ours.scheme_file.splitlines(), theirs.scheme_file.splitlines(),
                                                   lineterm="", n=0)
             if line[:1] in "+-" and not line.startswith(("+++", "---")) and not line[1:].startswith(("name =", "summary ="))]
    options = [f"{name} {ours.options.get(name)!r} against {theirs.options.get(name)!r}"
               for name in sorted(set(ours.options) | set(theirs.options))
               if ours.options.get(name) != theirs.options.get(name)]
    shown = lines[:8] + (["…"] if len(lines) > 8 else [])
    return "; ".join((["scheme file lines (- the Adapted's, + the module's): " + " | ".join(shown)] if lines else [])
                     + (["options " + ", ".join(options)] if options else []))


def _check_tied_copies(adapted: Adapted) -> None:
    """Refuse layers that differ for a source whose steps run one shared layer module (``tied``): its state dict
    holds that module once under each step's keys, and loading would keep the last copy only."""
    if not adapted.tied:
        return
    first = adapted.layers[0]
    for index, layer in enumerate(adapted.layers[1:], start=1):
        name = next((name for name in first if not np.array_equal(layer[name], first[name])), None)
        if name is not None:
            raise SplitformerError(f"layers[{index}].{name} differs from layers[0].{name}, but the source's steps run "
                                   "one shared layer module (tied): copies of tied layers that differ cannot be written")


def _holding(like: Adapted, params: Any, final_norm: Any = None,
             call: str = "to_torch(layers, like=adapted, final_norm=") -> Adapted:
    """``like`` holding ``params`` (mappings with ``final_norm``, or a generated Block/Stack whose computation must be
    ``like``'s, its own final norm included); ``call``: how the message shows passing a final norm. A layer that
    carries its reading (``adapted.layers[i]``) must have been read with ``like``'s flags."""
    if hasattr(params, "state_dict"):
        if final_norm is not None:
            raise SplitformerError("final_norm goes with plain parameters; a generated Stack holds its own")
        like.check_computes(params)  # a generated Block/Stack: the round trip keeps the computation
    layers, found = canonical(params)
    for index, layer in enumerate(layers):
        source = getattr(layer, "adapted", None)
        if isinstance(source, Adapted) and (source.scheme_file, source.options) != (like.scheme_file, like.options):
            raise SplitformerError(f"layers[{index}] was read from a module with other flags (scheme "
                                   f"{source.scheme!r}, the target's {like.scheme!r}): "
                                   f"{_readings_differ(source, like)}")
    if final_norm is not None and like.final_norm is None:
        raise SplitformerError("the source has no final norm: final_norm must be None")
    final_norm = found if final_norm is None else final_norm
    if like.final_norm is not None and final_norm is None:
        raise SplitformerError(f"the source ends with a final norm: pass its parameters, {call}"
                               "{'gain': …, 'bias': …})")
    return like.with_params(layers, final_norm if like.final_norm is not None else None)


def canonical(params: Any) -> tuple[list[Mapping[str, Any]], Mapping[str, Any] | None]:
    """``(layers, final_norm)`` of canonical mappings from a mapping, a list, or a generated Block/Stack."""
    if isinstance(params, Mapping):
        return [params], None
    if isinstance(params, (list, tuple)):
        return list(params), None
    if hasattr(params, "state_dict"):
        meta = next((key for key, value in params.state_dict().items() if value.is_meta), None)
        if meta is not None:  # what the readers refuse, and torch cannot copy out
            raise SplitformerError(f"{type(params).__name__}.{meta} is on the meta device (no values to read); "
                                   "materialize and load the weights first (module.to_empty(device='cpu'), load_params)")
        state = {key: array(value) if value.is_floating_point() else value.detach().cpu().numpy()
                 for key, value in params.state_dict().items()}  # bfloat16/float16 widened as the readers do
        if not hasattr(params, "layers"):
            return [state], None
        layers = [{key.split(".", 2)[2]: value for key, value in state.items() if key.startswith(f"layers.{i}.")}
                  for i in range(len(params.layers))]
        final = {key.split(".", 1)[1]: value for key, value in state.items() if key.startswith("final_norm.")}
        return layers, final or None
    raise SplitformerError(f"cannot read canonical parameters from {type(params).__name__}")
