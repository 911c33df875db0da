"""``make train-demo`` (a development tool, not installed): train a 2-layer encoder with NumPy and the derived adjoint only.

Task: is a sequence of tokens sorted (non-decreasing)? The model embeds tokens and positions,
runs two steps of the generated ``pre-ln`` scheme with its final projection (``forward_stack``),
averages over tokens and reads out two logits; the loss is the mean cross-entropy. Gradients
come from ``vjp_stack`` (the derived adjoint) and the chain rule of the embedding and the
readout, written below in NumPy; the optimizer is Adam, written below in NumPy.

From the same initialization, the same steps are taken by ``torch.autograd`` on
``torch.nn.TransformerEncoderLayer``s with ``torch.optim.Adam``; the demo prints how far the
parameters are apart after ``--compare`` steps and writes the loss curve as a PNG.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from demo import load_generated

__all__ = ["main", "make_task", "init_model", "train_numpy", "train_torch"]

VOCAB, TOKENS, D, HEADS, D_FF, LAYERS, EPS = 6, 8, 16, 2, 24, 2, 1e-5
ADAM = {"lr": 1e-2, "betas": (0.9, 0.999), "eps": 1e-8}


def make_task(size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``size`` token sequences, half of them sorted; labels 1 = sorted."""
    tokens = rng.integers(0, VOCAB, (size, TOKENS))
    tokens[: size // 2].sort(axis=1)
    labels = np.all(np.diff(tokens, axis=1) >= 0, axis=1).astype(np.int64)
    order = rng.permutation(size)
    return tokens[order], labels[order]


def init_model(module, rng: np.random.Generator) -> dict:
    """Random float64 parameters: embedding, positions, layers, final norm, readout."""
    def random(*shape, scale=0.3):
        return rng.standard_normal(shape) * scale

    sizes = {"d": D, "d_ff": D_FF}
    layers = [{name: random(*(sizes[axis] for axis in axes)) + (1.0 if name.endswith("gain") else 0.0)
               for name, axes in module.PARAMETERS.items()} for _ in range(LAYERS)]
    return {"embed": random(VOCAB, D, scale=1.0), "position": random(TOKENS, D, scale=1.0), "layers": layers,
            "final_norm": {"gain": 1 + random(D), "bias": random(D)}, "head": random(D, 2), "head_bias": random(2)}


def _loss_and_gradients(module, model: dict, tokens: np.ndarray, labels: np.ndarray) -> tuple[float, dict]:
    u = model["embed"][tokens] + model["position"]
    options = {"n_heads": HEADS, "eps": EPS, "final_norm": model["final_norm"]}
    states = module.forward_stack(u, model["layers"], **options)
    pooled = states.mean(axis=1)
    logits = pooled @ model["head"] + model["head_bias"]
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probabilities = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    batch = len(labels)
    loss = -log_probabilities[np.arange(batch), labels].mean()
    grad_logits = np.exp(log_probabilities)
    grad_logits[np.arange(batch), labels] -= 1
    grad_logits /= batch
    grad_states = np.repeat((grad_logits @ model["head"].T)[:, None, :] / TOKENS, TOKENS, axis=1)
    grad_u, grad_layers, grad_final = module.vjp_stack(u, model["layers"], grad_states, **options)
    grad_embed = np.zeros_like(model["embed"])
    np.add.at(grad_embed, tokens, grad_u)
    return float(loss), {"embed": grad_embed, "position": grad_u.sum(axis=0), "layers": grad_layers,
                         "final_norm": grad_final, "head": pooled.T @ grad_logits, "head_bias": grad_logits.sum(0)}


def _leaves(tree, path=()):
    """``(path, array)`` for every array of a nested dict/list model."""
    if isinstance(tree, dict):
        for key in tree:
            yield from _leaves(tree[key], path + (key,))
    elif isinstance(tree, list):
        for index, item in enumerate(tree):
            yield from _leaves(item, path + (index,))
    else:
        yield path, tree


class Adam:
    """Adam (Kingma & Ba), spelled as ``torch.optim.Adam`` computes it, on a nested model."""

    def __init__(self, lr: float, betas: tuple[float, float], eps: float):
        self.lr, (self.beta1, self.beta2), self.eps, self.step_count, self.moments = lr, betas, eps, 0, {}

    def step(self, model: dict, gradients: dict) -> None:
        self.step_count += 1
        correction1 = 1 - self.beta1**self.step_count
        correction2 = 1 - self.beta2**self.step_count
        grads = dict(_leaves(gradients))
        for path, parameter in _leaves(model):
            grad = grads[path]
            first, second = self.moments.setdefault(path, (np.zeros_like(grad), np.zeros_like(grad)))
            first *= self.beta1
            first += (1 - self.beta1) * grad
            second *= self.beta2
            second += (1 - self.beta2) * grad * grad
            denominator = np.sqrt(second) / np.sqrt(correction2) + self.eps
            parameter -= (self.lr / correction1) * first / denominator


def train_numpy(module, model: dict, tokens: np.ndarray, labels: np.ndarray, steps: int) -> list[float]:
    """``steps`` full-batch Adam steps on ``model`` (in place); the loss before each step."""
    optimizer, losses = Adam(**ADAM), []
    for _ in range(steps):
        loss, gradients = _loss_and_gradients(module, model, tokens, labels)
        optimizer.step(model, gradients)
        losses.append(loss)
    return losses


def train_torch(model: dict, tokens: np.ndarray, labels: np.ndarray, steps: int) -> dict:
    """The same training with ``torch.autograd`` and ``torch.optim.Adam``; the model after it, as arrays."""
    import torch

    def tensor(array):
        return torch.nn.Parameter(torch.tensor(array, dtype=torch.float64))

    layers = []
    for params in model["layers"]:
        layer = torch.nn.TransformerEncoderLayer(D, HEADS, D_FF, dropout=0.0, layer_norm_eps=EPS, batch_first=True,
                                                 norm_first=True, dtype=torch.float64)
        with torch.no_grad():
            weights = [params[f"attn.W_{c}"].T for c in "qkv"]
            layer.self_attn.in_proj_weight.copy_(torch.tensor(np.concatenate(weights)))
            layer.self_attn.in_proj_bias.copy_(torch.tensor(np.concatenate([params[f"attn.b_{c}"] for c in "qkv"])))
            layer.self_attn.out_proj.weight.copy_(torch.tensor(params["attn.W_o"].T))
            layer.self_attn.out_proj.bias.copy_(torch.tensor(params["attn.b_o"]))
            for norm in ("norm1", "norm2"):
                getattr(layer, norm).weight.copy_(torch.tensor(params[f"{norm}.gain"]))
                getattr(layer, norm).bias.copy_(torch.tensor(params[f"{norm}.bias"]))
            layer.linear1.weight.copy_(torch.tensor(params["ffn.W_1"].T))
            layer.linear1.bias.copy_(torch.tensor(params["ffn.b_1"]))
            layer.linear2.weight.copy_(torch.tensor(params["ffn.W_2"].T))
            layer.linear2.bias.copy_(torch.tensor(params["ffn.b_2"]))
        layers.append(layer.eval())
    norm = torch.nn.LayerNorm(D, eps=EPS, dtype=torch.float64)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor(model["final_norm"]["gain"]))
        norm.bias.copy_(torch.tensor(model["final_norm"]["bias"]))
    embed, position = tensor(model["embed"]), tensor(model["position"])
    head, head_bias = tensor(model["head"]), tensor(model["head_bias"])
    parameters = [embed, position, head, head_bias, *norm.parameters()]
    parameters += [p for layer in layers for p in layer.parameters()]
    optimizer = torch.optim.Adam(parameters, lr=ADAM["lr"], betas=ADAM["betas"], eps=ADAM["eps"])
    inputs, targets = torch.tensor(tokens), torch.tensor(labels)
    for _ in range(steps):
        optimizer.zero_grad()
        states = embed[inputs] + position
        for layer in layers:
            states = layer(states)
        logits = norm(states).mean(dim=1) @ head + head_bias
        torch.nn.functional.cross_entropy(logits, targets).backward()
        optimizer.step()

    def array(value):
        return value.detach().numpy().copy()

    from splitformer.adapters import from_torch

    return {"embed": array(embed), "position": array(position), "layers": [dict(from_torch(layer)) for layer in layers],
            "final_norm": {"gain": array(norm.weight), "bias": array(norm.bias)},
            "head": array(head), "head_bias": array(head_bias)}


def parameter_gap(first: dict, second: dict) -> float:
    """The largest absolute difference between two models' parameters."""
    other = dict(_leaves(second))
    return max(float(np.abs(value - other[path]).max()) for path, value in _leaves(first))


def _copy(model: dict) -> dict:
    return {key: ([{k: v.copy() for k, v in item.items()} for item in value] if key == "layers" else
                  {k: v.copy() for k, v in value.items()} if isinstance(value, dict) else value.copy())
            for key, value in model.items()}


def _plot(losses: list[float], accuracy: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(5, 3.2))
    axes.semilogy(range(len(losses)), losses)
    axes.set_xlabel("Adam step")
    axes.set_ylabel("cross-entropy (training batch)")
    axes.set_title(f"2-layer pre-LN encoder, NumPy + derived adjoint\n(is the sequence sorted? accuracy {accuracy:.0%})",
                   fontsize=9)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/train_demo.py")
    parser.add_argument("--generated", default="generated", help="folder holding numpy/pre_ln.py")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--compare", type=int, default=30, help="steps compared with torch.autograd")
    parser.add_argument("--plot", default="generated/plots/train_demo_loss.png")
    arguments = parser.parse_args(argv)
    module = load_generated(Path(arguments.generated), "numpy", "pre_ln")
    rng = np.random.default_rng(0)
    tokens, labels = make_task(256, rng)
    test_tokens, test_labels = make_task(256, rng)
    init = init_model(module, rng)

    model = _copy(init)
    start = time.perf_counter()
    train_numpy(module, model, tokens, labels, arguments.compare)
    seconds = time.perf_counter() - start
    reference = train_torch(_copy(init), tokens, labels, arguments.compare)
    gap = parameter_gap(model, reference)
    print(f"{arguments.compare} Adam steps, NumPy + derived adjoint: {seconds:.2f} s; "
          f"largest parameter difference to torch.autograd + torch.optim.Adam: {gap:.1e}")

    model = _copy(init)
    losses = train_numpy(module, model, tokens, labels, arguments.steps)
    states = module.forward_stack(model["embed"][test_tokens] + model["position"], model["layers"], n_heads=HEADS,
                                  eps=EPS, final_norm=model["final_norm"])
    predictions = (states.mean(axis=1) @ model["head"] + model["head_bias"]).argmax(axis=1)
    accuracy = float((predictions == test_labels).mean())
    print(f"{arguments.steps} steps: loss {losses[0]:.3f} → {losses[-1]:.1e}, held-out accuracy {accuracy:.1%}")
    _plot(losses, accuracy, Path(arguments.plot))
    print(f"loss curve: {arguments.plot}")
    return 0 if gap <= 1e-8 else 1


if __name__ == "__main__":
    sys.exit(main())
