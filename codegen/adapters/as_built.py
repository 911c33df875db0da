"""Does every plain attribute of a part hold what its library class sets as built? Forwards read plain
attributes (``MultiheadAttention.batch_first``, ``GPT2Attention.scale_attn_weights``,
``LlamaRMSNorm.variance_epsilon``); an adapter reads the configuration those are built from, so an
attribute set after construction could make the source compute otherwise than what the adapter read.

``check_as_built`` builds a fresh instance of the module's library class from the same configuration (on
the meta device: no weights) and compares each part with its counterpart there: a part at a path where the
fresh module has none, none where it has one, or one of another library class is refused by name, and so is
a parameter or buffer one of them holds and the other not, and an attribute the fresh part lacks or holds with
another value, unless ``READS`` names it (the adapter reads that attribute from the part itself and checks it)
or ``IMMATERIAL`` does (no forward of an evaluated module reads it, or it selects another kernel for the same
values). Every other attribute a forward reads is thus compared with the value the adapter assumes. Every
source, with a builder or not, is refused when a part is in a training mode whose forward differs from the
evaluated one (``check_evaluated``). timm records no constructor arguments: ``as_built_timm`` rebuilds its
parts from their parameters and the attributes the readers read.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache, partial
from types import MethodType
from typing import Any

from splitformer.symbolic.errors import SplitformerError

from .as_built_timm import fresh_block, fresh_vision_transformer
from .hub_kernels import function_module, is_mode
from .inspection import library_class, library_name, runs_one_of, shown_class

__all__ = ["check_as_built", "check_evaluated", "drop_rates", "BUILDERS", "READS", "IMMATERIAL"]


def _torch_layer(cls: type, layer: Any) -> Any:
    """A fresh ``TransformerEncoderLayer``/``TransformerDecoderLayer`` with ``layer``'s configuration: widths from its
    parameters, the rest from the attributes the adapter reads (``READS``)."""
    return cls(layer.self_attn.out_proj.weight.shape[0], layer.self_attn.num_heads, layer.linear1.weight.shape[0],
               layer.dropout.p, layer.activation, layer.norm1.eps, layer.self_attn.batch_first, layer.norm_first,
               bias=layer.linear1.bias is not None)


def _torch_stack(cls: type, stack: Any) -> Any:
    """A fresh ``TransformerEncoder``/``TransformerDecoder`` with ``stack``'s configuration (its first layer's, its
    final norm's, the encoder's nested-tensor switches)."""
    import torch

    first = stack.layers[0]
    norm = None if stack.norm is None else torch.nn.LayerNorm(
        stack.norm.weight.shape[0], stack.norm.eps, bias=stack.norm.bias is not None)
    switches = ({"enable_nested_tensor": stack.enable_nested_tensor, "mask_check": stack.mask_check}
                if hasattr(stack, "enable_nested_tensor") else {})
    return cls(_torch_layer(library_class(first), first), len(stack.layers), norm, **switches)


#: library class name → a fresh instance of that class built from a part's configuration.
BUILDERS: dict[str, Callable[[type, Any], Any]] = {
    "TransformerEncoderLayer": _torch_layer,
    "TransformerDecoderLayer": _torch_layer,
    "TransformerEncoder": _torch_stack,
    "TransformerDecoder": _torch_stack,
    "BertLayer": lambda cls, layer: cls(layer.attention.self.config, layer_idx=layer.attention.self.layer_idx),
    "BertEncoder": lambda cls, encoder: cls(encoder.config),
    "BertModel": lambda cls, model: cls(model.config, add_pooling_layer=model.pooler is not None),
    "GPT2Block": lambda cls, block: cls(block.attn.config, layer_idx=block.attn.layer_idx),
    "LlamaDecoderLayer": lambda cls, layer: cls(layer.self_attn.config, layer_idx=layer.self_attn.layer_idx),
    "ViTModel": lambda cls, model: cls(model.config, add_pooling_layer=model.pooler is not None,
                                       use_mask_token=model.embeddings.mask_token is not None),
    **dict.fromkeys(("ViTForImageClassification", "GPT2Model", "GPT2LMHeadModel", "LlamaModel", "LlamaForCausalLM",
                     "CvtModel", "CvtForImageClassification"), lambda cls, model: cls(model.config)),
    "Block": fresh_block,  # timm's
    "VisionTransformer": fresh_vision_transformer,
}

#: Attributes a forward reads that the adapter reads from each part itself (and checks), by library class. The
#: torch builders take the rest of what the adapter reads (``self_attn.batch_first``, ``num_heads``, ``norm_first``,
#: ``activation``, ``norm1.eps``) from the part: the fresh layer has them, and every other part is compared with
#: them (``multihead_attn.batch_first`` with ``self_attn.batch_first``).
READS: dict[str, frozenset[str]] = {
    "MultiheadAttention": frozenset({"dropout"}),  # common.torch_dropout reads every rate
    "Dropout": frozenset({"p"}),
    "LayerNorm": frozenset({"eps"}),  # common.check_norms
    "LlamaRMSNorm": frozenset({"variance_epsilon"}),  # hf_llama.llama_layer_config
    "BatchNorm2d": frozenset({"eps"}),  # hf_vision.from_hf_cvt: one ε with the LayerNorms'
    "GELU": frozenset({"approximate"}),  # common.activation_name
}

#: Attributes no forward of an evaluated module reads, or reads to choose a kernel for the same values (why, in
#: a word), by library class (``"*"``: any class).
IMMATERIAL: dict[str, dict[str, str]] = {
    "*": {"_is_hf_initialized": "weight initialization", "gradient_checkpointing": "training only",
          "_gradient_checkpointing_func": "training only",
          "generation_config": "generate() only", "name_or_path": "where from_pretrained loaded it",
          "_weight_conversions": "from_pretrained's loading record",
          "_output_capturing_hooks_installed": "the record that output_hidden_states installed its capture hooks, "
                                               "which record a layer's output and return nothing (inspection checks "
                                               "each hook is that one)"},
    "Dropout": {"inplace": "the identity in eval"},
    "DropPath": {"drop_prob": "the identity in eval", "scale_by_keep": "the identity in eval"},
    "CvtDropPath": {"drop_prob": "the identity in eval"},
    "BatchNorm2d": {"momentum": "updates running statistics in training only",
                    "track_running_stats": "read in training only (eval normalizes with the running statistics)"},
    **dict.fromkeys(("ReLU", "SiLU"), {"inplace": "the same values, written over its input"}),
    "LayerNorm": {"_fast_norm": "timm's switch to the same layer norm by another kernel"},
    "Attention": {"fused_attn": "timm's switch between sdpa and the same softmax written out; both scale by "
                                "1/√head_dim, as the reader checks scale"},
    "VisionTransformer": {"weight_init_mode": "weight initialization", "fix_init": "weight initialization",
                          "grad_checkpointing": "recomputes the same blocks for the gradient",
                          "feature_info": "forward_intermediates' record of each block's stride (set_input_size leaves "
                                          "it as built)",
                          **dict.fromkeys(("pretrained_cfg", "default_cfg", "pretrained_model_args", "_traits", "_model_args"),
                                          "timm.create_model's record of the weights' source, arguments and input size")},
    "Embedding": {"padding_idx": "gradient only", "scale_grad_by_freq": "gradient only", "sparse": "gradient only"},
    "ViTEmbeddings": {"patch_size": "interpolate_pos_encoding only (the reader reads config.patch_size, either spelling)"},
    "GPT2Model": {"_attn_implementation": "a copy; the forward reads config._attn_implementation (inspection checks it)"},
}


def _loaded(part: Any) -> dict[str, Any]:
    """What ``from_pretrained`` sets that a freshly built model lacks, with the value the adapter accepts: the record
    that kernels' ``kernelize`` ran (transformers 5.25 runs it by default): ``_use_kernels`` True with the ``Mode``
    it ran in (``_kernels_mode``), else False, and the device it looked for kernels for (``_kernels_device``). What
    it replaced (a part's forward, on the instance) is ``inspection``'s to refuse."""
    state = vars(part)
    mode = state.get("_kernels_mode") if is_mode(state.get("_kernels_mode")) else None
    device = state.get("_kernels_device") if isinstance(state.get("_kernels_device"), str) else None
    return {"_use_kernels": mode is not None, "_kernels_mode": mode, "_kernels_device": device}


def _same(value: Any, built: Any, owners: tuple[Any, Any] = (None, None)) -> bool:
    """Whether an attribute's ``value`` equals the one its fresh counterpart is ``built`` with. A ``functools.partial``
    and a method bound to its own module (``owners``: the part and its counterpart) are made anew for each module,
    so they compare by what they call (GPT-2's ``gelu_pytorch_tanh``, BERT's ``gelu_python``), and so is the copy of
    a function module kernels makes for each module (``_kernel_funcs``): by its class, which ``inspection`` checks;
    a dict compares entry by entry."""
    if value is built:
        return True
    if function_module(value) and function_module(built):
        return type(value) is type(built)
    if isinstance(value, dict) and isinstance(built, dict):
        return (type(value) is type(built) and value.keys() == built.keys()
                and all(_same(value[key], built[key], owners) for key in value))
    if isinstance(value, partial) and isinstance(built, partial):
        return (_same(value.func, built.func, owners) and len(value.args) == len(built.args)
                and all(_same(a, b, owners) for a, b in zip(value.args, built.args))
                and value.keywords.keys() == built.keywords.keys()
                and all(_same(value.keywords[key], built.keywords[key], owners) for key in value.keywords))
    if isinstance(value, MethodType) and isinstance(built, MethodType):
        return value.__func__ is built.__func__ and (value.__self__, built.__self__) == owners
    try:
        return type(value) is type(built) and bool(value == built)
    except (TypeError, ValueError, RuntimeError):  # a tensor, or something without a plain equality
        return False


def _fresh(owner: str, module: Any) -> Any:
    import torch

    klass = library_class(module)
    builder = BUILDERS.get(klass.__name__ if klass else "")
    if builder is None:
        return None
    try:
        with torch.device("meta"):
            return builder(klass, module)
    except Exception as error:  # the library's own refusal of what the source holds (a config edited after construction)
        raise SplitformerError(f"{owner}: {klass.__name__} cannot be built from what the adapter reads "
                               f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}); "
                               "adapters compare the module with one built as its configuration says") from None


def check_as_built(owner: str, module: Any, *, dropout: float | None = None) -> None:
    """Refuse ``module`` when it does not compute as its library class builds it from its configuration: a part
    in training mode whose forward then differs (``check_evaluated``; ``dropout`` is the rate the adapter carries
    into a generated Block that drops where the source does); and, when ``BUILDERS`` has a builder, a part, a
    parameter or buffer, or a plain attribute (``READS`` and ``IMMATERIAL`` excepted) that the same part of a
    freshly built ``module`` lacks or holds with another class or value."""
    check_evaluated(owner, module, dropout)
    fresh = _fresh(owner, module)
    if fresh is None:
        return
    parts, built = dict(module.named_modules(remove_duplicate=False)), dict(fresh.named_modules(remove_duplicate=False))
    _check_layout(owner, module, parts, built)
    for path, part in parts.items():
        where = f"{owner}.{path + '.' if path else ''}"
        _check_tensors(where, part, built[path])
        _check_attributes(where, part, built[path])


def _check_layout(owner: str, module: Any, parts: dict[str, Any], built: dict[str, Any]) -> None:
    """Refuse a part the fresh module lacks, one it has that ``module`` lacks, and one of another library class."""
    builds = f"{library_name(module)} builds"
    for path, part in parts.items():
        if path not in built:
            raise SplitformerError(f"{owner}.{path} ({shown_class(part)}) is a part {library_name(module)} does not "
                                   "build from this configuration; its forward may call it, the adapter does not read it")
    for path, counterpart in built.items():
        if path not in parts:
            raise SplitformerError(f"{owner}.{path} is missing: {builds} a {library_name(counterpart)} there from this "
                                   "configuration; adapters read the library's module as built")
        if library_class(parts[path]) is not library_class(counterpart):
            found, wanted = shown_class(parts[path]), library_name(counterpart)
            if found == wanted:  # two libraries' classes of one name (torch's LayerNorm, timm's): say whose
                found, wanted = (f"{type(one).__module__}.{type(one).__qualname__}" for one in (parts[path], counterpart))
            raise SplitformerError(f"{owner}.{path} is {found}, not the {wanted} {builds} there from this "
                                   "configuration; adapters read the library's module as built")


def _check_tensors(where: str, part: Any, counterpart: Any) -> None:
    """Refuse a parameter or buffer that ``part`` holds and its fresh counterpart does not (``None`` there, a
    ``bias`` on a bias-less convolution), or the reverse."""
    for kind, noun in (("_parameters", "parameter"), ("_buffers", "buffer")):
        held = {name for name, tensor in vars(part)[kind].items() if tensor is not None}
        expected = {name for name, tensor in vars(counterpart)[kind].items() if tensor is not None}
        differing = sorted(held ^ expected)
        if differing:
            name = differing[0]
            state, other = ("holds a", "none") if name in held else ("has no", "one")
            raise SplitformerError(f"{where}{name}: {library_name(part)} {state} {noun} {name} here, but is built "
                                   f"with {other} from this configuration; adapters read the library's module as built")


def _check_attributes(where: str, part: Any, counterpart: Any) -> None:
    """Refuse a plain attribute of ``part`` that ``counterpart`` lacks or holds with another value."""
    name = library_name(part) or ""
    reads, immaterial = READS.get(name, frozenset()), IMMATERIAL.get(name, {})
    expected = {**_loaded(part), **vars(counterpart)}
    for attribute, value in vars(part).items():
        if attribute in _module_state() or attribute in reads or attribute in immaterial or attribute in IMMATERIAL["*"]:
            continue
        if attribute not in expected:
            raise SplitformerError(f"{where}{attribute} is an attribute {name} does not have as built (a "
                                   f"{type(value).__name__}); its forward may read it, the adapter does not")
        if not _same(value, expected[attribute], (part, counterpart)):
            raise SplitformerError(f"{where}{attribute} is {_brief(value)}, but {name} is built with "
                                   f"{_brief(expected[attribute])} from this configuration, which the adapter reads; "
                                   "rebuild the module instead of setting the attribute")


@cache
def _module_state() -> frozenset[str]:
    """What every ``torch.nn.Module`` holds (parts, tensors, hooks, ``training``): compared elsewhere, or not an attribute."""
    import torch

    return frozenset(vars(torch.nn.Module()))


def check_evaluated(owner: str, module: Any, dropout: float | None = None) -> None:
    """Refuse a part in training mode whose forward then computes otherwise than evaluated: a BatchNorm (batch
    statistics), or a part that drops at random with a rate above 0 (``Dropout.p``, ``DropPath.drop_prob``,
    ``PatchDropout.prob``, an attention's ``dropout``…) unless the adapter carries that rate as ``dropout``."""
    for path, part in module.named_modules():
        if not part.training:
            continue
        where = f"{owner}.{path}" if path else owner
        if runs_one_of(part, ("_BatchNorm",)):
            raise SplitformerError(f"{where} ({library_name(part)}) is in training mode: it normalizes with the "
                                   "batch's statistics, the generated code with its running ones; call .eval() on the module")
        rates = drop_rates(part)
        if rates and set(rates.values()) != {dropout}:
            name, rate = next(iter(rates.items()))
            raise SplitformerError(f"{where} ({shown_class(part)}) is in training mode with {name}={rate}: its forward "
                                   "drops at random, which the generated code does not; call .eval() on the module")


def drop_rates(part: Any) -> dict[str, float]:
    """The positive drop rates among ``part``'s plain attributes: any named ``*drop*`` (a number, or the largest
    of a tuple or list of them: x-transformers' ``layer_dropouts``), and ``p``/``prob`` of a library class named
    ``*Drop*`` (``Dropout``, ``PatchDropout``)."""
    dropping = "Drop" in (library_name(part) or "")
    rates = {}
    for name, value in vars(part).items():
        if not ("drop" in name.lower() or (dropping and name in ("p", "prob"))):
            continue
        numbers = [item for item in (value if isinstance(value, (tuple, list)) else (value,))
                   if isinstance(item, (int, float)) and not isinstance(item, bool)]
        if numbers and max(numbers) > 0:
            rates[name] = float(max(numbers))
    return rates


def _brief(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 and "\n" not in text else f"a {type(value).__name__}"
