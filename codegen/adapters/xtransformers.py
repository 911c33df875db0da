"""x-transformers ``Encoder``/``Decoder`` (and a ``TransformerWrapper``'s ``attn_layers``) → the
scheme that computes them and its canonical parameters.

x-transformers makes every block variant a flag; the reader recognizes each flag from the
built modules (their classes, parameters and attributes), composes the scheme file that
computes the block (``Adapted.scheme_file``: pre-norm ``on = …`` substeps, post-norm
projection substeps, both for ``pre_and_post_norm``; ½-steps of two feed-forward fields for
``macaron``; ``layer-norm``/``rms-norm`` projections; ``feed-forward`` or
``gated-feed-forward``; ``causal``) and reads the parameters:

- ``W`` is the transpose of each ``nn.Linear`` weight (row vectors, ``u @ W``); the attention
  has no biases (``LinearNoBias``), the feed-forward has them unless ``ff_no_bias``.
- Norm gains keep x-transformers' unit offset: the gain is ``γ + 1`` (``norm_add_unit_offset``).
- ``LayerNorm`` has no bias (``layer-norm`` with ``bias = false``); ``RMSNorm``, ``ScaleNorm`` and
  ``SimpleRMSNorm`` are ``x / max(‖x‖, 10⁻¹²) · √d · g`` = the ``rms-norm`` projection with
  ``ε = 10⁻²⁴ / d`` (0 at a zero token, as theirs) and the gain ``g`` (ScaleNorm's one gain read as ``d`` equal gains, SimpleRMSNorm's as ones).
- ``ff_relu_squared`` is the ``relu-squared`` activation (the ReLU projection, squared).
- A GLU feed-forward ``up ⊙ act(gate)`` reads its projection's second half as ``W_1`` (through
  the activation) and its first half as ``W_3``.
- ``weight_tie_layers``: one block's parameters, repeated for each layer it runs; ``build`` ties them
  (``Stack(tied=True)``: one control for all steps).
- ``use_layerscale``: a learned per-channel time step (``step = "per-channel"``): ``<field>.step`` is
  ``γ + unit offset``.
- ``rotary_pos_emb``: ``rotary-attention`` (interleaved pairs permuted into the kind's layout); a
  ``rotary_emb_dim`` below the head width (x-transformers' default, half of it) is ``rotary_dim``.
- ``rel_pos_bias``: ``scored-attention`` with ``rel_pos_bias`` (T5's table over bucketed distances).
- ``sandwich_norm``: the norm of a branch's output before the residual sum is the branch map
  ``then = "branch_normK"`` (a projection of the field's output), gain ``γ + 1``.
- ``gate_residual``: the GRU cell combining a branch's output with the state is the residual combiner
  ``combine = "gateK"`` (kind ``gru-gate``): ``W_i{r,z,n}``, ``W_h{r,z,n}`` are the transposed thirds of
  ``weight_ih``, ``weight_hh``, the biases the thirds of ``bias_ih``, ``bias_hh``.
- ``shift_tokens = k``: the branch input shifted along the tokens (``ShiftTokens``) is the token map
  ``shift = "shiftK"`` (kind ``token-shift``, ``reach = k``, ``causal`` for a Decoder's offsets ``0 … k``;
  a feed-forward's shift is given no mask: ``masked = false``).

Any other flag is refused in one line naming it. What was read is then probed (``probe.check_probe``): a float64
copy of the module and the generated forward of what the copy reads must agree on a random input, so that an
attribute edited after construction that the reader does not compare is refused, not computed otherwise.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from splitformer.symbolic.errors import SplitformerError
from splitformer.symbolic.toml_text import toml_value
from splitformer.symbolic.gated_residual import GATES

from .registry import adapter
from .adapted import Adapted, is_bias
from .arrays import array, linear_weight
from .common import activation_name
from .inspection import library_class, library_name
from .probe import check_probe, randomized
from .rope import exact_frequencies, read_theta

__all__ = ["read_attention_layers", "read_wrapper", "scheme_text"]

#: Classes of x-transformers that only a refused flag builds → that flag.
FLAG_OF_CLASS = {
    "AdaptiveLayerScale": "use_adaptive_layerscale",
    "OrthogonalResidualUpdate": "orthog_residual",
    "MVSplitResidualUpdate": "mv_split_residual", "HyperConnection": "num_residual_streams",
    "GatedMultiResidual": "gated_multi_residual", "DynamicTanh": "use_dynamic_tanh", "Derf": "use_derf",
    "AdaptiveLayerNorm": "use_adaptive_layernorm", "AdaptiveRMSNorm": "use_adaptive_rmsnorm",
    "DynamicPositionBias": "dynamic_pos_bias", "ConcatCombine": "unet_skips", "DynamicLIMe": "integrate_layers",
    "AttentionResidual": "attn_aggregated_residuals", "SoLU": "ff_solu",
}

#: ``AttentionLayers`` attributes whose value other than the default is a refused flag.
LAYERS_DEFAULTS = {
    "residual_attn": (False, "residual_attn"), "cross_residual_attn": (False, "cross_residual_attn"),
    "cross_attend": (False, "cross_attend"), "reinject_input": (False, "reinject_input"),
    "add_value_residual": (False, "add_value_residual"), "softclamp_output": (False, "softclamp_output"),
    "num_residual_streams": (1, "num_residual_streams"), "need_condition": (False, "use_adaptive_*"),
    "has_custom_layer_types": (False, "custom_layers / par_ratio / sandwich_coef"), "unet_skips": (False, "unet_skips"),
    "residual_scale": (None, "scale_residual / depth_scale_residual (a number)"),
}

#: ``Attention`` attributes whose value other than the default is a refused ``attn_*`` flag.
ATTENTION_DEFAULTS = {
    "sparse_topk": (None, "attn_sparse_topk"),
    "max_attend_past": (None, "attn_max_attend_past"), "num_mem_kv": (0, "attn_num_mem_kv"),
    "laser": (False, "attn_laser"), "orthog_projected_values": (False, "attn_orthog_projected_values"),
    "hybrid_module": (None, "attn_hybrid_module"),
    "data_dependent_alibi": (None, "attn_data_dependent_alibi"), "rel_proj_pos_bias": (None, "attn_use_rel_proj_pos_bias"),
    "q_rmsnorm": (None, "attn_qk_rmsnorm"), "k_rmsnorm": (None, "attn_k_rmsnorm"),
    "value_rmsnorm": (None, "attn_value_rmsnorm"), "head_scale": (False, "attn_head_scale"),
    "attn_on_attn": (False, "attn_on_attn"), "use_latent_q": (False, "attn_use_latent_q"),
    "use_latent_kv": (False, "attn_use_latent_kv"), "to_v_gate": (None, "attn_gate_values"),
    "to_output_gate": (None, "attn_output_gate"), "to_v_head_gate": (None, "attn_gate_value_heads"),
    "qkv_receive_diff_residuals": (False, "qkv_receive_diff_residuals"),
    "orthog_projected_values_per_head": (False, "attn_orthog_projected_values_per_head"),
}

#: The library class of each kind of branch (``layer_types``' ``a``, ``f``) the reader reads.
BRANCH_CLASSES = {"a": "Attention", "f": "FeedForward"}

#: ``Attend`` attributes (the score kernel) whose value other than the default is a refused flag.
ATTEND_DEFAULTS = {
    "pre_scale_post_talking_heads": (None, "attn_pre_scale_post_talking_heads"),
    "selective": (False, "attn_selective"), "cog_signed": (False, "attn_cog_signed"),
    "add_zero_kv": (False, "attn_add_zero_kv"), "head_learned_sink": (False, "attn_head_learned_sink"),
    "softclamp_logits": (False, "attn_softclamp_logits"), "cope": (None, "attn_use_cope"),
    "inverted_attention": (False, "inverted_attention"),
}

#: The other attributes of each module the reader knows: read and checked elsewhere (heads, causality,
#: layout, the score scale), immaterial to the forward (caches, dropout), or qualifying a flag refused
#: above (``qk_norm_*`` with ``qk_norm``). Any attribute in neither list is refused by name: a flag of
#: another x-transformers version may change the computation (an allowlist, not a list of refusals).
KNOWN_ATTRIBUTES = {
    "AttentionLayers": frozenset({
        "dim", "attn_heads", "attn_dim_head", "causal", "depth", "layer_types", "layers_execute_order",
        "len_default_block", "num_attn_layers", "num_cross_attn_layers", "num_ff_layers", "pre_norm", "sandwich_norm",
        "pre_and_post_norm", "rel_pos", "rotary_pos_emb", "polar_pos_emb", "can_cache_kv", "layer_dropouts",
        "cross_attn_tokens_dropout", "disable_abs_pos_emb", "depth_scale_residual", "dim_condition",
        "norm_need_condition", "post_branch_fn_needs_condition", "learned_reinject_input_gate", "reinject_input_proj",
        "softclamp_output_value", "stream_emb"}),
    "Attention": frozenset({
        "heads", "kv_heads", "groups", "causal", "scale", "can_cache_kv", "qk_norm", "sublayer_dropout", "rotate_num_heads",
        "gate_values_headwise", "output_gate_headwise", "to_v_gate_activation", "laser_softclamp_value",
        "qk_norm_groups", "qk_norm_dim_scale", "qk_norm_q_scale", "qk_norm_k_scale", "qk_norm_scale", "to_latent_q",
        "to_latent_kv", "to_rotateable_k", "hybrid_norms", "hybrid_mix", "hybrid_mask_kwarg", "to_value_residual_mix"}),
    "RelativePositionBias": frozenset({"scale", "causal", "num_buckets", "max_distance"}),
    "Attend": frozenset({"scale", "causal", "attn_fn", "pre_softmax_talking_heads", "post_softmax_talking_heads", "l2_distance", "create_causal_mask", "dropout", "flash",
                         "flash_pack_seq", "sdp_context_manager", "head_attn_sink", "logit_softclamp_value"}),
}

#: Score kernels of ``Attend`` other than the softmax (``attn_fn``'s function name → flag); any other
#: function than ``F.softmax`` is refused as ``attn_custom_attn_fn``.
ATTEND_FUNCTIONS = {"sigmoid": "attn_sigmoid", "one_hot_straight_through": "attn_hard",
                    "sparse_topk_attn": "attn_sparse_topk", "gumbel_softmax": "attn_gumbel_softmax"}

#: What reading an x-transformers norm as ``rms-norm`` (ε = 1e-24 / d) leaves to say.
NORM_NOTES = {
    "RMSNorm": "RMSNorm is x / max(‖x‖, 1e-12) · √d · g; read as rms-norm with ε = 1e-24 / d, which divides by "
               "√(mean x² + ε) = √(‖x‖² + 1e-24) / √d: equal to 1e-10 for tokens of norm above 1e-7, and 0 at a zero "
               "token as x-transformers' is (ε = 0 would give 0/0 there, e.g. a padded query's zero branch output)",
    "ScaleNorm": "ScaleNorm's one gain is read as d equal per-feature gains: a generated Block trains them untied",
    "SimpleRMSNorm": "SimpleRMSNorm has no gain: read as rms-norm with unit gains (a generated Block trains them)",
}


#: The options of ``scored-attention`` as words of a scheme name.
SCORE_WORDS = {"qk_norm": "qk-norm", "alibi": "alibi", "rel_pos_bias": "t5", "pre_talking_heads": "th-pre", "post_talking_heads": "th-post"}


#: Why a refused flag is not computed, where more can be said than that it is not.
REASONS = {
    "scale_residual": "a learned skip scale is not in the scheme language",
    "dynamic_pos_bias": "an attention-score kernel splitformer does not compute",
}


def _refuse(owner: str, flag: str, why: str = "") -> SplitformerError:
    return SplitformerError(f"{owner} uses {flag}; {why or REASONS.get(flag, 'splitformer does not compute it')}")


def _check_defaults(owner: str, module: Any, defaults: dict[str, tuple[Any, str]], why: str) -> None:
    """Refuse an attribute of ``module`` that is neither in ``defaults`` nor known (``KNOWN_ATTRIBUTES``),
    then each of ``defaults`` that is not at its default value."""
    known = _by_library_class(KNOWN_ATTRIBUTES, module) or frozenset()
    for attribute, value in vars(module).items():
        if not attribute.startswith("_") and attribute != "training" and attribute not in defaults and attribute not in known:
            raise SplitformerError(f"{owner} has {type(module).__name__}.{attribute}={value!r}, an attribute the reader "
                                   "does not know (a flag of this x-transformers version that splitformer does not read)")
    for attribute, (default, flag) in defaults.items():
        value = getattr(module, attribute, default)
        if value is not default and value != default:
            raise _refuse(owner, flag, why)


def _by_library_class(table: dict[str, Any], module: Any) -> Any:
    """``table``'s entry for the first class in the MRO of ``module``'s library class (``inspection.library_class``;
    ``Encoder`` is an ``AttentionLayers``); never by a user class's own name (``class Attention(FeedForward)``)."""
    klass = library_class(module)
    return next((table[base.__name__] for base in (klass.__mro__ if klass else ()) if base.__name__ in table), None)


def _check_classes(owner: str, modules: Iterable[Any]) -> None:
    for module in modules:
        flag = _by_library_class(FLAG_OF_CLASS, module)
        if flag is not None:
            raise _refuse(owner, flag)


def _heads(weight: np.ndarray, width: int, heads: list[int]) -> np.ndarray:
    """The columns of ``weight`` (``(d, n · width)``) of each head in ``heads``, in that order."""
    return np.concatenate([weight[:, head * width:(head + 1) * width] for head in heads], axis=1)


def _check_attention(owner: str, attention: Any, dim: int, heads: int) -> int:
    """Refuse the flags of an x-transformers ``Attention`` that no option computes; its head width."""
    import torch

    _check_defaults(owner, attention, ATTENTION_DEFAULTS, "")
    _check_defaults(owner, attention.attend, ATTEND_DEFAULTS, "an attention-score kernel splitformer does not compute")
    function = attention.attend.attn_fn
    while isinstance(function, partial):
        function = function.func
    if function is not torch.nn.functional.softmax or attention.attend.l2_distance:
        flag = "attn_l2_distance" if attention.attend.l2_distance else ATTEND_FUNCTIONS.get(
            getattr(function, "__name__", ""), "attn_custom_attn_fn")
        raise _refuse(owner, flag, "an attention-score kernel splitformer does not compute")
    _check_attend_functions(owner, attention.attend)
    if getattr(attention, "rotate_num_heads", heads) != heads:
        raise _refuse(owner, f"rotate_num_heads={attention.rotate_num_heads}", "rotary-attention rotates every head")
    width = attention.to_q.out_features // attention.heads
    if attention.heads != heads:
        raise _refuse(owner, f"an attention of {attention.heads} heads in layers of {heads}",
                      "a generated Stack has one number of heads")
    if attention.to_v.out_features != attention.kv_heads * width:
        raise _refuse(owner, f"attn_value_dim_head={attention.to_v.out_features // attention.kv_heads}")
    if attention.qk_norm and attention.qk_norm_groups != 1:
        raise _refuse(owner, f"attn_qk_norm_groups={attention.qk_norm_groups}", "qk_norm normalizes whole heads")
    names = {name for name, _ in attention.named_parameters()}
    extra = sorted(names - {"to_q.weight", "to_k.weight", "to_v.weight", "to_out.weight", "qk_norm_q_scale",
                            "qk_norm_k_scale", *(f"attend.{when}_softmax_talking_heads.weight" for when in ("pre", "post"))})
    if extra or library_name(attention.to_out) not in ("Linear", "Identity"):
        raise _refuse(owner, f"an attention with parameter {extra[0] if extra else 'to_out'}")
    if library_name(attention.to_out) == "Identity" and attention.heads * width != dim:  # the heads' outputs, joined
        raise _refuse(owner, f"an attention without to_out whose {attention.heads * width} output features are not "
                      f"the model's {dim}")
    return width


def _check_attend_functions(owner: str, attend: Any) -> None:
    """Refuse functions an ``Attend`` keeps per instance other than x-transformers' own objects (compared by
    identity): a callable there may compute otherwise only on paths a probe does not take (grad enabled, longer
    inputs). ``attn_fn``: ``F.softmax`` over the keys (float32 or not); ``create_causal_mask``: x-transformers' (or its
    ONNX variant); ``sdp_context_manager``: a partial of torch's SDPA kernel selection."""
    import torch
    from x_transformers import attend as library

    softmax = attend.attn_fn
    if not (isinstance(softmax, partial) and softmax.func is torch.nn.functional.softmax and not softmax.args
            and softmax.keywords in ({"dim": -1}, {"dim": -1, "dtype": torch.float32})):
        raise _refuse(owner, f"Attend.attn_fn={softmax!r}", "the score kernel is F.softmax over the keys")
    if not any(attend.create_causal_mask is getattr(library, name, None)
               for name in ("create_causal_mask", "onnx_create_causal_mask")):
        raise _refuse(owner, f"Attend.create_causal_mask={attend.create_causal_mask!r}",
                      "the causal mask is x-transformers' create_causal_mask")
    kernels = [getattr(torch.nn.attention, "sdpa_kernel", None), getattr(torch.backends.cuda, "sdp_kernel", None)]
    manager = getattr(attend, "sdp_context_manager", None)
    if manager is not None and not (isinstance(manager, partial) and any(manager.func is kernel for kernel in kernels)):
        raise _refuse(owner, f"Attend.sdp_context_manager={manager!r}", "the SDPA context is torch's kernel selection")


def _attention(owner: str, attention: Any, dim: int, heads: int,
               rel_pos: Any) -> tuple[dict[str, np.ndarray], dict, set[str]]:
    """``attn.*`` of an x-transformers ``Attention``, the attention operator's options and the names among them the
    source holds fixed (no parameter there: ``W_o = I``, unit qk-norm gains, ALiBi's slopes); refuses its other flags.

    ``attn_kv_heads``: key/value head ``h mod n_kv`` serves query head ``h`` (x-transformers' repeat), read as
    multi-head attention with those columns of ``W_k``, ``W_v`` repeated. ``attn_dim_head`` other than ``dim / heads``
    is the option ``d_head`` (``W_q``: ``(dim, heads · d_head)``). The score scale ``s`` (``d_head^{-1/2}``, or
    qk-norm's) against the kind's ``d_head^{-1/2}``: ``s √d_head`` multiplies ``W_q`` (where they differ), or is ``q_gain`` (``attn_qk_norm``; times the learned ``attn_qk_norm_dim_scale`` gains, when set). Talking
    heads: ``mix_pre`` and ``mix_post`` are the pre- and post-softmax 1×1 convolutions' weights.
    ``alibi_pos_bias``: the slopes, zero for heads beyond ``alibi_num_heads``. ``rel_pos_bias``: the table
    ``relative_attention_bias`` times its scale (``√d_head``, added to the scaled scores as it is), bucketed
    as x-transformers' ``causal`` says, with its ``max_distance``.
    """
    import torch

    width = _check_attention(owner, attention, dim, heads)
    scale = width ** -0.5 if attention.attend.scale is None else attention.attend.scale  # None: x-transformers' default
    if type(scale) not in (int, float) or not math.isfinite(scale):
        raise _refuse(owner, f"Attend.scale={scale!r}", "the score scale is a finite number")
    rescale = scale * np.sqrt(width)
    shared = [head % attention.kv_heads for head in range(heads)]  # x-transformers' repeat '(r kvh)'
    weights = {part: linear_weight(getattr(attention, f"to_{part}").weight) for part in ("q", "k", "v")}
    identity = library_name(attention.to_out) == "Identity"  # no output projection: the heads' outputs, joined
    weights["out"] = np.eye(dim, dtype=weights["q"].dtype) if identity else linear_weight(attention.to_out.weight)
    fixed = {"attn.W_o"} if identity else set()
    weights |= {part: _heads(weights[part], width, shared) for part in "kv"}
    if not attention.qk_norm and not math.isclose(rescale, 1.0, rel_tol=1e-12):
        weights["q"] = weights["q"] * rescale  # a score scale other than d_head^{-1/2}
    params = {f"attn.W_{part[0]}": weight for part, weight in weights.items()}
    options: dict[str, Any] = {} if width == dim // heads and dim % heads == 0 else {"d_head": width}
    if attention.qk_norm:
        for name in ("qk_norm_q_scale", "qk_norm_k_scale"):
            if not isinstance(getattr(attention, name), torch.Tensor):
                _check_unit(owner, f"Attention.{name}", getattr(attention, name))
        scales = [array(scale).reshape(-1, width) if isinstance(scale, torch.Tensor) else np.ones((count, width))
                  for scale, count in ((attention.qk_norm_q_scale, heads), (attention.qk_norm_k_scale, attention.kv_heads))]
        gains = {"q": rescale * scales[0], "k": scales[1][shared]}
        fixed |= {f"attn.{part}_gain" for part in "qk" if not isinstance(getattr(attention, f"qk_norm_{part}_scale"),
                                                                           torch.Tensor)}
        params |= {f"attn.{part}_gain": gain.reshape(-1).astype(params["attn.W_q"].dtype) for part, gain in gains.items()}
        options["qk_norm"] = True
    for when in ("pre", "post"):  # x-transformers: s + W s before, W γ after the softmax
        mixing = getattr(attention.attend, f"{when}_softmax_talking_heads")
        if mixing is not None:
            params[f"attn.mix_{when}"] = array(mixing.weight)[:, :, 0, 0]
            options[f"{when}_talking_heads"] = True
    if library_name(rel_pos) == "AlibiPositionalBias":
        params["attn.slopes"] = _alibi_slopes(owner, rel_pos, heads)
        fixed.add("attn.slopes")  # a buffer
        options["alibi"] = True
    if library_name(rel_pos) == "RelativePositionBias":
        _check_defaults(owner, rel_pos, {}, "")
        rows = rel_pos.relative_attention_bias.weight.shape[0]
        if type(rel_pos.num_buckets) is not int or rel_pos.num_buckets != rows:  # its forward buckets by the attribute
            raise _refuse(owner, f"RelativePositionBias.num_buckets={rel_pos.num_buckets!r}",
                          f"its table has {rows} rows, and the generated code reads the buckets off the table")
        if type(rel_pos.max_distance) is not int:  # written into the scheme file: exact, as num_buckets
            raise _refuse(owner, f"RelativePositionBias.max_distance of type {type(rel_pos.max_distance).__name__}",
                          "the scheme file holds it as an int, and the forward computes with the object")
        exact = (rows if rel_pos.causal else rows // 2) // 2  # T5's exact buckets per direction
        if not 1 <= exact < rel_pos.max_distance:
            raise _refuse(owner, f"RelativePositionBias.max_distance={rel_pos.max_distance!r} with num_buckets={rows}",
                          f"T5's logarithmic buckets divide by log(max_distance / {exact}), {exact} the exact buckets "
                          "per direction: x-transformers' own are then not finite, and indices out of its table")
        params["attn.rel_bias"] = array(rel_pos.relative_attention_bias.weight) * rel_pos.scale
        options |= {"rel_pos_bias": "causal" if rel_pos.causal else "bidirectional", "max_distance": rel_pos.max_distance}
    return params, options, fixed


def _alibi_slopes(owner: str, alibi: Any, heads: int) -> np.ndarray:
    """The ``(heads,)`` slopes of x-transformers' ``AlibiPositionalBias``, zero past its alibied heads.

    Its forward returns its cached ``bias`` (``−|j − i| m(h)``, kept from a longer earlier input) rather
    than computing it from the slopes: a cache that disagrees with the slopes (either edited) is refused."""
    slopes = array(alibi.slopes).reshape(-1)
    if alibi.total_heads != heads or len(slopes) > heads:
        raise _refuse(owner, f"AlibiPositionalBias with {len(slopes)} slopes of total_heads={alibi.total_heads!r}",
                      f"the attention has {heads} heads")
    padded = np.concatenate([slopes, np.zeros(heads - len(slopes), slopes.dtype)])
    if alibi.bias is not None:
        cached = array(alibi.bias)
        rows, columns = cached.shape[-2:] if cached.ndim == 3 else (0, 0)
        distance = np.abs(np.arange(columns)[None, :] - np.arange(columns - rows, columns)[:, None])
        expected = -distance * padded[:, None, None]
        scale = max(float(np.abs(expected).max(initial=0.0)), 1e-300)
        if cached.shape != expected.shape or not np.abs(cached - expected).max(initial=0.0) <= 1e-6 * scale:
            raise _refuse(owner, f"an AlibiPositionalBias.bias {tuple(cached.shape)} other than its slopes give",
                          "its forward returns the cached bias (edited, or the slopes edited after it was cached), "
                          "the generated code computes −|j − i| m(h) from the slopes")
    return padded


def _feed_forward(owner: str, feed_forward: Any, key: str) -> tuple[dict[str, np.ndarray], str, bool, bool, set[str]]:
    """``(params, activation, gated, bias, fixed)`` of an x-transformers ``FeedForward``; ``fixed``: ``b_2`` where the
    output has no bias but the GLU projection has (``ff_glu`` with ``ff_no_bias``): zero, held out of training."""
    import torch

    _check_classes(owner, feed_forward.modules())
    kinds = {library_name(module) for module in feed_forward.modules()}
    if "LayerNorm" in kinds:
        raise _refuse(owner, "ff_post_act_ln")
    if "Lambda" in kinds:
        raise _refuse(owner, "ff_softclamp_value")
    linears = [module for module in feed_forward.modules() if isinstance(module, torch.nn.Linear)]
    glu = next((module for module in feed_forward.modules() if library_name(module) == "GLU"), None)
    if glu is not None:
        if isinstance(glu.mult_bias, torch.nn.Parameter):
            raise _refuse(owner, "ff_glu_mult_bias")
        _check_unit(owner, "GLU.mult_bias", glu.mult_bias)
        if glu.up_softclamp_value is not None:
            raise _refuse(owner, "ff_glu_softclamp")
        act = glu.act
    else:
        act = next(module for module in feed_forward.ff[0] if not isinstance(module, torch.nn.Linear))
    activation = "relu-squared" if library_name(act) == "ReluSquared" else activation_name(f"{owner}.ff (ff_custom_activation)", act)
    into, out = linears
    biases = [into.bias is not None, out.bias is not None]
    if biases[1] and not biases[0]:
        raise _refuse(owner, "a feed-forward whose output has a bias and its input projection none",
                      "the feed-forward kinds have all their biases or none")
    params, fixed = {}, set()
    if biases[0] and not biases[1]:  # ff_glu with ff_no_bias: the GLU projection keeps its bias, the output drops it
        params[f"{key}.b_2"] = np.zeros(out.weight.shape[0], dtype=array(out.weight).dtype)
        fixed.add(f"{key}.b_2")
    if glu is not None:
        up, gate = np.split(linear_weight(into.weight), 2, axis=1)
        params |= {f"{key}.W_1": np.ascontiguousarray(gate), f"{key}.W_3": np.ascontiguousarray(up)}
        if biases[0]:
            up_bias, gate_bias = np.split(array(into.bias), 2)
            params |= {f"{key}.b_1": gate_bias, f"{key}.b_3": up_bias}
    else:
        params[f"{key}.W_1"] = linear_weight(into.weight)
        if biases[0]:
            params[f"{key}.b_1"] = array(into.bias)
    params[f"{key}.W_2"] = linear_weight(out.weight)
    if biases[1]:
        params[f"{key}.b_2"] = array(out.bias)
    return params, activation, glu is not None, biases[0], fixed


def _is_number(value: Any, expected: float) -> bool:
    """Whether ``value`` is the plain number ``expected`` (an attribute a forward multiplies by, as built)."""
    return type(value) in (int, float) and value == expected


def _check_unit(owner: str, attribute: str, value: Any) -> None:
    """Refuse a factor the forward multiplies by that is not the 1 the reader assumes (edited after construction)."""
    if not _is_number(value, 1):
        raise _refuse(owner, f"{attribute}={value!r}", "the reader assumes the constructor's factor 1")


def _norm(owner: str, norm: Any, dim: int, dtype: np.dtype) -> tuple[str, float, np.ndarray]:
    """``(kind, ε, gain)`` of an x-transformers norm, the unit offset added to the gain."""
    name = library_name(norm)
    if name in ("RMSNorm", "ScaleNorm", "SimpleRMSNorm") and not _is_number(norm.scale, dim ** 0.5):
        raise _refuse(owner, f"{name}.scale={norm.scale!r}", f"the norm is read as rms-norm times √d = {dim ** 0.5!r}")
    offset = float(getattr(norm, "unit_offset", False))
    if name == "LayerNorm" and hasattr(norm, "gamma"):
        return "layer-norm", float(norm.ln.eps), array(norm.gamma) + offset
    eps = 1e-24 / dim  # F.normalize's max(‖x‖, 1e-12) as √(‖x‖² + d ε): 0, not 0/0, at a zero token
    if name == "RMSNorm":
        return "rms-norm", eps, array(norm.g) + offset
    if name == "ScaleNorm":
        return "rms-norm", eps, np.full(dim, array(norm.g)[0] + offset)
    if name == "SimpleRMSNorm":
        return "rms-norm", eps, np.ones(dim, dtype=dtype)
    raise _refuse(owner, FLAG_OF_CLASS.get(name, f"the norm {name}"))


def _sublayers(owner: str, layers: Any) -> list[list[tuple[str, Any, tuple[Any, Any, Any], Any]]]:
    """The blocks run, each a list of ``(type 'a'/'f', branch module, (pre, sandwich, post norm), residual)``."""
    block = ("f", "a", "f") if layers.layer_types[:3] == ("f", "a", "f") else ("a", "f")
    if "c" in layers.layer_types:
        raise _refuse(owner, "cross_attend", "cross-attention to a context is not read (the decoder schemes' "
                      "cross-attention has biases and a LayerNorm of their own)")
    if len(layers.layers) != len(layers.layer_types):  # x-transformers zips its layer types with per-layer options
        raise _refuse(owner, f"{len(layers.layers)} layers built for {len(layers.layer_types)} layer types",
                      "a per-layer option shorter than the layers (a shift_tokens tuple of one entry per layer: "
                      "x-transformers builds as many layers as it has entries)")
    order = list(layers.layers_execute_order)
    run = [layers.layer_types[index] for index in order]
    if len(run) % len(block) or tuple(run) != block * (len(run) // len(block)):
        ordered = f" in layers_execute_order={tuple(order)}" if order != sorted(order) else ""
        made = ordered or " (as only_attn, custom_layers, par_ratio or sandwich_coef make them)"
        raise _refuse(owner, f"layer types {''.join(run)}{made}", f"a stack repeats one block {''.join(block)}")
    tied = order != list(range(len(layers.layer_types)))
    if tied and order != list(range(len(block))) * (len(order) // len(block)):
        raise _refuse(owner, f"layers_execute_order={tuple(order)}", "only weight_tie_layers' order repeats a block")
    blocks = []
    for start in range(0, len(order), len(block)):
        parts = []
        for index in order[start:start + len(block)]:
            norms, branch, residual = layers.layers[index]
            _check_classes(owner, [residual, branch, *norms])
            if library_name(residual) not in ("Residual", "GRUGating"):
                raise _refuse(owner, f"the residual {type(residual).__name__}")
            if residual.residual_scale is not None or getattr(residual, "scale_residual_constant", 1) != 1:
                raise _refuse(owner, "scale_residual" if residual.residual_scale is not None else "scale_residual_constant",
                              REASONS["scale_residual"])
            parts.append((layers.layer_types[index], branch, tuple(norms), residual))
        blocks.append(parts)
    return blocks


def _fraction(owner: str, branch: Any, macaron_ff: bool) -> tuple[Any, str | None]:
    """The branch module inside x-transformers' ``Scale`` (½ for a macaron feed-forward) and its fraction."""
    if library_name(branch) != "Scale":
        return branch, None
    if not (macaron_ff and branch.scale == 0.5):
        raise _refuse(owner, f"a branch scaled by {branch.scale}", "scale_residual / depth_scale_residual")
    return branch.fn, "1/2"


def _gru_gate(owner: str, gating: Any, key: str, dim: int) -> dict[str, np.ndarray]:
    """The ``gru-gate`` parameters of ``GRUGating``'s ``GRUCell(branch, state)``: each weight's thirds
    (torch's order r, z, n) transposed to row vectors, each bias's thirds."""
    cell, params = gating.gru, {}
    if not cell.bias or (cell.input_size, cell.hidden_size) != (dim, dim):
        raise _refuse(owner, "gate_residual with a GRUCell other than GRUCell(dim, dim) with biases")
    for source, weight, bias in (("i", cell.weight_ih, cell.bias_ih), ("h", cell.weight_hh, cell.bias_hh)):
        for third, gate in enumerate(GATES):
            params[f"{key}.W_{source}{gate}"] = linear_weight(weight[third * dim:(third + 1) * dim])
            params[f"{key}.b_{source}{gate}"] = array(bias[third * dim:(third + 1) * dim])
    return params


def _layer_scale(branch: Any) -> tuple[Any, np.ndarray | None]:
    """The branch inside ``LayerScale`` (``use_layerscale``) and its per-channel step ``γ + unit offset``."""
    if library_name(branch) != "LayerScale":
        return branch, None
    return branch.fn, array(branch.gamma) + float(branch.unit_offset)


@dataclass
class _Block:
    """One block read: canonical parameters, the scheme's operators and steps, the ε and activations seen."""

    params: dict[str, np.ndarray] = field(default_factory=dict)
    operators: dict[str, dict[str, Any]] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)
    eps: set[float] = field(default_factory=set)
    activations: set[str] = field(default_factory=set)
    notes: set[str] = field(default_factory=set)
    #: Canonical names the source holds fixed (not parameters there): ``build`` leaves them out of training.
    fixed: set[str] = field(default_factory=set)

    def norm(self, owner: str, name: str, norm: Any, dim: int, dtype: np.dtype) -> None:
        kind, eps, gain = _norm(owner, norm, dim, dtype)
        self.notes.add(NORM_NOTES.get(library_name(norm), ""))
        if library_name(norm) == "SimpleRMSNorm":  # unit gains, no parameter
            self.fixed.add(f"{name}.gain")
        self.eps.add(eps)
        self.params[f"{name}.gain"] = gain
        self.operators[name] = {"kind": kind, "bias": False} if kind == "layer-norm" else {"kind": kind}


    def rotary(self, owner: str, heads: int, rotary_dim: int) -> None:
        """The attention as ``rotary-attention``: x-transformers pairs features ``(2r, 2r + 1)`` of a head
        (interleaved), the kind pairs ``(r, r + d_head/2)``; the scores only see the pairs, so the
        query and key kernels' columns are permuted from one layout into the other. A partial rotation
        (``rotary_dim`` below the head width) rotates x-transformers' first ``rotary_dim`` features: after the
        same permutation, the kind's first ``rotary_dim / 2`` pairs; its other features, paired the same way,
        turn by the angle zero."""
        for part in ("W_q", "W_k"):
            kernel = self.params[f"attn.{part}"]
            pairs = kernel.reshape(kernel.shape[0], heads, -1, 2)  # (d, head, r, c) interleaved
            self.params[f"attn.{part}"] = np.ascontiguousarray(pairs.transpose(0, 1, 3, 2)).reshape(kernel.shape)
        if set(self.operators["attn"]) - {"kind", "bias", "d_head"}:
            scores = ", ".join(sorted(set(self.operators["attn"]) - {"kind", "bias", "d_head"}))
            raise _refuse(owner, f"rotary_pos_emb with {scores}", "rotary-attention has no score options")
        width = {"d_head": self.operators["attn"]["d_head"]} if "d_head" in self.operators["attn"] else {}
        self.operators["attn"] = {"kind": "rotary-attention"} | width | ({"rotary_dim": rotary_dim} if rotary_dim else {})


def _rope_theta(owner: str, rotary: Any, dim_head: int) -> tuple[float, int]:
    """θ of x-transformers' ``RotaryEmbedding`` (θ^(−2r/R) for its ``R = rotary_emb_dim`` features) and ``R``,
    0 where it rotates the whole head; xpos and interpolated positions are refused by name."""
    rotated = 2 * len(rotary.inv_freq)
    if rotary.scale is not None:
        raise _refuse(owner, "rotary_xpos", "a position-dependent scale of the rotated pairs is not computed")
    if rotary.interpolation_factor != 1:
        raise _refuse(owner, f"rotary_interpolation_factor={rotary.interpolation_factor}",
                      "rotary-attention rotates by the token positions themselves")
    if dim_head % 2:
        raise _refuse(owner, f"rotary_pos_emb with attn_dim_head={dim_head}", "rotary-attention pairs the features "
                      "of a head: its width is even")
    if rotated < 4:
        raise _refuse(owner, f"rotary_emb_dim={rotated}", "one rotated pair carries no rotary base")
    theta = read_theta(rotary.inv_freq, rotated)
    if theta is None:
        raise _refuse(owner, "rotary frequencies other than θ^(−2r/rotary_emb_dim) for any θ (x-transformers computes "
                      "them in float32: its buffer is exactly that rounding)")
    return theta, 0 if rotated == dim_head else rotated


def _token_shift(owner: str, branch: Any, attention: bool) -> tuple[Any, dict | None]:
    """The branch inside ``ShiftTokens`` (``shift_tokens``) and the ``token-shift`` operator computing its shift."""
    if library_name(branch) != "ShiftTokens":
        return branch, None
    shifts, reach = tuple(branch.shifts), max(branch.shifts)
    causal = shifts[0] == 0
    if shifts != tuple(range(0 if causal else -reach, reach + 1)):
        raise _refuse(owner, f"shift_tokens with the offsets {shifts}", "token-shift's offsets are −k … k or 0 … k")
    return branch.fn, {"kind": "token-shift", "reach": reach, "causal": causal, "masked": attention}


def _block(owner: str, parts: list, dim: int, heads: int, dtype: np.dtype, rel_pos: Any) -> _Block:
    """One block: pre-norm fields are substeps ``on`` their norm, post-norms projection substeps after them."""
    macaron = len(parts) == 3
    block = _Block()
    for position, (kind, branch, (pre, sandwich, post), residual) in enumerate(parts, start=1):
        branch, layer_scale = _layer_scale(branch)  # LayerScale wraps the macaron's ½ (Scale): both scale the output
        branch, shift = _token_shift(owner, branch, kind == "a")  # ShiftTokens wraps the branch (and its ½)
        branch, fraction = _fraction(owner, branch, macaron and kind == "f")
        expected = BRANCH_CLASSES[kind]
        if library_name(branch) != expected:
            raise SplitformerError(f"{owner}'s {kind!r} layer {position} is {type(branch).__name__}, running "
                                   f"{library_name(branch) or 'no library class'}, not {expected}; the reader reads "
                                   "x-transformers' own branch classes, never by a user class's name")
        step: dict[str, Any] = {"operator": "", "solver": "explicit"}
        if pre is not None:
            step["on"] = f"norm{position}"
            block.norm(owner, step["on"], pre, dim, dtype)
        if shift is not None:  # the branch input shifted along the tokens (after its pre-norm)
            step["shift"] = f"shift{position}"
            block.operators[step["shift"]] = shift
        if kind == "a":
            step["operator"] = "attn"
            params, options, fixed = _attention(owner, branch, dim, heads, rel_pos)
            block.params |= params
            block.fixed |= fixed
            if branch.kv_heads != heads:
                block.notes.add(f"the {branch.kv_heads} key/value heads are read repeated for the {heads} query heads: "
                                "a generated Stack trains the copies untied")
            scored = set(options) - {"d_head"}  # the head width is an option of every attention kind
            block.operators["attn"] = {"kind": "scored-attention" if scored else "attention", "bias": False} | options
        else:
            step["operator"] = ("ffn_pre" if position == 1 else "ffn_post") if macaron else "ffn"
            params, activation, gated, bias, fixed = _feed_forward(owner, branch, step["operator"])
            block.params |= params
            block.fixed |= fixed
            block.activations.add(activation)
            block.operators[step["operator"]] = {"kind": "gated-feed-forward" if gated else "feed-forward", "bias": bias}
        if fraction is not None:
            step["fraction"] = fraction
        if sandwich is not None:  # a projection of the field's output before it is added (a branch map)
            if fraction is not None or layer_scale is not None:
                raise _refuse(owner, "sandwich_norm with macaron or use_layerscale", "x-transformers normalizes the "
                              "scaled branch output; the scheme's branch map is applied before the step's scale")
            step["then"] = f"branch_norm{position}"
            block.norm(owner, step["then"], sandwich, dim, dtype)
        if layer_scale is not None:  # a learned diagonal time step λ(y)
            step["step"] = "per-channel"
            block.params[f"{step['operator']}.step"] = layer_scale
        if library_name(residual) == "GRUGating":  # the residual combiner c(u, v) = GRU(v, u) − u
            if layer_scale is not None or fraction is not None:
                raise _refuse(owner, "gate_residual with use_layerscale or macaron", "a combined field takes no "
                              "learned step or fraction in the scheme language")
            step["combine"] = f"gate{position}"
            block.operators[step["combine"]] = {"kind": "gru-gate"}
            block.params |= _gru_gate(owner, residual, step["combine"], dim)
        block.steps.append(step)
        if post is not None:
            name = f"post_norm{position}" if pre is not None else f"norm{position}"
            block.norm(owner, name, post, dim, dtype)
            block.steps.append({"operator": name, "solver": "projection"})
    return block


def _toml(value: Any) -> str:
    """``value`` as TOML, exact types only (an int subclass could print other text or raw TOML)."""
    return toml_value(value, "from_xtransformers: the scheme file")


def scheme_text(name: str, summary: str, block: _Block, activation: str, causal: bool, final_norm: bool) -> str:
    """The scheme file (TOML) computing ``block``: its operators, steps, activation, causality, final norm;
    a padded token is no query either (x-transformers zeroes its attention rows, which its unmasked
    feed-forward token shift then reads)."""
    lines = [f"name = {_toml(name)}", f"summary = {_toml(summary)}", f"activation = {_toml(activation)}",
             f"causal = {_toml(causal)}", "order = 1", "splitting_order = 1", f"final_norm = {_toml(final_norm)}",
             "padded_queries_outside = true", "", "[operators]"]
    lines += [f"{key} = {_toml(kind)}" for key, kind in block.operators.items()]
    for step in block.steps:
        lines += ["", "[[steps]]", *(f"{key} = {_toml(value)}" for key, value in step.items())]
    return "\n".join(lines) + "\n"


def _name(layers: Any, parts: list, block: _Block) -> tuple[str, str]:
    """A scheme name and summary saying what the block is (``xt-pre-layer-norm-gelu``)."""
    pre, sandwich, post = parts[0][2]
    layout = "pre-post" if pre is not None and post is not None else "pre" if pre is not None else "post"
    layout = "sandwich" if sandwich is not None else layout
    norm = next(kind["kind"] for key, kind in block.operators.items() if "norm" in key)
    ffn = next(kind for key, kind in block.operators.items() if key.startswith("ffn"))
    gated = "glu-" if ffn["kind"] == "gated-feed-forward" else ""
    rotary = "" if block.operators["attn"]["kind"] != "rotary-attention" else \
        f"rotary{block.operators['attn']['rotary_dim']}" if "rotary_dim" in block.operators["attn"] else "rotary"
    width = f"head{block.operators['attn']['d_head']}" if "d_head" in block.operators["attn"] else ""
    combined = "gru-gated" if any("combine" in step for step in block.steps) else ""
    shifted = "shift" if any("shift" in step for step in block.steps) else ""
    scaled = "layerscale" if any(step.get("step") == "per-channel" for step in block.steps) else ""
    words = ["xt", "macaron" if len(parts) == 3 else "", layout, combined, shifted, scaled, width, rotary, norm,
             gated + next(iter(block.activations)),
             "" if ffn["bias"] else "no-bias", "causal" if layers.causal else ""]
    scores = [SCORE_WORDS[option] for option in block.operators["attn"] if option in SCORE_WORDS]
    name = "-".join(word for word in words + scores if word)
    if len(name) > 64:  # a scheme name has ≤ 64 characters: the cut ends in a digest of the whole, so names stay apart
        name = name[:57].rstrip("-") + "-" + hashlib.sha256(name.encode()).hexdigest()[:6]
    summary = (f"x-transformers {'Decoder' if layers.causal else 'Encoder'}: {layout}-norm "
               f"{'macaron ' if len(parts) == 3 else ''}block with {norm} and a {ffn['kind']} ({gated}{next(iter(block.activations))})"
               + (f"; attention scores with {', '.join(scores)}" if scores else "")
               + ("; GRU-gated residuals" if combined else "") + ("; token shift" if shifted else "")
               + ("; a learned per-channel step (LayerScale)" if scaled else ""))
    return name, summary


def _causal(owner: str, layers: Any) -> bool:
    """The causality x-transformers' forward applies: the layers' ``causal``, each ``Attention``'s (passed to its
    ``Attend``) and each ``Attend``'s must agree with one another and with the class (``Decoder``: causal)."""
    causal = layers.causal
    if type(causal) is not bool:
        raise _refuse(owner, f"causal={causal!r}", "causal is True or False")
    if {"Decoder": False, "Encoder": True}.get(owner) is causal:
        raise _refuse(owner, f"causal={causal}", f"an x-transformers {owner} is {'' if owner == 'Decoder' else 'not '}causal")
    for path, module in layers.named_modules():
        if library_name(module) in ("Attention", "Attend") and module.causal is not causal:
            raise _refuse(owner, f"{path}.causal={module.causal!r} while the layers' causal={causal}",
                          "a generated Stack applies one causality to every attention")
    return causal


def _first_difference(block: Any, first: Any, index: int) -> str:
    """Where layer ``index``'s block first differs from layer 0's (a per-layer flag, such as ``shift_tokens``
    given one value per layer), in words."""
    for name in sorted(set(block.operators) | set(first.operators)):
        if block.operators.get(name) != first.operators.get(name):
            return f"layer {index}'s {name} is {block.operators.get(name)!r}, layer 0's {first.operators.get(name)!r}"
    step = next(number for number, (mine, theirs) in enumerate(zip(block.steps, first.steps)) if mine != theirs) \
        if len(block.steps) == len(first.steps) else min(len(block.steps), len(first.steps))
    return (f"layer {index}'s step {step} is {block.steps[step] if step < len(block.steps) else None!r}, layer 0's "
            f"{first.steps[step] if step < len(first.steps) else None!r}")


@adapter("xtransformers", "Encoder", "Decoder", "AttentionLayers")
def read_attention_layers(layers: Any, *, probe: bool = True) -> Adapted:
    """An x-transformers ``Encoder``/``Decoder``: a stack of one composed scheme (``Adapted.scheme_file``).

    ``probe``: run the module and the generated forward of what was read on a random input, refusing a
    difference (``probe.check_probe``); off only where the writer reads parameters set to 0, 1, … on purpose."""
    owner = type(layers).__name__
    # custom_layers spelling the default layout (x-transformers then sets depth to their count, or keeps a given one)
    plain = getattr(layers, "has_custom_layer_types", False) is True and len(layers.layer_types) % 2 == 0 and \
        tuple(layers.layer_types) == ("a", "f") * (len(layers.layer_types) // 2)
    accepted = {"has_custom_layer_types": (True, LAYERS_DEFAULTS["has_custom_layer_types"][1])} if plain else {}
    _check_defaults(owner, layers, {**LAYERS_DEFAULTS, **accepted}, "")
    _check_classes(owner, [layers.rel_pos, *layers.skip_combines, *layers.layer_integrators])
    if layers.polar_pos_emb is not None:
        raise _refuse(owner, "polar_pos_emb")
    dtype = array(next(layers.parameters())).dtype
    dim, heads = layers.dim, layers.attn_heads
    causal = _causal(owner, layers)
    structure = _sublayers(owner, layers)
    blocks = [_block(owner, parts, dim, heads, dtype, layers.rel_pos) for parts in structure]
    first = blocks[0]
    rope_theta = None
    if layers.rotary_pos_emb is not None:
        rope_theta, rotary_dim = _rope_theta(owner, layers.rotary_pos_emb,  # layers that differ are refused below
                                             first.operators["attn"].get("d_head", dim // heads))
        for block in blocks:
            block.rotary(owner, heads, rotary_dim)
    eps = set().union(*(block.eps for block in blocks))
    activations = set().union(*(block.activations for block in blocks))
    if len(eps) != 1 or len(activations) != 1:
        raise _refuse(owner, "norms or activations that differ across sublayers", "a generated forward takes one of each")
    differing = next((index for index, block in enumerate(blocks)
                      if block.operators != first.operators or block.steps != first.steps), None)
    if differing is not None:
        raise _refuse(owner, "layers that differ in structure", "a generated Stack repeats one block; "
                      + _first_difference(blocks[differing], first, differing))
    notes = sorted(note for note in first.notes if note)
    final_norm = None
    if library_name(layers.final_norm) != "Identity":
        kind, final_eps, gain = _norm(f"{owner}.final_norm", layers.final_norm, dim, dtype)
        if final_eps not in eps:
            raise _refuse(owner, "a final norm unlike its layers' norms")
        final_norm = {"gain": gain}
        if kind == "layer-norm":  # the generated final LayerNorm keeps a bias: zero, as x-transformers has none
            final_norm["bias"] = np.zeros_like(gain)
            notes.append("x-transformers' final LayerNorm has no bias: a generated Stack's final norm holds a zero one, "
                         "which build leaves out of training")
    name, summary = _name(layers, structure[0], first)
    activation = activations.pop()
    text = scheme_text(name, summary, first, activation, causal, final_norm is not None)
    tied = list(layers.layers_execute_order) != list(range(len(layers.layer_types)))
    if any(not attention.attend.flash for attention in layers.modules() if library_name(attention) == "Attention"):
        notes.append("x-transformers' non-flash attention takes its softmax in float32; the generated code keeps "
                     "the input dtype (set attn_flash=True for its scaled_dot_product_attention path)")
    options = ({"causal": True} if causal else {}) | ({} if rope_theta is None else {"rope_theta": rope_theta})
    if "attn.W_o" in first.fixed:
        notes.append("x-transformers' attention has no output projection (to_out is the identity): attn.W_o = I, "
                     "which build leaves out of training")
    if any(name.endswith(".b_2") for name in first.fixed):
        notes.append("x-transformers' feed-forward output has no bias (ff_no_bias with ff_glu; its GLU projection "
                     "keeps one): b_2 = 0, which build leaves out of training")
    frozen = tuple(f"layers.{index}.{name}" for index, block in enumerate(blocks) for name in sorted(block.fixed))
    if final_norm is not None and library_name(layers.final_norm) == "SimpleRMSNorm":  # unit gains, no parameter
        frozen += ("final_norm.gain",)
    if final_norm is not None and "bias" in final_norm:  # x-transformers' final LayerNorm has no bias
        frozen += ("final_norm.bias",)
    # no bias anywhere (ff_no_bias: attention and norms have none): a bias=False Stack, whose final norm holds none
    bias = any(is_bias(name) for block in blocks for name in block.params)
    if not bias:
        frozen = tuple(name for name in frozen if name != "final_norm.bias")
    adapted = Adapted(scheme=name, activation=activation, layers=tuple(block.params for block in blocks), n_heads=heads,
                      eps=eps.pop(), source=("xtransformers", owner), final_norm=final_norm, stack=True, bias=bias,
                      options=options, notes=tuple(notes), scheme_file=text, tied=tied, frozen=frozen)
    if probe:  # what a float64 copy reads (no rounding of a float32 source's γ + 1) against the copy's forward
        copy = randomized(_float64_copy(layers))  # random weights: no branch its own (zero-initialized) ones hide
        check_probe(owner, read_attention_layers(copy, probe=False), partial(_run, copy))
    return adapted


def _float64_copy(layers: Any) -> Any:
    """A float64 copy of ``layers`` in eval mode: its non-flash softmax (taken in float32, the one precision note
    of the reader) in float64, ALiBi's cached bias (compared with the slopes by ``_alibi_slopes``) dropped, so
    that its forward computes it from the slopes, and a rotary embedding's frequencies those of the θ read, in float64
    (its buffer holds them rounded to float32: 1e-7 off at θ = 500000 over a 64-feature head)."""
    import copy

    import torch

    probe = copy.deepcopy(layers).double().eval()
    for module in probe.modules():
        function = getattr(module, "attn_fn", None)
        if library_name(module) == "Attend" and isinstance(function, partial) and function.func is torch.nn.functional.softmax \
                and not function.args and function.keywords == {"dim": -1, "dtype": torch.float32}:
            module.attn_fn = partial(torch.nn.functional.softmax, dim=-1)
        if library_name(module) == "AlibiPositionalBias":
            module.bias = None
        if library_name(module) == "RotaryEmbedding":
            rotated = 2 * len(module.inv_freq)
            theta = read_theta(module.inv_freq, rotated)  # None: refused by the reader itself
            if theta is not None:
                module.inv_freq = torch.from_numpy(exact_frequencies(theta, rotated)).to(module.inv_freq.device)
    return probe


def _run(layers: Any, u: np.ndarray, padded: np.ndarray | None = None) -> np.ndarray:
    """x-transformers' forward of the float64 array ``u`` (on the module's device), ``padded`` tokens (True) masked."""
    import torch

    device = next(layers.parameters()).device
    mask = None if padded is None else torch.from_numpy(~padded).to(device)  # x-transformers: True keeps a token
    with torch.no_grad():
        return layers(torch.from_numpy(u).to(device), mask=mask).cpu().numpy()


@adapter("xtransformers", "TransformerWrapper")
def read_wrapper(wrapper: Any, *, probe: bool = True) -> Adapted:
    """A ``TransformerWrapper``'s ``attn_layers`` (its embeddings and logits are not read: a note says so)."""
    from dataclasses import replace

    memory = getattr(wrapper, "num_memory_tokens", 0)
    if type(memory) is not int or memory != 0:  # prepended (or interspersed) to every sequence the layers see
        raise _refuse("TransformerWrapper", f"num_memory_tokens={memory!r}", "its memory tokens join the sequence "
                      "between the embeddings and attn_layers, so every token's attention changes")
    if getattr(wrapper, "cls_token", None) is not None:
        raise _refuse("TransformerWrapper", "use_cls_token=True", "its class tokens join the sequence between the "
                      "embeddings and attn_layers, so every token's attention changes")
    if getattr(wrapper, "ff_deep_embed", None) is not None:  # handed to attn_layers with the token ids
        raise _refuse("TransformerWrapper", "ff_deep_embed=True", "a learned embedding of each token and layer "
                      "multiplies every feed-forward output inside attn_layers, which the scheme does not read")
    for flag, why in (("recycling", "attn_layers runs again on its own output, recycled"),
                      ("looped", "attn_layers runs in a loop until its exit gate stops it")):
        if getattr(wrapper, flag, False):
            raise _refuse("TransformerWrapper", f"{flag}={getattr(wrapper, flag)!r}",
                          f"{why}: a forward is no one pass of the stack")
    adapted = read_attention_layers(wrapper.attn_layers, probe=probe)
    return replace(adapted, source=("xtransformers", "TransformerWrapper"), notes=adapted.notes + (
        "read TransformerWrapper.attn_layers only: token and position embeddings, and the logits, stay in torch",))
