"""Devito's adjoint tests (``adjoint_tests``) of each network's emitted NumPy ``vjp``.

The module is generated in memory as ``splitformer derive`` writes it; random parameters
come from its own tables of canonical names and shapes (gains near 1, BatchNorm variances
in (1, 2)); sizes are small: vit and cvt through their logits (embedding, class node,
steps, final projection and head), resnet-block with its strided shortcut, unet-level with
its strided descent and transposed-convolution ascent.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from splitformer.symbolic.network_spec import GridNetworkSpec, NetworkSpec, load_network, network_family

from .adjoint_tests import Point, adjoint_tests
from .emitted import compiled
from .statements import SKIPPED, Check

__all__ = ["network_adjoint_tests", "network_module", "random_table", "unwritten_family", "any_grid", "SIDES"]


#: Emitted modules by what their network computes and is named (``repr`` of the spec).
_MODULES: dict[str, object] = {}


def network_module(spec: NetworkSpec | str):
    """The emitted NumPy module of the network ``spec`` (or built-in name), generated in memory (once a process)."""
    from ..pipeline import generate_network

    spec = load_network(spec) if isinstance(spec, str) else spec
    if repr(spec) not in _MODULES:
        files = generate_network(spec, ("numpy",), Path("emitted"))
        _MODULES[repr(spec)] = compiled(files[Path("emitted") / "numpy" / f"{spec.module_name}.py"], "numpy",
                                        spec.module_name)
    return _MODULES[repr(spec)]


def unwritten_family(check_id: str, spec: NetworkSpec, statement: str) -> Check:
    """The skipped check of a network whose composition no built-in network shares."""
    return Check(check_id, spec.name, statement, SKIPPED, True,
                 "no sizes or evaluator are written for this composition (only for those of the built-in networks: "
                 "vit, cvt, resnet-block, unet-level)")


def random_table(table: dict, sizes: dict, rng: np.random.Generator, prefix: str = "") -> Point:
    """An array per canonical name of ``table`` (name → shape in size names or numbers)."""
    params = {}
    for name, shape in table.items():
        dims = tuple(sizes[axis] if isinstance(axis, str) else axis for axis in shape)
        values = rng.standard_normal(dims) / np.sqrt(dims[0] if len(dims) > 1 else 1)
        if name.endswith(".var"):
            values = 1 + np.abs(values) / 2
        elif name.endswith(".gain"):
            values = 1 + values / 2
        params[prefix + name] = values
    return params


def _vit(module, rng):
    # n_heads: a step's control per head (talking heads mix the head axis)
    sizes = {"n_channels": 2, "patch_size": 2, "d": 8, "d_ff": 6, "n_tokens": 5, "n_classes": 3, "n_heads": 2}
    params = random_table({**module.PARAMETERS, **module.HEAD_PARAMETERS}, sizes, rng)
    for layer in range(2):
        params |= random_table(module.LAYER_PARAMETERS, sizes, rng, f"layers.{layer}.")
    options = {"patch_size": 2, "n_heads": 2, "eps": 1e-6}
    return (rng.standard_normal((2, 2, 4, 4)), params, module.logits, module.vjp_logits, options,
            "the logits of vit (2 images of 2 × 4 × 4 pixels, 2 × 2 patches of 2 pixels and the class node, d = 8, "
            "2 heads, d_ff = 6, 2 steps, 3 classes)")


def cvt_parameters(module, rng: np.random.Generator) -> dict:
    """Random parameters of a cvt module at the checks' sizes: 2 input channels, 2 stages of d = 4 then 6 (d_ff = d + 2,
    one step each, kernels of 3), the class node in the last stage, 3 classes."""
    params, channels = {}, 2
    for index, d in enumerate((4, 6)):
        sizes = {"n_channels": channels, "patch_size": 3, "d": d, "kernel_qkv": 3, "d_ff": d + 2}
        params |= random_table(module.STAGE_PARAMETERS, sizes, rng, f"stages.{index}.")
        params |= random_table(module.LAYER_PARAMETERS, sizes, rng, f"stages.{index}.layers.0.")
        channels = d
    params["stages.1.cls"] = rng.standard_normal(channels)
    return params | random_table(module.HEAD_PARAMETERS, {"d": channels, "n_classes": 3}, rng)


def _cvt(module, rng):
    stage = {"patch_size": 3, "patch_stride": 2, "patch_padding": 1, "kernel_qkv": 3, "stride_q": 1, "padding_q": 1,
             "stride_kv": 2, "padding_kv": 1}
    stages = [{**stage, "n_heads": 1, "cls": False}, {**stage, "n_heads": 2, "cls": True}]
    params = cvt_parameters(module, rng)
    return (rng.standard_normal((2, 2, 6, 6)), params, module.logits, module.vjp_logits, {"stages": stages, "eps": 1e-5},
            "the logits of cvt (2 images of 2 × 6 × 6 pixels; 2 stages, d = 4 then 6, each with a convolutional "
            "embedding of kernel 3, stride 2, padding 1 and one step whose Q/K/V convolutions have kernel 3, padding "
            "1, K/V stride 2; the class node in the last stage, 3 classes)")


def _grid(module, rng, transfer: bool, described: str, channels: int = 3, side: int = 4):
    sizes = {"n_channels": channels, "d": 4}
    table = {**module.PARAMETERS, **(module.TRANSFER_PARAMETERS if transfer else {})}
    return (rng.standard_normal((2, channels, side, side)), random_table(table, sizes, rng), module.forward, module.vjp,
            {"stride": 2, "eps": 1e-5}, described)


#: The image sides ``any_grid`` tries, 4 × 4 first, and the seconds it may take: a step its module refuses at
#: every side (its F(u) and R u never meet) fails; one whose outputs are empty up to the last side, or whose search
#: ran out of time (wide kernels), is skipped saying so.
SIDES = (4, *range(1, 4), *range(5, 129))
_SEARCH_SECONDS = 20.0
#: The strides the search tries, as its messages say.
_STRIDES = ", stride 1 to 4"


def any_grid(spec: GridNetworkSpec, module, rng, transfers: tuple[bool, ...] | None = None,
             sides: tuple[int, ...] = SIDES) -> tuple | str | None:
    """The sizes of ``_grid`` for a grid step of another composition: with its transfer (if any) at stride 2, then at
    stride 1, then without it (``transfers``: those tried, by default both), with 3 input channels, then with as many
    as features (R = 1 and F ending on the features need them), on each of ``sides`` in turn (4 × 4 pixels first);
    the first whose F(u) and R u land on one grid and channels; where none does, strides 3 and 4 alike (a
    shortcut's R u may meet F(u) only there). Else why not: ``None`` (its module refused every one), ``"small"``
    (some outputs were empty on the largest side: a larger image may run it), or ``"budget"`` (``_SEARCH_SECONDS``
    ran out)."""
    if transfers is None:
        transfers = (True, False) if module.TRANSFER_PARAMETERS else (False,)
    start, small, largest = time.perf_counter(), False, max(sides)
    for strides in ((2, 1), (3, 4)) if spec.reads_stride else ((None,),):
        for side, channels, transfer, stride in ((side, channels, transfer, stride) for side in sides
                                                 for channels in (3, 4) for transfer in transfers for stride in strides):
            if time.perf_counter() - start > _SEARCH_SECONDS:
                return "budget"
            pixels, params, function, adjoint, options, _ = _grid(module, rng, transfer, "", channels, side)
            options = {**options, "stride": stride} if spec.reads_stride else {"eps": options["eps"]}
            try:
                output = function(pixels, params, **options)
            except ValueError as error:  # refused; GridTooSmall: a grid of no nodes, the image too small for its kernels
                small = small or (side == largest and isinstance(error, getattr(module, "GridTooSmall", ())))
                continue
            if np.size(output) == 0:  # an empty output all the same (a module that does not refuse it)
                small = small or side == largest
                continue
            return (pixels, params, function, adjoint, options,
                    f"one step of {spec.name} (2 images of {channels} channels on {side} × {side}, d = 4"
                    + (f", stride {stride}" if spec.reads_stride else "") + (", with its transfer)" if transfer else ")"))
    return "small" if small else None


def _transfer_unrun(spec: GridNetworkSpec, module, rng, described: str) -> list[Check]:
    """Where the adjoint tests run a grid step without its transfer (no image tried ran it with), a check saying
    whether any image runs the transfer at all: a shortcut whose R u never lands on F(u)'s grid fails (the file's
    transfer can never run; its adjoint is untested), one not found within the search's limits is skipped saying so.
    None where the tests ran the transfer, or the step has none."""
    if not module.TRANSFER_PARAMETERS or described.endswith("with its transfer)"):
        return []
    found = any_grid(spec, module, rng, (True,))
    statement = "The step runs with its transfer on some image, and its emitted vjp is tested there."
    check_id = f"adjoint-test/{spec.name}/transfer"
    if isinstance(found, tuple):
        pixels, params, function, adjoint, options, described = found
        return _adjoint_check(spec, pixels, params, function, adjoint, options, described, f"{spec.name}/transfer")
    if found in ("small", "budget"):
        return [Check(check_id, spec.name, statement, SKIPPED, True,
                      "no image tried runs the step with its transfer (" + (
                          "the images were too small for its kernels)" if found == "small"
                          else f"the search's {_SEARCH_SECONDS:g} s ran out)"))]
    return [Check(check_id, spec.name, statement, "numeric", False,
                  f"no image runs the step with its transfer: on 1 × 1 to {SIDES[-1]} × {SIDES[-1]} pixels (3 or 4 "
                  f"input channels, d = 4{_STRIDES if spec.reads_stride else ''}) its R u never lands on F(u)'s grid "
                  "and channels, so the file's transfer can never run; the tests ran without it")]


_BUILDERS = {
    "vit": _vit,
    "cvt": _cvt,
    "resnet-block": lambda module, rng: _grid(module, rng, True, "one step of resnet-block (2 images of 3 channels "
                                              "on 4 × 4, d = 4, stride 2 with its shortcut transfer)"),
    "unet-level": lambda module, rng: _grid(module, rng, False, "one step of unet-level (2 images of 3 channels on "
                                            "4 × 4, d = 4, stride-2 descent, transposed-convolution ascent)"),
}


def network_adjoint_tests(spec: NetworkSpec | str) -> list[Check]:
    """The dot-product and Taylor tests of the network's emitted ``vjp`` (or ``vjp_logits``), at
    the sizes written for its family (the built-in network whose composition it shares)."""
    spec = load_network(spec) if isinstance(spec, str) else spec
    family = network_family(spec)
    rng = np.random.default_rng(71)
    if family is not None:
        module = network_module(spec)
        pixels, params, function, adjoint, options, described = _BUILDERS[family](module, rng)
        described = described.replace(family, spec.name, 1)  # the sizes are the family's, the network this file's
    elif isinstance(spec, GridNetworkSpec):  # any other grid step: the first of the grid sizes its grids accept
        module = network_module(spec)
        found = any_grid(spec, module, rng)
        pixels, params, function, adjoint, options, described = found if isinstance(found, tuple) else (None,) * 6
    statement = "The emitted vjp passes the dot-product and Taylor tests."
    if family is None and not isinstance(spec, GridNetworkSpec):
        return [unwritten_family(f"adjoint-test/{spec.name}", spec, statement)]
    if family is None and pixels is None and found in ("small", "budget"):
        why = (f"an image of {SIDES[-1]} × {SIDES[-1]} pixels is still too small for its kernels (an empty output)"
               if found == "small" else f"no image tried in {_SEARCH_SECONDS:g} s runs the step (wide kernels)")
        return [Check(f"adjoint-test/{spec.name}", spec.name, statement, SKIPPED, True, why)]
    if family is None and pixels is None:  # its F(u) and R u never meet: the step cannot run on any image
        return [Check(f"adjoint-test/{spec.name}", spec.name, statement, "numeric", False,
                      f"no image runs the step: on 1 × 1 to {SIDES[-1]} × {SIDES[-1]} pixels (3 or 4 input channels, "
                      f"d = 4{_STRIDES if spec.reads_stride else ''}, with and without its transfer) its module refuses "
                      "every one, its F(u) and R u landing on different grids or channels")]
    if isinstance(spec, GridNetworkSpec) and not spec.reads_stride:  # unet-level: its file fixes each stride
        options = {key: value for key, value in options.items() if key != "stride"}
    checks = _adjoint_check(spec, pixels, params, function, adjoint, options, described)
    if family is None and isinstance(spec, GridNetworkSpec):
        checks += _transfer_unrun(spec, module, rng, described)
    return checks


def _adjoint_check(spec, pixels, params, function, adjoint, options, described, name=None) -> list[Check]:
    """The dot-product and Taylor tests of ``adjoint`` (a ``vjp``) against ``function`` at ``pixels``, ``params``."""
    name = name or spec.name
    x = {"input": pixels, **params}

    def forward(point: Point) -> np.ndarray:
        output = function(point["input"], {key: point[key] for key in params}, **options)
        return output[0] if isinstance(output, tuple) else output

    def vjp(point: Point, costate: np.ndarray) -> Point:
        grad_input, grads = adjoint(point["input"], {key: point[key] for key in params}, costate, **options)
        return {"input": grad_input, **{key: grads.get(key, np.zeros_like(point[key])) for key in params}}

    return adjoint_tests(name, spec.name, described, forward, vjp, x, 72)
