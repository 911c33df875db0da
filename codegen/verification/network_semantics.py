"""Emitted networks against an independent evaluator written from the continuous definitions.

``semantics/<network>/emitted``: the emitted NumPy module (float64, generated in memory as
``splitformer derive`` writes it) against the evaluator below in 50-digit arithmetic, which
shares no formula code with the derivation or the emitted code:

- the patch embedding ``u(x) = b + ∫_{[0,P)²} W(σ) I(x + σ) dσ`` on the grid ``x = P (r, s)``
  (rectangle rule, unit pixel spacing), the class node first, the position term added;
- a convolution ``K u(x) = b + ∫ k(σ) u(S x + σ − π) dσ`` over the kernel's window with
  stride ``S`` and zero padding ``π`` (``u`` is zero off the grid); its transpose, which
  spreads each node over ``S x + σ``; BatchNorm in evaluation ``γ (v − μ)/√(var + ε) + β``;
  ReLU, the projection onto ``S₂ = {u ≥ 0}``;
- the steps of vit by the scheme evaluator (``semantics.Semantics``), the final LayerNorm as
  Theorem 3.1's projection there, the class-token head ``u(x₀) W^H + b^H``;
- CvT's stages: a strided, padded convolutional embedding and LayerNorm, then pre-LN steps whose
  queries, keys and values are depth-wise convolutions with BatchNorm (keys and values on the
  grid of stride ``stride_kv`` with padding ``padding_kv``), the class node joining unconvolved
  in the last stage, scores scaled by ``d^{-1/2}`` (CvT's whole width), the exact GELU.

- a grid network of no built-in's composition: its file's operators in order, as above, the transfer (or the
  identity) added, then the operator of its projection slot.

Negative controls: the same comparison with the evaluator reading the patch (or kernel)
window transposed, the class node last, the kernel flipped (convolution instead of
cross-correlation), the 3 × 3 windows read without their padding, CvT's keys padded as its
queries or its scores scaled by the head width; each must disagree.
"""

from __future__ import annotations

import mpmath
import numpy as np

from splitformer.symbolic.network_spec import GridNetworkSpec, NetworkSpec, load_network, network_family
from splitformer.symbolic.stack import final_norm_kind, final_norm_scheme

from .network_adjoint_tests import SIDES, any_grid, cvt_parameters, network_module, random_table, unwritten_family
from .semantics import MPMATH, Semantics, Sizes
from .statements import SKIPPED, Check
from .undefined import worst

__all__ = ["network_semantics_checks"]

_DIGITS = 50
_TOLERANCE = 1e-10
_SEPARATED = 1e-3


def _exact(array) -> np.ndarray:
    return np.frompyfunc(mpmath.mpf, 1, 1)(np.asarray(array, dtype=float))


def _patch_embedding(image, p, patch: int, transposed: bool, class_last: bool) -> np.ndarray:
    """``b + ∫ W(σ) I(x + σ) dσ`` at every patch corner, the class node, the position term."""
    channels, height, width = image.shape
    nodes = []
    for r in range(height // patch):
        for s in range(width // patch):
            token = p["embed.b"].copy()
            for c in range(channels):
                for a in range(patch):
                    for b in range(patch):
                        weight = p["embed.W"][c, b, a] if transposed else p["embed.W"][c, a, b]
                        token = token + weight * image[c, patch * r + a, patch * s + b]
            nodes.append(token)
    tokens = nodes + [p["embed.cls"]] if class_last else [p["embed.cls"]] + nodes
    return np.array(tokens) + p["embed.pos"]


def _vit_evaluator(model, params, image, options, transposed=False, class_last=False) -> tuple[np.ndarray, np.ndarray]:
    """The final hidden states and the logits of one image."""
    heads, eps, patch = options["n_heads"], mpmath.mpf(options["eps"]), options["patch_size"]
    u = _patch_embedding(image, params, patch, transposed, class_last)
    tokens, d = u.shape
    sizes = Sizes(tokens, d, heads, params["layers.0.ffn.W_1"].shape[1] if "layers.0.ffn.W_1" in params else 0)
    support = np.ones((tokens, tokens), dtype=int)
    layer = 0
    while any(name.startswith(f"layers.{layer}.") for name in params):
        prefix = f"layers.{layer}."
        step = {name[len(prefix):]: value for name, value in params.items() if name.startswith(prefix)}
        u = Semantics(model.scheme, step, sizes, MPMATH, support=support, eps=eps).step(u)
        layer += 1
    if model.final_norm:
        u = Semantics(final_norm_scheme(final_norm_kind(model.scheme)), params, sizes, MPMATH, eps=eps).step(u)
    return u, u[0] @ params["head.W"] + params["head.b"]


def _vit(module, rng, spec):
    sizes = {"n_channels": 2, "patch_size": 2, "d": 8, "d_ff": 6, "n_tokens": 7, "n_classes": 3, "n_heads": 2, "d_head": 4}
    params = random_table({**module.PARAMETERS, **module.HEAD_PARAMETERS}, sizes, rng)
    for layer in range(2):
        params |= random_table(module.LAYER_PARAMETERS, sizes, rng, f"layers.{layer}.")
    options = {"patch_size": 2, "n_heads": 2, "eps": 1e-6, "image_size": (4, 6)}  # a 2 × 3 grid: its layout given
    images = rng.standard_normal((2, 2, 4, 6))
    model = spec

    def emitted():
        return module.forward(images, params, **options), module.logits(images, params, **options)

    def evaluator(exact, count, **wrong):
        results = [_vit_evaluator(model, exact, _exact(image), options, **wrong) for image in images[:count]]
        return np.array([r[0] for r in results]), np.array([r[1] for r in results])

    controls = {"patch window transposed": {"transposed": True}, "class node last": {"class_last": True}}
    described = (f"vit (final hidden states and logits: 2 images of 2 × 4 × 6 pixels, a 2 × 3 grid of 2 × 2 "
                 f"patches and the class node, d = 8, 2 heads, d_ff = 6, 2 steps of '{spec.scheme.name}' "
                 f"({spec.scheme.activation}), ε = 1e-6, 3 classes)")
    return params, emitted, evaluator, controls, described


def _convolution(u, weight, bias, stride: int, padding: int, flipped=False, shift=0) -> np.ndarray:
    """``b + ∫ k(σ) u(S x + σ − π) dσ``: ``u`` (channels, H, W), ``weight`` (c_in, k, k, c_out);
    ``shift`` moves the windows (a control)."""
    channels, height, width = u.shape
    k = weight.shape[1]
    rows, cols = (height + 2 * padding - k) // stride + 1, (width + 2 * padding - k) // stride + 1
    out = np.empty((weight.shape[3], rows, cols), dtype=object)
    for p in range(rows):
        for q in range(cols):
            total = bias.copy()
            for r in range(k):
                for s in range(k):
                    y, x = stride * p + r - padding + shift, stride * q + s - padding + shift
                    if 0 <= y < height and 0 <= x < width:  # zero off the grid
                        kernel = weight[:, k - 1 - r, k - 1 - s] if flipped else weight[:, r, s]
                        total = total + u[:, y, x] @ kernel
            out[:, p, q] = total
    return out


def _transposed_convolution(z, weight, bias, stride: int, flipped=False) -> np.ndarray:
    """Each node ``x`` spread over ``S x + σ`` with ``k(σ)`` (no overlap when ``S = k``), plus ``b``."""
    channels, rows, cols = z.shape
    k = weight.shape[1]
    out = np.empty((weight.shape[3], stride * (rows - 1) + k, stride * (cols - 1) + k), dtype=object)
    for index in np.ndindex(out.shape):
        out[index] = bias[index[0]]
    for p in range(rows):
        for q in range(cols):
            for r in range(k):
                for s in range(k):
                    kernel = weight[:, k - 1 - r, k - 1 - s] if flipped else weight[:, r, s]
                    out[:, stride * p + r, stride * q + s] += z[:, p, q] @ kernel
    return out


def _batch_norm(u, p, key: str, eps) -> np.ndarray:
    scale = np.array([g / mpmath.sqrt(v + eps) for g, v in zip(p[f"{key}.gain"], p[f"{key}.var"])], dtype=object)
    return (u - p[f"{key}.mean"][:, None, None]) * scale[:, None, None] + p[f"{key}.bias"][:, None, None]


def _relu(u) -> np.ndarray:
    return np.frompyfunc(lambda value: max(value, 0), 1, 1)(u)


def _resnet_evaluator(p, u, stride: int, eps, flipped=False, shift=0) -> np.ndarray:
    """``Proj_S₂(R u + F(u))``, ``F = B₂ K₂ Proj_S₂ B₁ K₁`` (3 × 3 windows), ``R = B₃ K₃`` (1 × 1, strided)."""
    field = _relu(_batch_norm(_convolution(u, p["conv1.W"], p["conv1.b"], stride, 1, flipped, shift), p, "bn1", eps))
    field = _batch_norm(_convolution(field, p["conv2.W"], p["conv2.b"], 1, 1, flipped, shift), p, "bn2", eps)
    transfer = _batch_norm(_convolution(u, p["shortcut.W"], p["shortcut.b"], stride, 0), p, "bn3", eps)
    return _relu(transfer + field)


def _unet_evaluator(p, u, stride: int, eps, flipped=False, shift=0) -> np.ndarray:
    """``u + K_up Proj_S₂ B K D u``: a strided descent, a step on the coarse grid, the transposed ascent."""
    coarse = _convolution(u, p["down.W"], p["down.b"], stride, 1, flipped, shift)
    coarse = _relu(_batch_norm(_convolution(coarse, p["conv.W"], p["conv.b"], 1, 1, flipped, shift), p, "bn", eps))
    return u + _transposed_convolution(coarse, p["up.W"], p["up.b"], stride, flipped)


def _applied(spec: GridNetworkSpec, keys: tuple[str, ...], p, x, stride: int, eps, flipped=False, shift=0):
    """The operators ``keys`` of the file ``spec`` applied to ``x`` in order, each as its definition above reads it
    (an operator applied twice reads its one set of parameters twice)."""
    for key in keys:
        operator = spec.operators[key]
        if operator.kind == "convolution":
            x = _convolution(x, p[f"{key}.W"], p[f"{key}.b"], stride if operator.stride == "stride" else operator.stride,
                             operator.padding, flipped, shift)
        elif operator.kind == "transposed-convolution":
            x = _transposed_convolution(x, p[f"{key}.W"], p[f"{key}.b"], operator.kernel, flipped)
        elif operator.kind == "batch-norm":
            x = _batch_norm(x, p, key, eps)
        else:  # relu-projection, the only other grid kind
            x = _relu(x)
    return x


def _file_evaluator(spec: GridNetworkSpec, p, u, stride: int, eps, transfer: bool, flipped=False, shift=0,
                    without_field=False) -> np.ndarray:
    """One step of the grid network ``spec`` read from its file: ``P(R u + F(u))`` with ``F`` its field's operators in
    order, ``R`` its transfer's (or the identity), ``P`` the operator of its projection slot (or none). The controls'
    ``flipped`` and ``shift`` reach every operator, ``without_field`` leaves ``F`` out."""
    wrong = {"flipped": flipped, "shift": shift}
    field = 0 if without_field else _applied(spec, spec.field, p, u, stride, eps, **wrong)
    update = (_applied(spec, spec.transfer, p, u, stride, eps, **wrong) if transfer else u) + field
    return _applied(spec, (spec.projection,), p, update, stride, eps, **wrong) if spec.projection else update


def _nodes(spec: GridNetworkSpec, keys: tuple[str, ...], side: int, stride: int) -> list[int]:
    """The nodes per axis of each grid the operators ``keys`` write from a ``side`` × ``side`` field."""
    nodes = []
    for key in keys:
        operator = spec.operators[key]
        if operator.kind == "convolution":
            step = stride if operator.stride == "stride" else operator.stride
            side = (side + 2 * operator.padding - operator.kernel) // step + 1
        elif operator.kind == "transposed-convolution":
            side *= operator.kernel
        nodes.append(side)
    return nodes


def _sides(spec: GridNetworkSpec) -> tuple[int, ...]:
    """Image sides for the evaluator, the first one on which every grid the field and the transfer write has at
    least 3 nodes per axis at stride 2 (a placement or order of nodes shows; on one coarse node none would), then
    the search's other sides."""
    fair = [side for side in range(4, SIDES[-1] + 1)
            if min(_nodes(spec, spec.field, side, 2) + _nodes(spec, spec.transfer, side, 2), default=side) >= 3]
    return (*fair[:8], *(side for side in SIDES if side not in fair[:8]))


def _any_grid_network(module, rng, spec):
    """A grid network of no built-in's composition, evaluated from its file (``_file_evaluator``) at the first sizes
    its module runs from ``_sides`` (``network_adjoint_tests``' search: with its transfer first); None where none
    runs. The controls are the field left out, every kernel flipped and every convolution's windows shifted by one
    node, each where it changes the evaluator's result (``network_semantics_checks`` leaves out one that does not)."""
    found = any_grid(spec, module, rng, sides=_sides(spec))
    if not isinstance(found, tuple):
        return None
    pixels, params, _, _, options, described = found
    transfer = any(name in params for name in module.TRANSFER_PARAMETERS)

    def emitted():
        return (module.forward(pixels, params, **options),)

    def evaluator(exact, count, **wrong):
        eps = mpmath.mpf(options["eps"])
        return (np.array([_file_evaluator(spec, exact, _exact(image), options.get("stride", 1), eps, transfer, **wrong)
                          for image in pixels[:count]]),)

    controls = {"the field F left out": {"without_field": True}, "kernels flipped": {"flipped": True},
                "windows shifted by one node": {"shift": 1}}
    return params, emitted, evaluator, controls, described.replace("one step of ", "", 1)


def _grid(evaluate, transfer: bool, described: str):
    def build(module, rng, spec):
        table = {**module.PARAMETERS, **(module.TRANSFER_PARAMETERS if transfer else {})}
        params = random_table(table, {"n_channels": 3, "d": 4}, rng)
        u = rng.standard_normal((2, 3, 6, 6))
        options = {"stride": 2, "eps": 1e-5} if spec.reads_stride else {"eps": 1e-5}  # unet-level's is fixed at 2

        def emitted():
            return (module.forward(u, params, **options),)

        def evaluator(exact, count, **wrong):
            eps = mpmath.mpf(options["eps"])
            return (np.array([evaluate(exact, _exact(image), options.get("stride", 2), eps, **wrong) for image in u[:count]]),)

        controls = {"kernel flipped": {"flipped": True}, "3 × 3 windows read without their padding": {"shift": 1}}
        return params, emitted, evaluator, controls, described
    return build


def _layer_norm(rows, gain, bias, eps) -> np.ndarray:
    """Theorem 3.1's projection of each row (mean 0, variance 1, ε as a ghost coordinate), then gain and bias."""
    out = []
    for row in rows:
        mean = sum(row) / len(row)
        variance = sum((value - mean) ** 2 for value in row) / len(row)
        out.append((row - mean) / mpmath.sqrt(variance + eps))
    return np.array(out) * gain + bias


def _depthwise(field, weight, stride: int, padding: int) -> np.ndarray:
    """``∫ k_l(σ) u_l(S x + σ − π) dσ`` per channel ``l``: ``weight`` (k, k, d), ``field`` (d, H, W)."""
    channels = field.shape[0]
    identity = np.array([[weight[:, :, l] * (l == c) for l in range(channels)] for c in range(channels)], dtype=object)
    return _convolution(field, identity.transpose(0, 2, 3, 1), np.zeros(channels, dtype=object), stride, padding)


def _tokens(field) -> np.ndarray:
    """Grid nodes as tokens, row-major (node ``N₂ p + q``)."""
    return field.reshape(field.shape[0], -1).T


def _cvt_step(tokens, p, rows, cols, config, eps, keys_padded_as_queries=False, head_scale=False) -> np.ndarray:
    """Pre-LN: ``u + A(LN u)``, A with depth-wise convolutions and BatchNorm before the point-wise Q/K/V
    (keys and values on the grid of stride ``stride_kv``), the class node joining unconvolved; then
    ``u + F(LN u)`` with the exact GELU. Scores scaled by ``d^{-1/2}`` (CvT's choice, the whole width)."""
    d = tokens.shape[1]
    heads, width = config["n_heads"], d // config["n_heads"]
    x = _layer_norm(tokens, p["norm1.gain"], p["norm1.bias"], eps)
    node, grid = (x[:1], x[1:]) if config["cls"] else (x[:0], x)
    field = grid.T.reshape(d, rows, cols)
    kv_padding = config["padding_q"] if keys_padded_as_queries else config["padding_kv"]
    inputs = {}
    for name, stride, padding in (("q", config["stride_q"], config["padding_q"]), ("k", config["stride_kv"], kv_padding),
                                  ("v", config["stride_kv"], kv_padding)):
        projected = _batch_norm(_depthwise(field, p[f"{name}conv.W"], stride, padding), p, f"{name}bn", eps)
        inputs[name] = np.concatenate([node, _tokens(projected)]) @ p[f"attn.W_{name}"] + p[f"attn.b_{name}"]
    scale = mpmath.sqrt(width if head_scale else d)
    mixed = []
    for m in range(heads):
        columns = slice(m * width, (m + 1) * width)
        scores = inputs["q"][:, columns] @ inputs["k"][:, columns].T / scale
        weights = np.frompyfunc(mpmath.exp, 1, 1)(scores)
        weights = weights / weights.sum(axis=1)[:, None]
        mixed.append(weights @ inputs["v"][:, columns])
    u = tokens + np.concatenate(mixed, axis=1) @ p["attn.W_o"] + p["attn.b_o"]
    hidden = _layer_norm(u, p["norm2.gain"], p["norm2.bias"], eps) @ p["ffn.W_1"] + p["ffn.b_1"]
    hidden = np.frompyfunc(lambda w: w * (1 + mpmath.erf(w / mpmath.sqrt(2))) / 2, 1, 1)(hidden)
    return u + hidden @ p["ffn.W_2"] + p["ffn.b_2"]


def _cvt_evaluator(params, image, stages, eps, **wrong) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The last stage's grid (d, rows, cols), the class node's state and the logits of one image."""
    field, node = image, None
    for index, config in enumerate(stages):
        p = {name.removeprefix(f"stages.{index}."): value for name, value in params.items()
             if name.startswith(f"stages.{index}.")}
        embedded = _convolution(field, p["embed.W"], p["embed.b"], config["patch_stride"], config["patch_padding"])
        d, rows, cols = embedded.shape
        tokens = _layer_norm(_tokens(embedded), p["embed_norm.gain"], p["embed_norm.bias"], eps)
        if config["cls"]:
            tokens = np.concatenate([p["cls"][None], tokens])
        layer = 0
        while f"layers.{layer}.attn.W_q" in p:
            step = {name.removeprefix(f"layers.{layer}."): value for name, value in p.items()}
            tokens = _cvt_step(tokens, step, rows, cols, config, eps, **wrong)
            layer += 1
        node = tokens[0] if config["cls"] else None
        field = tokens[int(config["cls"]):].T.reshape(d, rows, cols)
    readout = _layer_norm(node[None], params["final_norm.gain"], params["final_norm.bias"], eps)[0]
    return field, node, readout @ params["head.W"] + params["head.b"]


def _cvt(module, rng, spec):
    stage = {"patch_size": 3, "patch_stride": 2, "patch_padding": 1, "kernel_qkv": 3, "stride_q": 1, "padding_q": 1}
    stages = [{**stage, "n_heads": 1, "stride_kv": 2, "padding_kv": 0, "cls": False},
              {**stage, "n_heads": 2, "stride_kv": 1, "padding_kv": 2, "cls": True}]
    params = cvt_parameters(module, rng)
    images = rng.standard_normal((2, 2, 8, 6))
    eps = 1e-5

    def emitted():
        grid, node = module.forward(images, params, stages=stages, eps=eps)
        return grid, node[:, 0], module.logits(images, params, stages=stages, eps=eps)

    def evaluator(exact, count, **wrong):
        results = [_cvt_evaluator(exact, _exact(image), stages, mpmath.mpf(eps), **wrong) for image in images[:count]]
        return tuple(np.array([result[part] for result in results]) for part in range(3))

    controls = {"keys padded as the queries": {"keys_padded_as_queries": True},
                "scores scaled by the head width": {"head_scale": True}}
    described = ("cvt (last grid, class node and logits: 2 images of 2 × 8 × 6 pixels; 2 stages, d = 4 then 6, "
                 "convolutional embeddings of kernel 3, stride 2, padding 1; Q/K/V depth-wise convolutions of kernel 3 "
                 "with padding_q = 1 and padding_kv = 0 (stride 2), then 2 (stride 1); the class node in the last "
                 "stage; ε = 1e-5, 3 classes)")
    return params, emitted, evaluator, controls, described


_BUILDERS = {
    "vit": _vit,
    "cvt": _cvt,
    "resnet-block": _grid(_resnet_evaluator, True, "resnet-block (2 images of 3 channels on 6 × 6, d = 4, stride 2: "
                          "3 × 3 windows with padding 1, the 1 × 1 strided shortcut with its BatchNorm)"),
    "unet-level": _grid(_unet_evaluator, False, "unet-level (2 images of 3 channels on 6 × 6, d = 4: the 3 × 3 "
                        "descent of stride 2 with padding 1, a 3 × 3 step, the 2 × 2 transposed ascent of stride 2)"),
}


def _worst(got: tuple, expected: tuple) -> float:
    """max |got − expected| over the images ``expected`` has (the first ones of ``got``)."""
    return worst(float(np.max(np.abs(np.asarray(g[:len(e)], dtype=float) - np.asarray(e, dtype=float))))
                 for g, e in zip(got, expected))


def network_semantics_checks(spec: NetworkSpec | str) -> list[Check]:
    """The emitted network against the evaluator of its family (the built-in network whose
    composition it shares; a vit-like network may step another scheme), and the evaluator's
    wrong variants (controls)."""
    spec = load_network(spec) if isinstance(spec, str) else spec
    name, family = spec.name, network_family(spec)
    statement = "The emitted NumPy module computes what the independent evaluator defines from the continuous operators."
    if family is None and not isinstance(spec, GridNetworkSpec):
        return [unwritten_family(f"semantics/{name}/emitted", spec, statement)]
    module = network_module(spec)
    rng = np.random.default_rng(81)
    if family is None:  # a grid network of its own composition: evaluated from its file
        built = _any_grid_network(module, rng, spec)
        if built is None:
            return [Check(f"semantics/{name}/emitted", name, statement, SKIPPED, True,
                          "no image size tried runs the step (see its adjoint tests), so there is nothing to compare")]
        params, emitted, evaluator, controls, described = built
    else:
        params, emitted, evaluator, controls, described = _BUILDERS[family](module, rng, spec)
        described = described if family == name else f"{name} (a {family} network: {described.replace(family, name, 1)})"
    got = emitted()
    inert = []  # a file's control that computes what the evaluator computes at these sizes shows nothing: left out
    with mpmath.workdps(_DIGITS):
        exact = {key: _exact(value) for key, value in params.items()}
        expected = evaluator(exact, len(got[0]))
        error = _worst(got, expected)
        wrong = {}
        for label, change in controls.items():
            changed = evaluator(exact, 1, **change)
            if family is None and _worst(expected, changed) <= _SEPARATED:
                inert.append(label)
            else:
                wrong[label] = _worst(got, changed)
    scale = max(1.0, max(float(np.max(np.abs(value))) for value in got))
    what = ("patch and convolution integrals over their windows by the rectangle rule, zero padding, strided grids, "
            "the class node" if family is not None and not isinstance(spec, GridNetworkSpec) else
            "convolution integrals over their windows by the rectangle rule, zero padding, strided and prolonged grids")
    return [Check(
        f"semantics/{name}/emitted", name,
        f"The emitted NumPy module of {described} computes what the independent evaluator defines from the "
        f"continuous operators ({what}; 50-digit arithmetic), in float64. Controls: the evaluator "
        f"with {', '.join(wrong)} disagrees (on the first image).",
        "numeric", bool(error <= _TOLERANCE * scale and wrong and min(wrong.values()) > _SEPARATED),
        f"max |emitted − evaluator| {error:.1e} (tolerance {_TOLERANCE:g} × {scale:.2g}); controls: "
        + ", ".join(f"{label} {value:.2e}" for label, value in wrong.items())
        + (f" ({', '.join(inert)}: no change at these sizes, left out)" if inert else ""))]
