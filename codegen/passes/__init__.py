"""Rewrites of the tensor IR, one per module; each takes a ``Module`` and returns one.

``DEFAULT`` lists the passes ``codegen.lowering.lower`` runs, in order; any subset may be
switched off (``passes=()`` for none, ``splitformer derive --passes``): the emitted code
stays correct, only slower or less compact.
"""

from .. import bool_values, logistic
from .attention_adjoint import attention_adjoint
from .convolution import convolution
from .convolution_adjoint import convolution_adjoint
from .fold_affine import fold_affine
from .fuse_projections import fuse_projections
from .fused_attention import fused_attention
from .gelu import gelu
from .gelu_adjoint import gelu_adjoint
from .gelu_tanh import gelu_tanh
from .inline_elementwise import inline_elementwise
from .kept_layer_norm import kept_layer_norm
from .layer_norm import layer_norm
from .layer_norm_adjoint import layer_norm_adjoint
from .local_kernel import local_kernel
from .masked_sums import masked_sums
from .matmul import matmul
from .one_hot import one_hot
from .pair_tables import pair_tables
from .reuse_buffers import reuse_buffers
from .rms_norm import rms_norm
from .scratch_outputs import scratch_outputs
from .shared_trig import shared_trig
from .silu import silu
from .silu_adjoint import silu_adjoint
from .unroll_pairs import unroll_pairs

__all__ = ["DEFAULT", "AFTER_NUMBERS", "NETWORK_STAGE", "NETWORK_ADJOINT_STAGE", "PASSES", "select", "run_passes", "network_passes"]

PASSES = {
    "inline-elementwise": inline_elementwise,
    "local-kernel": local_kernel,
    "one-hot": one_hot,
    "layer-norm-adjoint": layer_norm_adjoint,
    "layer-norm": layer_norm,
    "kept-layer-norm": kept_layer_norm,
    "rms-norm": rms_norm,
    "gelu": gelu,
    "gelu-tanh": gelu_tanh,
    "silu": silu,
    "silu-adjoint": silu_adjoint,
    "gelu-adjoint": gelu_adjoint,
    "convolution-adjoint": convolution_adjoint,
    "unroll-pairs": unroll_pairs,
    "shared-trig": shared_trig,
    "pair-tables": pair_tables,
    "attention-adjoint": attention_adjoint,
    "fused-attention": fused_attention,
    "matmul": matmul,
    "fuse-projections": fuse_projections,
    "reuse-buffers": reuse_buffers,
    "scratch-outputs": scratch_outputs,
    "masked-sums": masked_sums,
}
DEFAULT = tuple(PASSES.values())
#: The passes that read ``bool_values.as_numbers``' form, so run after it.
AFTER_NUMBERS = (masked_sums,)
#: The passes the networks' derived programs run for its forward (``codegen.stage_render``): their convolutions
#: recognized, an inference BatchNorm after one folded into its kernel and bias, fused; a dead product or
#: convolution output holds the elementwise map that reads it (torch: without autograd only); a convolution output
#: that dies inside the program is marked for memory kept between calls (NumPy).
NETWORK_STAGE = (convolution, inline_elementwise, fold_affine, layer_norm, gelu, fused_attention, matmul, reuse_buffers,
                 scratch_outputs)
#: The passes a network program's derived backward runs on the forward statements it recomputes and on its adjoint:
#: the activations as one call each, their adjoints as the libraries' backward kernels (each rewrites one
#: elementwise statement's formula, so the arrays the two share keep their names), a convolution's kernel gradient
#: and its input's costate as one op each.
NETWORK_ADJOINT_STAGE = (gelu, gelu_tanh, silu, silu_adjoint, gelu_adjoint, convolution_adjoint)


def network_passes(selected: tuple | None = None, stage: tuple = NETWORK_STAGE) -> tuple:
    """The passes of ``stage`` (a network program's forward: ``NETWORK_STAGE``) that run: each that is a selectable
    pass only when ``selected`` (``None``: all) holds it; the recognitions ``convolution`` and ``fold_affine``
    always."""
    chosen = DEFAULT if selected is None else selected
    return tuple(rewrite for rewrite in stage if rewrite in chosen or rewrite not in DEFAULT)


def run_passes(module, passes: tuple = DEFAULT):
    """``module`` rewritten by each of ``passes`` in turn, then its bool values cast where arithmetic needs numbers
    (``codegen.bool_values``) and its quotients by ``1 + e^{s}`` written as logistic functions (``codegen.logistic``),
    neither a pass nor ever switched off, then by those of ``passes`` that read that form (``AFTER_NUMBERS``)."""
    for rewrite in passes:
        if rewrite not in AFTER_NUMBERS:
            module = rewrite(module)
    module = logistic.sigmoids(bool_values.as_numbers(module))
    for rewrite in passes:
        if rewrite in AFTER_NUMBERS:
            module = rewrite(module)
    return module


def select(names: str) -> tuple:
    """``"all"``, ``"none"`` or a comma-separated list of pass names, in canonical order."""
    from splitformer.symbolic.errors import SplitformerError

    if names == "all":
        return DEFAULT
    if names == "none":
        return ()
    chosen = [name.strip() for name in names.split(",") if name.strip()]
    if not chosen:
        raise SplitformerError(f"the pass list {names!r} names no pass (write 'none' for no passes, 'all' for every one)")
    if {"all", "none"} & set(chosen):
        raise SplitformerError(f"the pass list {names!r}: 'all' and 'none' stand alone, not in a list of pass names")
    unknown = [name for name in chosen if name not in PASSES]
    if unknown:
        raise SplitformerError(f"unknown pass {unknown[0]!r} (known: {', '.join(PASSES)}, all, none)")
    return tuple(rewrite for name, rewrite in PASSES.items() if name in chosen)
