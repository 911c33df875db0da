"""``transformers`` ``GPT2Block`` → canonical parameters of the ``gpt2`` scheme.

GPT-2's ``Conv1D`` stores its weight as ``(in, out)``: already the row-vector layout
``u @ W + b`` of the canonical names, so nothing is transposed. The attention's ``scaling`` (what
transformers multiplies the scores by) and ``is_causal`` are read, not only the config's flags.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from splitformer.symbolic.errors import SplitformerError

from .arrays import array as _array
from .registry import adapter, writer
from .adapted import Adapted
from .common import check_attention, check_head_split, state_dict
from .inspection import check_parts, library_name

__all__ = ["gpt2_block_params", "gpt2_block_config", "read_gpt2_block", "rounded_gelu_notes", "write_gpt2_block"]

#: The activation classes of ``transformers`` that compute the scheme's ``gelu-tanh``
#: (``gelu_new``, ``gelu_pytorch_tanh``, ``gelu_fast``).
_GELU_TANH = {"NewGELUActivation", "GELUTanh", "PytorchGELUTanh", "FastGELUActivation"}

#: The submodules a ``GPT2Block`` is read through, and their classes.
GPT2_PARTS = {"ln_1": "LayerNorm", "attn": "GPT2Attention", "attn.c_attn": "Conv1D", "attn.c_proj": "Conv1D",
              "attn.attn_dropout": "Dropout", "attn.resid_dropout": "Dropout", "ln_2": "LayerNorm", "mlp": "GPT2MLP",
              "mlp.c_fc": "Conv1D", "mlp.c_proj": "Conv1D", "mlp.dropout": "Dropout"}



def rounded_gelu_notes(module: Any) -> tuple[str, ...]:
    """transformers' ``gelu_fast`` (``FastGELUActivation``) writes √(2/π) as 0.7978845608, 2.9e-12 below it: the
    scheme's gelu-tanh computes the exact constant, so parity with such a source is about 1e-12, not 1e-15."""
    if not any(library_name(part) == "FastGELUActivation" for part in module.modules()):
        return ()
    return ("the source's gelu_fast writes sqrt(2/pi) as 0.7978845608 (2.9e-12 below it); gelu-tanh computes the "
            "exact constant, so float64 outputs differ from the source's by about 1e-12",)


def gpt2_block_config(block: Any) -> dict[str, Any]:
    """What the emitted ``gpt2`` forward needs (heads, ε); refuses what it does not implement."""
    check_parts("GPT2Block", block, GPT2_PARTS)
    activation = block.mlp.act  # the module the forward calls, not the config's name
    tanh_gelu = library_name(activation) in _GELU_TANH or (
        library_name(activation) == "GELU" and getattr(activation, "approximate", "none") == "tanh")
    if not tanh_gelu:
        raise SplitformerError(f"GPT2Block.mlp.act is {type(activation).__name__}; the gpt2 scheme implements "
                               f"gelu-tanh ({', '.join(sorted(_GELU_TANH))}, GELU(approximate='tanh'))")
    if getattr(block.attn, "is_cross_attention", False) or hasattr(block, "crossattention"):
        raise SplitformerError("GPT2Block with cross-attention (add_cross_attention=True) is not the gpt2 scheme")
    if not getattr(block.attn, "scale_attn_weights", True) or getattr(block.attn, "scale_attn_by_inverse_layer_idx", False):
        raise SplitformerError("GPT2Block with a score scale other than 1/√d_head is not implemented")
    d = block.ln_1.weight.shape[0]
    check_head_split("GPT2Block", d, ("attn.num_heads", block.attn.num_heads),
                     {"attn.head_dim": block.attn.head_dim},
                     {"attn.split_size": block.attn.split_size, "attn.embed_dim": block.attn.embed_dim})
    check_attention("GPT2Block", "attn", block.attn, block.attn.head_dim, "gpt2")
    if getattr(block.attn, "reorder_and_upcast_attn", False):
        raise SplitformerError("GPT2Block with reorder_and_upcast_attn is not implemented")
    for name in ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj"):
        if getattr(block.get_submodule(name), "bias", None) is None:
            raise SplitformerError(f"GPT2Block.{name} has no bias; the gpt2 block has all biases")
    if block.ln_1.eps != block.ln_2.eps:
        raise SplitformerError(f"GPT2Block's LayerNorms have different ε ({block.ln_1.eps}, {block.ln_2.eps})")
    return {"n_heads": block.attn.num_heads, "eps": block.ln_1.eps}


def gpt2_block_params(block: Any) -> dict[str, np.ndarray]:
    """The canonical parameters of a ``GPT2Block`` (``norm1``, ``attn``, ``norm2``, ``ffn``)."""
    q, k, v = np.split(_array(block.attn.c_attn.weight), 3, axis=1)
    b_q, b_k, b_v = np.split(_array(block.attn.c_attn.bias), 3)
    return {
        "norm1.gain": _array(block.ln_1.weight), "norm1.bias": _array(block.ln_1.bias),
        "attn.W_q": q, "attn.b_q": b_q, "attn.W_k": k, "attn.b_k": b_k, "attn.W_v": v, "attn.b_v": b_v,
        "attn.W_o": _array(block.attn.c_proj.weight), "attn.b_o": _array(block.attn.c_proj.bias),
        "norm2.gain": _array(block.ln_2.weight), "norm2.bias": _array(block.ln_2.bias),
        "ffn.W_1": _array(block.mlp.c_fc.weight), "ffn.b_1": _array(block.mlp.c_fc.bias),
        "ffn.W_2": _array(block.mlp.c_proj.weight), "ffn.b_2": _array(block.mlp.c_proj.bias),
    }


@adapter("hf", "GPT2Block")
def read_gpt2_block(block: Any) -> Adapted:
    """One ``GPT2Block``: the causal ``gpt2`` scheme with tanh-GELU."""
    config = gpt2_block_config(block)
    return Adapted(scheme="gpt2", activation="gelu-tanh", layers=(gpt2_block_params(block),), n_heads=config["n_heads"],
                   eps=config["eps"], source=("hf", "GPT2Block"), options={"causal": True})


@writer("hf", "GPT2Block")
def write_gpt2_block(adapted: Adapted) -> dict[str, Any]:
    """The state dict of a ``GPT2Block`` (``Conv1D`` weights ``(in, out)``: canonical as they are)."""
    p = adapted.params
    return state_dict({
        "ln_1.weight": p["norm1.gain"], "ln_1.bias": p["norm1.bias"],
        "attn.c_attn.weight": np.concatenate([p["attn.W_q"], p["attn.W_k"], p["attn.W_v"]], axis=1),
        "attn.c_attn.bias": np.concatenate([p["attn.b_q"], p["attn.b_k"], p["attn.b_v"]]),
        "attn.c_proj.weight": p["attn.W_o"], "attn.c_proj.bias": p["attn.b_o"],
        "ln_2.weight": p["norm2.gain"], "ln_2.bias": p["norm2.bias"],
        "mlp.c_fc.weight": p["ffn.W_1"], "mlp.c_fc.bias": p["ffn.b_1"],
        "mlp.c_proj.weight": p["ffn.W_2"], "mlp.c_proj.bias": p["ffn.b_2"],
    }, bias=True)
