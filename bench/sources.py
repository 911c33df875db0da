"""The torch side of the benchmark rows: the source modules a user would pick, and what is timed.

``block_source`` builds the module a generated block replaces (default-initialized, seed 0,
float32), wrapped so that ``module(*inputs)`` runs it as a user would (transformers' layers with
SDPA attention and no mask, so causal; llama's rotary cos/sin computed in the call), with the
adapted canonical parameters and the inputs. ``timed_call`` is one inference call or one
training step; ``kept_bytes`` the activations a forward keeps for the backward pass.
"""

from __future__ import annotations

import torch

from splitformer.adapters import from_hf, from_torch

from rows import Timed

__all__ = ["block_source", "kept_bytes", "timed_call"]


class Rotary(torch.nn.Module):
    """A ``LlamaDecoderLayer`` with its rotary cos/sin computed in the call (SDPA, causal)."""

    def __init__(self, layer, rotary):
        super().__init__()
        self.layer, self.rotary = layer, rotary

    def forward(self, x):
        positions = torch.arange(x.shape[1], device=x.device)[None].expand(x.shape[0], -1)
        return first(self.layer(x, attention_mask=None, position_embeddings=self.rotary(x, positions)))


class FirstOutput(torch.nn.Module):
    """A layer that returns a tuple (``GPT2Block``, in some transformers versions) as one output."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        return first(self.layer(x))


class CausalDecoder(torch.nn.Module):
    """``TransformerDecoderLayer`` with its causal mask (built once) over ``(x, memory)``."""

    def __init__(self, layer, tokens: int):
        super().__init__()
        self.layer = layer
        self.register_buffer("mask", torch.ones(tokens, tokens, dtype=torch.bool).triu(1))

    def forward(self, x, memory):
        return self.layer(x, memory, tgt_mask=self.mask, tgt_is_causal=True)


def first(out):
    return out[0] if isinstance(out, tuple) else out


def block_source(scheme: str, batch: int, tokens: int, d: int, heads: int, d_ff: int):
    """(module, adapted parameters, inputs) of ``scheme``'s source at these sizes."""
    torch.manual_seed(0)
    inputs = [torch.randn(batch, tokens, d)]
    if scheme == "post-ln":
        layer = torch.nn.TransformerEncoderLayer(d, heads, d_ff, dropout=0.0, batch_first=True)
        return layer, from_torch(layer), inputs
    if scheme == "decoder":
        layer = torch.nn.TransformerDecoderLayer(d, heads, d_ff, dropout=0.0, batch_first=True)
        return CausalDecoder(layer, tokens), from_torch(layer), [*inputs, torch.randn(batch, tokens, d)]
    import transformers

    if scheme == "llama":
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

        config = transformers.LlamaConfig(hidden_size=d, num_attention_heads=heads, num_key_value_heads=heads // 4 or 1,
                                          intermediate_size=d_ff, rms_norm_eps=1e-5, attn_implementation="sdpa")
        layer = LlamaDecoderLayer(config, layer_idx=0)
        return Rotary(layer, LlamaRotaryEmbedding(config)), from_hf(layer), inputs
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    config = transformers.GPT2Config(n_embd=d, n_head=heads, n_inner=d_ff, activation_function="gelu_new",
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="sdpa")
    layer = GPT2Block(config, layer_idx=0)
    return FirstOutput(layer), from_hf(layer), inputs


def kept_bytes(forward, excluded) -> tuple[int, torch.Tensor]:
    """Bytes of the activations ``forward()`` keeps for the backward pass, and its output: the
    storages autograd's ``saved_tensors_hooks`` sees and the tensors a derived
    ``autograd.Function`` keeps on its ``ctx`` (the ``excluded`` tensors' storages, parameters
    and inputs, left out; each storage counted once)."""
    left_out = {tensor.untyped_storage().data_ptr() for tensor in excluded}
    kept: dict[int, int] = {}

    def keep(value):
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            if storage.data_ptr() not in left_out:
                kept[storage.data_ptr()] = storage.nbytes()
        elif isinstance(value, (list, tuple)):
            for item in value:
                keep(item)
        elif isinstance(value, dict):
            for item in value.values():
                keep(item)
        return value

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
        out = forward()
    nodes, seen = [out.grad_fn], set()
    while nodes:  # a derived Function keeps its arrays on its ctx (the node)
        node = nodes.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        keep(list(getattr(node, "__dict__", {}).values()))
        nodes.extend(following for following, _ in node.next_functions)
    return sum(kept.values()), out


def timed_call(module, inputs, training: bool) -> Timed:
    """One inference call (eval mode, ``inference_mode``), or a whole training step (forward,
    backward, an SGD update) with the bytes its forward keeps for the backward pass."""
    if not training:
        module.eval()

        def infer():
            with torch.inference_mode():
                module(*inputs)
        return Timed(infer)
    module.train()
    optimizer = torch.optim.SGD(module.parameters(), lr=1e-6)

    def step():
        optimizer.zero_grad(set_to_none=True)
        module(*inputs).square().mean().backward()
        optimizer.step()
    return Timed(step, kept=lambda: kept_bytes(lambda: module(*inputs), [*module.parameters(), *inputs])[0])
