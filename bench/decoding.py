"""KV-cached decoding: tokens per second of a 4-layer ``llama`` stack against transformers' ``LlamaModel``.

    python bench/decoding.py [--batches 1,8] [--pairs 3] [--new-tokens 128] [--threads 2]
    python bench/decoding.py --check          # float64 parity of the three decoders, then exit

A ``LlamaModel`` (d 256, 8 heads over 2 KV heads, d_ff 688, 4 layers, random weights, seed 0)
is the reference, run with its ``DynamicCache``; the candidates are the generated torch
``Stack`` and the generated NumPy ``forward_stack``, holding the same weights through
``from_hf``. Each decoder reads a 128-token prompt into its cache, then generates
``--new-tokens`` tokens one at a time (the next token's hidden vector is a fixed random one:
the stack's cost does not depend on it). Each figure runs in its own process (warm-up, then the
timed generation); reference and candidate processes alternate for ``--pairs`` pairs and the
ratio of each pair (candidate rate / reference rate, ≥ 1 is faster) is printed with their
median and spread.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SIZES = {"d": 256, "n_heads": 8, "n_kv_heads": 2, "d_ff": 688, "n_layers": 4, "prompt": 128}
#: candidate: target of its rate / the reference's rate.
TARGETS = {"torch": 1.00, "numpy": 0.70}
FIGURES = ("reference", *TARGETS)


def _reference(dtype):
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
    return adapted, {"gain": model.norm.weight.detach().numpy().copy()}


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


def _generated(backend: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"decoding_{backend}", ROOT / "generated" / backend / "llama.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def decoder(figure: str, dtype_name: str):
    """``step(u, first)``: feeds ``u`` (batch, tokens, d) to the decoder, ``first`` resetting its cache."""
    import torch

    dtype = getattr(torch, dtype_name)
    model = _reference(dtype)
    adapted, final_norm = _canonical(model)
    options = adapted[0].options
    layers = [layer.params for layer in adapted]
    if figure == "reference":
        if dtype == torch.float64:
            _float64_exact(model, options["rope_theta"])
        from transformers import DynamicCache

        state = {}

        def step(u, first):
            if first:
                state["cache"] = DynamicCache(config=model.config)
            with torch.inference_mode():
                out = model(inputs_embeds=torch.from_numpy(u), cache=state["cache"], use_cache=True)
            return out.last_hidden_state.numpy()
        return step
    if figure == "numpy":
        module = _generated("numpy")
        state = {}

        def step(u, first):
            if first:
                state["cache"] = [{} for _ in layers]
            return module.forward_stack(u, layers, n_heads=SIZES["n_heads"], n_kv_heads=options["n_kv_heads"],
                                        eps=adapted[0].eps, final_norm=final_norm, rope_theta=options["rope_theta"],
                                        cache=state["cache"])
        return step
    module = _generated("torch")
    stack = module.Stack(SIZES["n_layers"], SIZES["d"], SIZES["n_heads"], SIZES["d_ff"], n_kv_heads=options["n_kv_heads"],
                         eps=adapted[0].eps, bias=False, rope_theta=options["rope_theta"], dtype=dtype)
    stack.load_params(layers, final_norm).eval()
    state = {}

    def step(u, first):
        if first:
            state["cache"] = [{} for _ in stack.layers]
        with torch.inference_mode():
            return stack(torch.from_numpy(u), cache=state["cache"]).numpy()
    return step


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


def figure_main(figure: str, batch: int, new_tokens: int) -> dict:
    step = decoder(figure, "float32")
    generate(step, batch, 8, np.float32)  # warm-up
    seconds, _ = generate(step, batch, new_tokens, np.float32)
    return {"figure": figure, "batch": batch, "tokens_per_s": batch * new_tokens / seconds}


def check(new_tokens: int = 6, batch: int = 2) -> float:
    """The largest float64 difference of the candidates' outputs from the reference's."""
    import torch

    torch.set_num_threads(1)
    outputs = {figure: generate(decoder(figure, "float64"), batch, new_tokens, np.float64)[1] for figure in FIGURES}
    return max(float(np.abs(outputs[figure] - outputs["reference"]).max()) for figure in TARGETS)


def interleaved(candidate: str, batch: int, arguments) -> list[float]:
    """The in-process mode: reference and candidate generations alternating in this process
    (under a load that changes faster than a process lives, the pairs still see the same load)."""
    import torch

    torch.set_num_threads(arguments.threads)
    steps = [decoder(figure, "float32") for figure in ("reference", candidate)]
    for step in steps:
        generate(step, batch, 8, np.float32)  # warm-up
    ratios = []
    for _ in range(arguments.pairs):
        seconds = [generate(step, batch, arguments.new_tokens, np.float32)[0] for step in steps]
        ratios.append(seconds[0] / seconds[1])
    return ratios


def _run(figure: str, batch: int, arguments) -> dict:
    variables = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
    environment = {**os.environ, **{name: str(arguments.threads) for name in variables}}
    result = subprocess.run([sys.executable, __file__, "--figure", figure, "--batches", str(batch),
                             "--new-tokens", str(arguments.new_tokens), "--threads", str(arguments.threads)],
                            capture_output=True, text=True, env=environment, check=False)
    if result.returncode != 0:
        raise SystemExit(f"error: bench/decoding.py --figure {figure} failed:\n{result.stderr.strip()}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/decoding.py", description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,8", help="comma-separated batch sizes")
    parser.add_argument("--pairs", type=int, default=3, help="reference/candidate process pairs per figure")
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens generated after the prompt")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--candidates", default=",".join(TARGETS), help=f"comma-separated, of {', '.join(TARGETS)}")
    parser.add_argument("--figure", choices=FIGURES, help=argparse.SUPPRESS)  # one process's figure
    parser.add_argument("--interleaved", action="store_true", help="the in-process mode (labelled)")
    parser.add_argument("--check", action="store_true", help="float64 parity of the candidates, then exit")
    arguments = parser.parse_args(argv)
    if arguments.check:
        difference = check()
        print(f"largest float64 difference from LlamaModel with DynamicCache: {difference:.2e}")
        return 0 if difference <= 1e-10 else 1
    if arguments.figure:
        import torch

        torch.set_num_threads(arguments.threads)
        print(json.dumps(figure_main(arguments.figure, int(arguments.batches), arguments.new_tokens)))
        return 0
    sizes = ", ".join(f"{key} {value}" for key, value in SIZES.items())
    print(f"KV-cached decoding ({sizes}; {arguments.new_tokens} new tokens, float32, {arguments.threads} threads)",
          flush=True)
    for batch in map(int, arguments.batches.split(",")):
        for candidate in arguments.candidates.split(","):
            if arguments.interleaved:
                ratios = interleaved(candidate, batch, arguments)
                print(f"[batch {batch}] {candidate:6} {statistics.median(ratios):5.2f}x the reference's rate  spread "
                      f"{min(ratios):.2f}-{max(ratios):.2f} over {len(ratios)} pairs (IN-PROCESS interleaved, "
                      f"target >= {TARGETS[candidate]:.2f})", flush=True)
                continue
            ratios, reference, generated = [], {}, {}
            for _ in range(arguments.pairs):
                reference, generated = _run("reference", batch, arguments), _run(candidate, batch, arguments)
                ratios.append(generated["tokens_per_s"] / reference["tokens_per_s"])
            ratio, target = statistics.median(ratios), TARGETS[candidate]
            print(f"[batch {batch}] {candidate:6} {ratio:5.2f}x the reference's rate  spread "
                  f"{min(ratios):.2f}-{max(ratios):.2f} over {len(ratios)} pairs  (target >= {target:.2f}, "
                  f"{'ok' if ratio >= target else 'MISSED'})  ref {reference['tokens_per_s']:7.1f} tokens/s  "
                  f"gen {generated['tokens_per_s']:7.1f} tokens/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
