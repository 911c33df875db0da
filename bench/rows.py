"""The rows of ``make bench``: what each row times as its reference and as the generated candidate.

A row's name says what it is: ``SCHEME/SHAPE/FIGURE`` for one block (``post-ln/N128/torch``,
``llama/N1024/numpy``, ``post-ln/N128/training``, ``llama/N128/derived``), ``NETWORK/BACKEND``
for a network (``cvt/numpy``), ``decoding/bBATCH/BACKEND`` for KV-cached decoding. ``row(name)``
builds any such row (the ``tiny`` shape included, for tests); ``NAMES`` lists the table's rows.

Figures: ``torch`` (generated ``Block``, inference) and ``numpy`` (generated ``forward``) against
the source module's inference; ``training`` (a training step through the generated ``Block``,
autograd) and ``derived`` (the same with ``backward="derived"``) against the source module's
training step (autograd). The NumPy candidates read their weights and inputs from a file that
``prepare`` writes beforehand, so their process never imports torch, as a NumPy user's would not.
"""

from __future__ import annotations

import importlib.util
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shapes import SHAPES, flops

BLOCKS = {"post-ln": "torch.nn.TransformerEncoderLayer", "llama": "transformers LlamaDecoderLayer",
          "gpt2": "transformers GPT2Block", "decoder": "torch.nn.TransformerDecoderLayer"}
#: figure: (target ratio generated / reference, GEMM limit compared with).
BLOCK_FIGURES = {"torch": (1.00, "torch"), "numpy": (1.30, "numpy"), "training": (1.00, "torch"),
                 "derived": (1.00, "torch")}
#: (scheme, figure): a target other than the figure's (post-ln's earlier ones; the derived backward ≤ 0.90×).
TARGETS = {("post-ln", "training"): 0.90, ("post-ln", "numpy"): 1.20, ("post-ln", "derived"): 0.90}
NETWORKS = {"vit": "transformers ViTModel", "cvt": "transformers CvtModel",
            "resnet-block": "torch Conv2d/BatchNorm2d", "unet-level": "torch Conv2d/BatchNorm2d/ConvTranspose2d"}
#: decoding: the candidate's rate / the reference's rate at least this.
DECODING_TARGETS = {"torch": 1.00, "numpy": 0.70}
NEW_TOKENS = 256

NAMES = (*(f"post-ln/{shape}/{figure}" for shape in ("N128", "N1024") for figure in ("torch", "training", "numpy")),
         *(f"llama/{shape}/{backend}" for shape in ("N128", "N1024") for backend in ("torch", "numpy")),
         "gpt2/N128/torch", "gpt2/N128/numpy", "decoder/N128/torch", "decoder/N128/numpy",
         *(f"{network}/{backend}" for network in NETWORKS for backend in ("torch", "numpy")),
         *(f"decoding/b{batch}/{backend}" for batch in (1, 8) for backend in DECODING_TARGETS),
         "post-ln/N128/derived", "post-ln/N1024/derived", "llama/N128/derived")


class Seconds(float):
    """A call's own measure of its time (decoding: seconds per generated token, the prompt excluded)."""


@dataclass(frozen=True)
class Timed:
    """What one process times: ``call`` (back to back), ``warm_up`` first (default: ``call``), and
    for a training row ``kept``, the bytes one forward keeps for the backward pass."""

    call: Callable[[], object]
    warm_up: Callable[[], object] | None = None
    kept: Callable[[], int] | None = None


@dataclass(frozen=True)
class Row:
    """One line of the table.

    ``build(role, modules)``: what a ``reference`` or torch ``candidate`` process times, the
    generated modules read from ``modules``. A NumPy row has ``numpy_inputs()`` instead, (args,
    params, kwargs) written by ``prepare`` (it may use torch) and read by ``numpy_build``, which runs the generated
    NumPy module ``numpy_module`` (its statements are what ``--profile`` times; "": the name's first part). ``rate``:
    the ratio is the candidate's rate over the reference's and ``target`` a lower bound (otherwise
    generated time / reference time, ``target`` an upper bound).
    """

    name: str
    shapes: str
    reference: str
    target: float
    build: Callable[[str, Path], Timed]
    limit: str = ""  # the GEMM limit ("torch", "numpy") the GFLOP/s are a share of; "" for none
    flops: float = 0.0  # per call
    rate: bool = False
    training: bool = False
    numpy_inputs: Callable[[], tuple] | None = None
    numpy_build: Callable[[tuple, Path], Timed] | None = None
    numpy_module: str = ""

    @property
    def profiled_module(self) -> str:
        """The generated NumPy module a NumPy candidate runs."""
        return self.numpy_module or self.name.split("/")[0]

    def imports_torch(self, role: str) -> bool:
        return role == "reference" or self.numpy_inputs is None

    def prepare(self, inputs: Path) -> None:
        """Write the NumPy candidate's weights and inputs under ``inputs`` (once per file)."""
        path = self._stored(inputs)
        if self.numpy_inputs is not None and not path.exists():
            with open(path, "wb") as file:
                pickle.dump(self.numpy_inputs(), file)

    def timed(self, role: str, modules: Path, inputs: Path) -> Timed:
        """What a process of ``role`` (``reference``, ``candidate``) times."""
        if role == "reference" or self.numpy_build is None:
            return self.build(role, modules)
        path = self._stored(inputs)
        if not path.exists():
            raise SystemExit(f"error: {path} is missing: Row.prepare writes it before {self.name} is timed")
        with open(path, "rb") as file:
            return self.numpy_build(pickle.load(file), modules)

    def _stored(self, inputs: Path) -> Path:
        return inputs / (self.name.replace("/", "-") + ".pickle")


def generated(modules: Path, backend: str, name: str):
    """The generated module ``modules/BACKEND/NAME.py``."""
    path = modules / backend / f"{name.replace('-', '_')}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{backend}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _numpy_forward(name: str) -> Callable[[tuple, Path], Timed]:
    """``forward(*args, params, **kwargs)`` of the generated NumPy module ``name``."""
    def build(stored: tuple, modules: Path) -> Timed:
        args, params, kwargs = stored
        forward = generated(modules, "numpy", name).forward
        return Timed(lambda: forward(*args, params, **kwargs))
    return build


# --- one block against its source module ---------------------------------------------------------

def candidate_block(scheme: str, shape: str, modules: Path, backward: str = "autograd"):
    """The generated ``Block`` holding the source's parameters, and the inputs."""
    from sources import block_source

    _, adapted, tensors = block_source(scheme, *SHAPES[shape])
    options = {key: adapted.options[key] for key in ("n_kv_heads", "rope_theta") if key in adapted.options}
    block = generated(modules, "torch", scheme).Block(adapted.sizes["d_model"], adapted.n_heads, adapted.sizes["d_ff"],
                                                      eps=adapted.eps, bias=adapted.bias, backward=backward, **options)
    return adapted.load_into(block), tensors


def _block_build(scheme: str, shape: str, figure: str, role: str, modules: Path) -> Timed:
    from sources import block_source, timed_call

    training = figure in ("training", "derived")
    if role == "reference":
        source, _, tensors = block_source(scheme, *SHAPES[shape])
        return timed_call(source, tensors, training)
    block, tensors = candidate_block(scheme, shape, modules, "derived" if figure == "derived" else "autograd")
    return timed_call(block, tensors, training)


def _block_inputs(scheme: str, shape: str) -> tuple:
    from sources import block_source

    _, adapted, tensors = block_source(scheme, *SHAPES[shape])
    return [tensor.numpy() for tensor in tensors], dict(adapted.params), adapted.forward_kwargs


def _block_row(scheme: str, shape: str, figure: str) -> Row:
    batch, tokens, d, heads, d_ff = SHAPES[shape]
    target, limit = BLOCK_FIGURES[figure]
    training = figure in ("training", "derived")
    reference = BLOCKS[scheme] + (" training step (autograd)" if training else "")
    kv = f" over {heads // 4 or 1} KV heads" if scheme == "llama" else ""
    memory = f", memory {tokens}" if scheme == "decoder" else ""
    numpy = figure == "numpy"
    return Row(f"{scheme}/{shape}/{figure}", f"B {batch}, N {tokens}, d {d}, {heads} heads{kv}, d_ff {d_ff}{memory}",
               reference, TARGETS.get((scheme, figure), target),
               lambda role, modules: _block_build(scheme, shape, figure, role, modules),
               limit=limit, flops=flops(shape, training=training, scheme=scheme), training=training,
               numpy_inputs=(lambda: _block_inputs(scheme, shape)) if numpy else None,
               numpy_build=_numpy_forward(scheme) if numpy else None)


# --- networks ----------------------------------------------------------------------------------

def _network_build(name: str, role: str, modules: Path) -> Timed:
    import torch

    import networks

    function = networks.torch_call(name, "reference" if role == "reference" else "torch", modules)

    def infer():
        with torch.inference_mode():
            function()
    return Timed(infer)


def _network_row(name: str, backend: str) -> Row:
    import networks

    numpy = backend == "numpy"
    return Row(f"{name}/{backend}", networks.SHAPES[name], NETWORKS[name], BLOCK_FIGURES[backend][0],
               lambda role, modules: _network_build(name, role, modules),
               numpy_inputs=(lambda: networks.numpy_inputs(name)) if numpy else None,
               numpy_build=_numpy_forward(name) if numpy else None)


# --- KV-cached decoding ------------------------------------------------------------------------

def _generation(step, batch: int, new_tokens: int) -> Timed:
    """Generate ``new_tokens`` after the prompt (warm-up: 8 tokens); the time per token."""
    import decoding

    def call():
        seconds, _ = decoding.generate(step, batch, new_tokens, np.float32)
        return Seconds(seconds / new_tokens)
    return Timed(call, warm_up=lambda: decoding.generate(step, batch, 8, np.float32))


def _decoding_row(batch: int, backend: str, new_tokens: int) -> Row:
    import decoding

    sizes = decoding.SIZES

    def build(role: str, modules: Path) -> Timed:
        return _generation(decoding.decoder("reference" if role == "reference" else backend, "float32", modules),
                           batch, new_tokens)

    def numpy_build(stored: tuple, modules: Path) -> Timed:
        return _generation(decoding.numpy_step(generated(modules, "numpy", "llama"), *stored[1:]), batch, new_tokens)

    numpy = backend == "numpy"
    return Row(f"decoding/b{batch}/{backend}",
               f"batch {batch}, {new_tokens} new tokens after {sizes['prompt']}, {sizes['n_layers']} layers, "
               f"d {sizes['d']}; time per token", "transformers LlamaModel + DynamicCache", DECODING_TARGETS[backend],
               build, rate=True, numpy_inputs=decoding.stack_inputs if numpy else None,
               numpy_build=numpy_build if numpy else None, numpy_module="llama")


def row(name: str, *, new_tokens: int = NEW_TOKENS) -> Row:
    """The row called ``name`` (see the module's docstring)."""
    parts = name.split("/")
    if len(parts) == 3 and parts[0] in BLOCKS and parts[1] in SHAPES and parts[2] in BLOCK_FIGURES:
        return _block_row(*parts)
    if len(parts) == 2 and parts[0] in NETWORKS and parts[1] in ("torch", "numpy"):
        return _network_row(*parts)
    if (len(parts) == 3 and parts[0] == "decoding" and parts[1][:1] == "b" and parts[1][1:].isdigit()
            and parts[2] in DECODING_TARGETS):
        return _decoding_row(int(parts[1][1:]), parts[2], new_tokens)
    raise SystemExit(f"error: no benchmark row {name!r}; rows are SCHEME/SHAPE/FIGURE ({', '.join(BLOCKS)}; "
                     f"{', '.join(SHAPES)}; {', '.join(BLOCK_FIGURES)}), NETWORK/BACKEND ({', '.join(NETWORKS)}) "
                     f"and decoding/bBATCH/BACKEND")
