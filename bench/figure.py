"""One benchmark figure in one process: warm up, then back-to-back calls, print JSON.

    python bench/figure.py FIGURE ROLE SHAPE --modules DIR [--seconds S] [--profile]

``FIGURE`` is ``torch-inference``, ``torch-training`` or ``numpy-forward``; ``ROLE`` is
``reference`` (``torch.nn.TransformerEncoderLayer``: its fused fast path for inference, autograd
for a training step: forward, backward and an SGD update) or ``candidate`` (the generated module in ``DIR``). Weights and input come from
``DIR/SHAPE.npz`` (written by ``benchmark.py``), so the NumPy candidate's process never imports
torch, as a NumPy user's would not. The process measures sustained
throughput as a user's loop sees it: nothing pauses between calls, so BLAS threads that spin
after a call are part of what the next call pays. The output is one JSON object with the
median time per call, the number of calls, the achieved GFLOP/s and the page faults per call
(memory the allocator gave back to the system and the next call touches afresh: a cost of
allocation patterns, not of arithmetic); ``--profile`` adds the
top operators of a ``torch.profiler`` run (torch figures) or the per-statement table of the
generated NumPy forward (``bench/numpy_profile.py``, the NumPy candidate).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from operators import by_kind  # noqa: E402
from shapes import SHAPES, flops  # noqa: E402

FIGURES = ("torch-inference", "torch-training", "numpy-forward")
ROLES = ("reference", "candidate")
WARM_UP_SECONDS = 0.3


def _module(folder: Path, backend: str):
    spec = importlib.util.spec_from_file_location(f"bench_{backend}", folder / backend / "post_ln.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_inputs(shape: str, folder: Path) -> None:
    """``folder/SHAPE.npz``: a default-initialized layer's canonical weights (seed 0) and an input."""
    import torch

    from splitformer.adapters import from_torch

    batch, tokens, d, heads, d_ff = SHAPES[shape]
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d, heads, d_ff, dropout=0.0, batch_first=True)
    np.savez(folder / f"{shape}.npz", u=torch.randn(batch, tokens, d).numpy(), **dict(from_torch(layer)))


def _reference_layer(params: dict[str, np.ndarray], d: int, heads: int, d_ff: int):
    import torch

    layer = torch.nn.TransformerEncoderLayer(d, heads, d_ff, dropout=0.0, batch_first=True)
    weights = {"self_attn.in_proj_weight": np.concatenate([params[f"attn.W_{n}"].T for n in "qkv"]),
               "self_attn.in_proj_bias": np.concatenate([params[f"attn.b_{n}"] for n in "qkv"]),
               "self_attn.out_proj.weight": params["attn.W_o"].T, "self_attn.out_proj.bias": params["attn.b_o"],
               "linear1.weight": params["ffn.W_1"].T, "linear1.bias": params["ffn.b_1"],
               "linear2.weight": params["ffn.W_2"].T, "linear2.bias": params["ffn.b_2"],
               **{f"{norm}.{torch_name}": params[f"{norm}.{name}"] for norm in ("norm1", "norm2")
                  for torch_name, name in (("weight", "gain"), ("bias", "bias"))}}
    layer.load_state_dict({name: torch.from_numpy(np.ascontiguousarray(value)) for name, value in weights.items()})
    return layer


def build(figure: str, role: str, shape: str, modules: Path):
    """The function to time, with its inputs and weights loaded once."""
    _, _, d, heads, d_ff = SHAPES[shape]
    with np.load(modules / f"{shape}.npz") as stored:
        params = {name: stored[name] for name in stored.files if name != "u"}
        u = stored["u"]
    if figure == "numpy-forward" and role == "candidate":
        forward = _module(modules, "numpy").forward
        return lambda: forward(u, params, n_heads=heads)
    import torch

    x = torch.from_numpy(u)
    training = figure == "torch-training"
    if role == "reference":
        module = _reference_layer(params, d, heads, d_ff).train(training)
    else:
        module = _module(modules, "torch").Block(d, heads, d_ff).load_params(params).train(training)
    return timed_call(module, x, training)


def timed_call(module, x, training: bool):
    """What one figure times: a whole training step (forward, backward, the optimizer's update) or
    one inference call."""
    import torch

    if training:
        optimizer = torch.optim.SGD(module.parameters(), lr=1e-6)

        def step():
            optimizer.zero_grad(set_to_none=True)
            module(x).square().mean().backward()
            optimizer.step()
        return step

    def infer():
        with torch.inference_mode():
            module(x)
    return infer


def sustained(function, seconds: float) -> list[float]:
    """Per-call times of back-to-back calls for at least ``seconds`` (after a warm-up)."""
    start = time.perf_counter()
    while time.perf_counter() - start < WARM_UP_SECONDS:
        function()
    times = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds or len(times) < 5:
        before = time.perf_counter()
        function()
        times.append(time.perf_counter() - before)
    return times


def profile(function, rows: int = 8) -> tuple[list[dict], dict[str, float]]:
    """The top operators by self CPU time over a few calls, and ms per call per kind (torch figures)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            function()
    averages = sorted(prof.key_averages(), key=lambda event: event.self_cpu_time_total, reverse=True)
    total = sum(event.self_cpu_time_total for event in averages) or 1
    top = [{"op": event.key, "ms_per_call": event.self_cpu_time_total / 3 / 1e3,
            "share": event.self_cpu_time_total / total, "calls": event.count // 3}
           for event in averages[:rows]]
    return top, by_kind([(event.key, event.self_cpu_time_total / 3 / 1e3) for event in averages])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/figure.py", description=__doc__.splitlines()[0])
    parser.add_argument("figure", choices=FIGURES)
    parser.add_argument("role", choices=ROLES)
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("--modules", type=Path, required=True, help="folder with numpy/ and torch/ post_ln.py")
    parser.add_argument("--seconds", type=float, default=1.0, help="measured back-to-back time (default 1 s)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--profile", action="store_true", help="add a torch.profiler operator table (torch) or a per-statement table (NumPy)")
    arguments = parser.parse_args(argv)
    if arguments.figure != "numpy-forward" or arguments.role == "reference":
        import torch

        torch.set_num_threads(arguments.threads)
    function = build(arguments.figure, arguments.role, arguments.shape, arguments.modules)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    times = sustained(function, arguments.seconds)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / len(times)  # warm-up calls: a few more
    median = statistics.median(times)
    result = {"figure": arguments.figure, "role": arguments.role, "shape": arguments.shape,
              "median_s": median, "calls": len(times), "page_faults_per_call": faults,
              "gflops": flops(arguments.shape, training=arguments.figure == "torch-training") / median / 1e9}
    if arguments.profile and arguments.figure == "numpy-forward" and arguments.role == "candidate":
        from numpy_profile import profile_lines

        result["statements"] = profile_lines(function, _module(arguments.modules, "numpy"))
    elif arguments.profile and arguments.figure != "numpy-forward":
        result["profile"], result["kinds"] = profile(function)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
