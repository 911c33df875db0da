"""KV-cached decoding of a 4-layer ``llama`` stack and of transformers' ``LlamaModel`` (the rows
``decoding/bBATCH/BACKEND`` of ``bench/benchmark.py``).

    python bench/decoding.py --check          # float64 parity of the three decoders

A ``LlamaModel`` (d 256, 8 heads over 2 KV heads, d_ff 688, 4 layers, random weights, seed 0)
is the reference, run with its ``DynamicCache``; the candidates are the generated torch
``Stack`` and the generated NumPy ``forward_stack``, holding the same weights through
``from_hf``. Each decoder reads a 128-token prompt into its cache, then generates new tokens
one at a time (the next token's hidden vector is a fixed random one: the stack's cost does not
depend on it).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SIZES = {"d": 256, "n_heads": 8, "n_kv_heads": 2, "d_ff": 688, "n_layers": 4, "prompt": 128}
FIGURES = ("reference", "torch", "numpy")


def reference_model(dtype):
    """A random ``LlamaModel`` in ``dtype`` (SDPA attention), eval mode."""
    import torch
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(hidden_size=SIZES["d"], num_attention_heads=SIZES["n_heads"],
                         num_key_value_heads=SIZES["n_kv_heads"], intermediate_size=SIZES["d_ff"],
                         num_hidden_layers=SIZES["n_layers"], vocab_size=16, rms_norm_eps=1e-5,
                         hidden_act="silu", attn_implementation="sdpa")
    torch.manual_seed(0)
    model = LlamaModel(config).to(dtype).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn_like(parameter) * 0.1 + (1.0 if parameter.dim() == 1 else 0.0))
    return model


def _canonical(model):
    """The model's layers and final norm as canonical parameters (``from_hf`` per layer)."""
    from splitformer.adapters import from_hf

    adapted = [from_hf(layer) for layer in model.layers]
    return adapted, {"gain": model.norm.weight.detach().cpu().numpy().copy()}


def _float64_rope(head_dim: int, theta: float):
    """transformers' default RoPE with its angles in float64 (``LlamaRotaryEmbedding`` takes float32)."""
    import torch

    def rope(x, position_ids):
        inverse = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        angles = position_ids[..., None].to(torch.float64) * inverse
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    return rope


def _float64_exact(model, theta: float):
    """The reference with its RMSNorms and RoPE angles in float64 (transformers takes them in float32)."""
    import torch

    def norm(old):
        new = torch.nn.RMSNorm(old.weight.shape[0], eps=old.variance_epsilon, dtype=torch.float64)
        with torch.no_grad():
            new.weight.copy_(old.weight)
        return new

    for layer in model.layers:
        layer.input_layernorm = norm(layer.input_layernorm)
        layer.post_attention_layernorm = norm(layer.post_attention_layernorm)
    model.norm = norm(model.norm)
    model.rotary_emb.forward = _float64_rope(SIZES["d"] // SIZES["n_heads"], theta)


def stack_inputs(dtype_name: str = "float32") -> tuple:
    """((), layers, kwargs) of the generated NumPy ``forward_stack`` holding the reference's weights."""
    import torch

    adapted, final_norm = _canonical(reference_model(getattr(torch, dtype_name)))
    options = adapted[0].options
    kwargs = {"n_heads": SIZES["n_heads"], "n_kv_heads": options["n_kv_heads"], "eps": adapted[0].eps,
              "final_norm": final_norm, "rope_theta": options["rope_theta"]}
    return (), [dict(layer.params) for layer in adapted], kwargs


def numpy_step(module, layers: list, kwargs: dict):
    """``step(u, first)`` of the generated NumPy ``forward_stack`` (``first`` resets its cache)."""
    state = {}

    def step(u, first):
        if first:
            state["cache"] = [{} for _ in layers]
        return module.forward_stack(u, layers, cache=state["cache"], **kwargs)
    return step


def decoder(figure: str, dtype_name: str, modules: Path = ROOT / "generated"):
    """``step(u, first)``: feeds ``u`` (batch, tokens, d) to the decoder, ``first`` resetting its cache. A torch
    decoder runs where it was built (under ``torch.device(...)``: the inputs go there, the outputs come back)."""
    import torch

    from rows import generated

    dtype = getattr(torch, dtype_name)
    if figure == "numpy":
        return numpy_step(generated(modules, "numpy", "llama"), *stack_inputs(dtype_name)[1:])
    model = reference_model(dtype)
    device = model.norm.weight.device
    if figure == "reference":
        if dtype == torch.float64:
            _float64_exact(model, _canonical(model)[0][0].options["rope_theta"])
        from transformers import DynamicCache

        state = {}

        def step(u, first):
            if first:
                state["cache"] = DynamicCache(config=model.config)
            with torch.inference_mode():
                out = model(inputs_embeds=torch.from_numpy(u).to(device), cache=state["cache"], use_cache=True)
            return out.last_hidden_state.cpu().numpy()
        return step
    stack = generated_stack(model, modules)
    state = {}

    def step(u, first):
        if first:
            state["cache"] = [{} for _ in stack.layers]
        with torch.inference_mode():
            return stack(torch.from_numpy(u).to(device), cache=state["cache"]).cpu().numpy()
    return step


def generated_stack(model, modules: Path = ROOT / "generated"):
    """The generated torch ``Stack`` holding the weights of the reference ``model``, in its dtype and on its device."""
    from rows import generated

    adapted, final_norm = _canonical(model)
    options = adapted[0].options
    module = generated(modules, "torch", "llama")
    stack = module.Stack(SIZES["n_layers"], SIZES["d"], SIZES["n_heads"], SIZES["d_ff"], n_kv_heads=options["n_kv_heads"],
                         eps=adapted[0].eps, bias=False, rope_theta=options["rope_theta"],
                         dtype=model.norm.weight.dtype, device=model.norm.weight.device)
    return stack.load_params([layer.params for layer in adapted], final_norm).eval()


def _tokens(batch: int, count: int, dtype) -> np.ndarray:
    return np.random.default_rng(1).standard_normal((batch, count, SIZES["d"])).astype(dtype)


def generate(step, batch: int, new_tokens: int, dtype) -> tuple[float, np.ndarray]:
    """Seconds to generate ``new_tokens`` tokens after the prompt, and the outputs of every token."""
    inputs = _tokens(batch, SIZES["prompt"] + new_tokens, dtype)
    outputs = [step(inputs[:, :SIZES["prompt"]], True)]
    start = time.perf_counter()
    for index in range(SIZES["prompt"], SIZES["prompt"] + new_tokens):
        outputs.append(step(inputs[:, index:index + 1], False))
    return time.perf_counter() - start, np.concatenate(outputs, axis=1)


def check(new_tokens: int = 6, batch: int = 2) -> float:
    """The largest float64 difference of the candidates' outputs from the reference's."""
    import torch

    torch.set_num_threads(1)
    outputs = {figure: generate(decoder(figure, "float64"), batch, new_tokens, np.float64)[1] for figure in FIGURES}
    return max(float(np.abs(outputs[figure] - outputs["reference"]).max()) for figure in FIGURES[1:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/decoding.py", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="float64 parity of the candidates (the only action)")
    arguments = parser.parse_args(argv)
    if not arguments.check:
        parser.error("the timed rows run through bench/benchmark.py --rows 'decoding/*'")
    difference = check()
    print(f"largest float64 difference from LlamaModel with DynamicCache: {difference:.2e}")
    return 0 if difference <= 1e-10 else 1


if __name__ == "__main__":
    sys.exit(main())
