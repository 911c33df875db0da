"""transformers' Llama pieces for the tests: random layers, RoPE cos/sin in float64, causal masks."""

import numpy as np
import torch

from transformers import LlamaConfig


def llama_config(d=16, n_heads=4, n_kv_heads=2, d_ff=24, eps=1e-5, theta=500.0, **overrides):
    """A small Llama configuration (SDPA attention: the eager path takes its softmax in float32)."""
    return LlamaConfig(hidden_size=d, num_attention_heads=n_heads, num_key_value_heads=n_kv_heads,
                       intermediate_size=d_ff, rms_norm_eps=eps, hidden_act="silu",
                       rope_parameters={"rope_type": "default", "rope_theta": theta},
                       attn_implementation="sdpa", **overrides)


def randomized(module, seed=0):
    """``module`` in float64 with every parameter random (gains included); asserts none is 0 or all 1."""
    torch.manual_seed(seed)
    module = module.double().eval()
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(torch.randn_like(parameter) * 0.5)
    for name, parameter in module.named_parameters():
        assert (parameter != 0).all() and (parameter != 1).any(), name
    return module


def rope(positions, d_head, theta, dtype=torch.float64):
    """cos and sin of transformers' default RoPE, (batch, tokens, d_head), computed in float64.

    ``LlamaRotaryEmbedding`` computes them in float32 whatever the model's dtype; the tests
    compare its output with this one separately.
    """
    positions = np.atleast_2d(np.asarray(positions, dtype=np.float64))
    inverse = theta ** (-np.arange(0, d_head, 2) / d_head)
    angles = positions[..., None] * inverse
    angles = np.concatenate([angles, angles], axis=-1)
    return torch.tensor(np.cos(angles), dtype=dtype), torch.tensor(np.sin(angles), dtype=dtype)


def causal_mask(batch, n_queries, n_keys=None, padding=None, dtype=torch.float64):
    """Additive 4-D mask: query i (the last ``n_queries`` of ``n_keys`` tokens) sees keys j ≤ its position."""
    n_keys = n_queries if n_keys is None else n_keys
    allowed = torch.ones(n_queries, n_keys, dtype=torch.bool).tril(n_keys - n_queries)[None].expand(batch, -1, -1)
    if padding is not None:
        allowed = allowed & ~torch.as_tensor(padding)[:, None, :]
    return torch.zeros(batch, 1, n_queries, n_keys, dtype=dtype).masked_fill(~allowed[:, None], torch.finfo(dtype).min)
