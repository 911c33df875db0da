"""Checks of a whole network's derived adjoint against finite differences (not reverse mode).

- ``adjoint/<network>/finite-difference``: for each piece of the network (the embedding with
  the initial condition on the tokens, one step, the final projection, the readout), the
  directional derivative ``⟨λ, dΦ[δ]⟩`` by a central difference in 50-digit arithmetic
  equals ``⟨gradient, δ⟩`` from the derived adjoint, through the input and every control;
- ``adjoint/<network>/negative-control``: with the sign of one adjoint assignment of the
  embedding flipped, the same comparison fails.

Grid steps (``resnet-block``, ``unet-level``) are checked per transfer; ``cvt`` per program
(``symbolic.cvt_pieces``: the embedding, a step, the stage's outputs, the readout, each with
the chaining between its operators), its negative controls flipping a sign in chaining assignments.
"""

from __future__ import annotations

import sympy as sp

from splitformer.symbolic.cnn_operators import STRIDE
from splitformer.symbolic.domains import FEATURES, HEAD_FEATURES, HEADS, HIDDEN, TOKENS
from splitformer.symbolic.image import CHANNELS, CLASSES, COLS, KERNEL_ROWS, ROWS
from splitformer.symbolic.adjoint import derive_adjoint
from splitformer.symbolic.cvt_pieces import KEY_COLS, KEY_ROWS
from splitformer.symbolic.cvt_operators import KEYS, config_symbol
from splitformer.symbolic.network_program import NetworkProgram
from splitformer.symbolic.vision_operators import PATCH
from . import SKIPPED, Check
from .adjoint import TOLERANCE, finite_difference_gap, flip_sign

__all__ = ["network_adjoint_checks", "grid_adjoint_checks", "cvt_adjoint_checks", "CVT_CONTROLS"]

#: 2 × 1 patches of 2 × 2 pixels, 2 channels: 3 tokens (the class node first), 2 classes.
_SIZES = {CHANNELS.size: 2, ROWS.size: 2, COLS.size: 1, PATCH: 2, KERNEL_ROWS.size: 2, CLASSES.size: 2,
          TOKENS.size: 3}
_DESCRIPTION = "2 channels, 2 × 1 patches of 2 × 2 pixels (3 tokens), 4 features, 1 head, d_ff = 3, 2 classes"


def _checks(name: str, statement: str, adjoints: dict, sizes: tuple[dict, str], flipped: str,
            positive: frozenset[str] = frozenset()) -> list[Check]:
    """The finite-difference check of every adjoint in ``adjoints`` and the negative control:
    the same comparison for ``adjoints[flipped]`` with the sign of one adjoint assignment flipped.
    ``sizes``: the sizes and their description."""
    sizes, description = sizes
    gaps = {piece: finite_difference_gap(adjoint, f"{name}/{piece}", sizes, positive, None)
            for piece, adjoint in adjoints.items()}
    original = adjoints[flipped]
    changed = flip_sign(original)
    control = finite_difference_gap(changed, f"{name}/{flipped}", sizes, positive, None)
    where = next(record.title for record, kept in zip(changed.records, original.records) if record != kept)
    compared = [gap for gap in gaps.values() if gap is not None]
    statement = (f"The derived adjoint of {statement} ({', '.join(gaps)}) gives the directional derivative of "
                 "⟨λ, output⟩ along a random direction through the input and every control: central difference "
                 f"(step 1e-20) in 50-digit arithmetic at {description}, ε = 1e-3.")
    control_statement = (f"With the sign of one adjoint assignment flipped ({flipped}: {where}), the finite-difference "
                         "comparison fails: the check can fail.")
    return [
        Check(f"adjoint/{name}/finite-difference", name, statement, "numeric" if compared else SKIPPED,
              bool(max(compared, default=0) < TOLERANCE),
              "relative gaps " + ", ".join(f"{piece} {_shown(gap)}" for piece, gap in gaps.items())
              + f" (tolerance {sp.N(TOLERANCE, 2)})"),
        Check(f"adjoint/{name}/negative-control", name, control_statement,
              "numeric" if control is not None else SKIPPED, control is None or bool(control > TOLERANCE),
              f"relative gap with the flipped sign {_shown(control)}"),
    ]


def _shown(gap: sp.Float | None) -> str:
    """A gap of ``finite_difference_gap`` (None: 0 against 0 at every point) in words."""
    return (f"not compared: the derivative and its difference quotient are 0 at each of the random points tried"
            if gap is None else str(sp.N(gap, 3)))


def network_adjoint_checks(program: NetworkProgram) -> list[Check]:
    """The finite-difference checks of a token network's derived adjoint (each piece) and their negative control."""
    pieces, blocks = program.pieces, program.blocks
    programs = {"embedding": pieces["embedding"].program, "step": blocks["step"], "final projection": blocks.get("final"),
                "readout": pieces["readout"].program}
    return _checks(program.spec.name, f"each piece of {program.spec.name}",
                   {piece: derive_adjoint(value) for piece, value in programs.items() if value is not None},
                   (_SIZES, _DESCRIPTION), "embedding")


#: A 2 × 2 grid, 2 channels in and out, stride 1: every convolution reads the zero padding.
_GRID_SIZES = {CHANNELS.size: 2, FEATURES.size: 2, ROWS.size: 2, COLS.size: 2, STRIDE: 1}
_GRID_DESCRIPTION = ("a 2 × 2 grid, 2 channels, stride 1, zero padding (BatchNorm's statistics are controls too; "
                     "variances and shifts in (1, 3))")


def grid_adjoint_checks(program: NetworkProgram) -> list[Check]:
    """The finite-difference checks of a grid step's derived adjoint (each transfer) and their negative control."""
    variants = {"step_with": "R = transfer", "step_identity": "R = 1"}
    adjoints = {variants[name]: piece.adjoint for name, piece in program.pieces.items()}
    # variances positive; BatchNorm shifts positive too, so that the ReLUs pass most of the field
    positive = frozenset(array for adjoint in adjoints.values() for array, tensor in adjoint.forward.tensors.items()
                         if tensor.role == "param" and tensor.parameter.endswith((".var", ".bias")))
    return _checks(program.spec.name, f"one step of {program.spec.name}", adjoints, (_GRID_SIZES, _GRID_DESCRIPTION),
                   "R = 1", positive)


def _cvt_sizes(cls: bool) -> dict:
    """A 2 × 2 grid (and the class node), 2 channels in, 2 features, 1 head; the embedding's kernel 2
    with stride 1 and padding 1, the projections' kernel 3 with padding 1: Q of stride 1 on the 2 × 2
    grid, K and V of stride 2 on a 1 × 1 key grid (every convolution reads the zero padding)."""
    config = {config_symbol(name): value for name, value in
              (("patch_size", 2), ("patch_stride", 1), ("patch_padding", 1), ("kernel_qkv", 3), ("stride_q", 1),
               ("padding_q", 1), ("stride_kv", 2), ("padding_kv", 1))}
    return {CHANNELS.size: 2, ROWS.size: 2, COLS.size: 2, FEATURES.size: 2, TOKENS.size: 4 + cls,
            KEY_ROWS: 1, KEY_COLS: 1, KEYS.size: 1 + cls, CLASSES.size: 2, HEADS.size: 1, HEAD_FEATURES.size: 2,
            HIDDEN.size: 3} | config


_CVT_DESCRIPTION = ("2 channels, a 2 × 2 grid (4 token nodes, 5 with the class node), the embedding's kernel 2 "
                    "(stride 1, padding 1), the projections' kernel 3 (padding 1; Q stride 1, K and V stride 2 on "
                    "a 1 × 1 key grid), 2 features, 1 head, d_ff = 3, 2 classes")
#: The chaining assignments whose sign the negative controls flip: program → costate array.
CVT_CONTROLS = {"step_cls": ("norm1_out_bar", "u1_bar"), "embedding_cls": ("embed_norm_out_bar",)}


def cvt_adjoint_checks(program: NetworkProgram) -> list[Check]:
    """The finite-difference check of every program of CvT's derived adjoint (the chaining between
    operators included) and its negative controls (a sign flipped in a chaining assignment)."""
    adjoints = {name: piece.adjoint for name, piece in program.pieces.items()}
    positive = frozenset(array for adjoint in adjoints.values() for array, tensor in adjoint.forward.tensors.items()
                         if tensor.role == "param" and tensor.parameter.endswith(".var"))
    sizes = {name: _cvt_sizes(name.endswith("_cls") or name == "node") for name in adjoints}
    gaps = {name: finite_difference_gap(adjoint, f"{program.spec.name}/{name}", sizes[name], positive)
            for name, adjoint in adjoints.items()}
    controls = {f"{name}: {target}": finite_difference_gap(flip_sign(adjoints[name], target), f"{program.spec.name}/{name}",
                                                         sizes[name], positive)
                for name, targets in CVT_CONTROLS.items() for target in targets}
    return [
        Check(f"adjoint/{program.spec.name}/finite-difference", program.spec.name,
              f"The derived adjoint of every program of {program.spec.name} ({', '.join(gaps)}: the chaining between "
              "operators included) gives the directional derivative of ⟨λ, output⟩ along a random direction "
              "through the input and every control: central difference (step 1e-20) in 50-digit arithmetic at "
              f"{_CVT_DESCRIPTION}, ε = 1e-3.",
              "numeric", bool(max(gaps.values()) < TOLERANCE),
              "relative gaps " + ", ".join(f"{name} {sp.N(gap, 3)}" for name, gap in gaps.items())
              + f" (tolerance {sp.N(TOLERANCE, 2)})"),
        Check(f"adjoint/{program.spec.name}/negative-control", program.spec.name,
              "With the sign of one chaining assignment flipped (the costate of the projected tokens, which "
              "collects the transposes of the class-node/grid split and of the token concatenations; the "
              "residual sum; the class node's join), the finite-difference comparison fails: the check can fail.",
              "numeric", bool(min(controls.values()) > TOLERANCE),
              "relative gaps with the flipped sign " + ", ".join(f"{name} {sp.N(gap, 3)}"
                                                                 for name, gap in controls.items())),
    ]
