"""Exact recovery of whole models, stage by stage, with negative controls.

The derived stages of a model (embedding, each step, the final projection, the readout)
are evaluated entry by entry (``evaluate``) and compared with the reference formulas
(``vision_references``): symbolically at a tiny size, numerically in 50-digit arithmetic
at a small one. The negative controls run the same comparison on a wrongly derived model
(a patch grid with the wrong stride, attention with the wrong score scale) and must fail.
"""

from __future__ import annotations

import random
from dataclasses import replace

import sympy as sp
from sympy.core.cache import clear_cache

from splitformer.symbolic.activations import activation as lookup_activation
from splitformer.symbolic.domains import FEATURES, HEAD_FEATURES, HEADS, HIDDEN, TOKENS
from splitformer.symbolic.evaluate import evaluate
from splitformer.symbolic.image import CHANNELS, CLASSES, COLS, ROWS, X1
from splitformer.symbolic.network_spec import NetworkSpec, load_network, network_fingerprint
from splitformer.symbolic.network_derivation import derive_network
from splitformer.symbolic.network_pieces import INPUT
from splitformer.symbolic.network_program import NetworkProgram
from splitformer.symbolic.stages import discretize_stage, stage_program
from splitformer.symbolic.operators import EPSILON
from splitformer.symbolic.vision_operators import IMAGE, PATCH, PatchEmbedding
from splitformer.symbolic.references import layer_norm, reference_block
from splitformer.symbolic.vision_references import class_token_head, patch_embedding
from . import SKIPPED, Check
from .equivariance import equivariance_check
from .recovery import evaluation_inputs, symbolic_parameters, vanishes

__all__ = ["network_statement_checks", "vit_checks", "vit_difference", "wrong_stride", "wrong_scale"]

_DIGITS = 50


def _matrix(table: dict, rows: int, cols: int) -> sp.Matrix:
    return sp.Matrix(rows, cols, lambda i, k: table[(i, k)])


def vit_difference(model: NetworkProgram, dims: dict, value, eps, fresh=None,
                   digits: int | None = None) -> list[sp.Expr]:
    """Derived − reference, stage by stage, each stage fed the same state on both sides.

    Returns every entry of the initial condition, of each step's output, of the final
    projection and of the logits. The next stage starts from ``fresh(stage, derived)``:
    new symbols (symbolic mode: each stage is then compared as a function of its input, so
    the composition agrees exactly), or the derived state evaluated to a number. ``digits``: numeric values,
    the derived side evaluated in that many digits (``evaluate``'s mpmath closures; SymPy's arithmetic on
    ``Float`` trees took 4 times as long).
    """
    patch, channels, height, width = dims["patch"], dims["channels"], dims["height"], dims["width"]
    d, heads, classes = dims["d"], dims["heads"], dims["classes"]
    rows, cols = height // patch, width // patch
    n = 1 + rows * cols
    sizes = {PATCH: patch, CHANNELS.size: channels, ROWS.size: rows, COLS.size: cols, TOKENS.size: n,
             FEATURES.size: d, HEADS.size: heads, HEAD_FEATURES.size: d // heads, HIDDEN.size: dims["hidden"],
             CLASSES.size: classes}
    activation = lookup_activation(model.spec.scheme.activation)
    (embedding,), (head_stage,) = model.parts["embedding"], model.parts["readout"]
    step, final_norm = model.blocks["step"], model.blocks["final"]
    differences: list[sp.Expr] = []

    def image(c, a, b):
        return value("I", c, a, b)

    embed = {name: (lambda *index, name=name: value(f"embed.{name}", *index)) for name in ("W", "b", "cls", "pos")}
    inputs = {"image": image, **{f"embed_{name}": entry for name, entry in embed.items()}}
    grid = evaluate(stage_program(embedding), sizes, inputs, digits=digits)[embedding.output]
    u = sp.Matrix(n, d, lambda i, l: embed["pos"](i, l) + (embed["cls"](l) if i == 0
                                                            else grid[((i - 1) // cols, (i - 1) % cols, l)]))
    differences += list(u - patch_embedding(image, embed, channels, height, width, patch, d))
    u = fresh("embed", u)
    for layer in range(dims["layers"]):
        params = symbolic_parameters(step, sizes, lambda name, i, j, layer=layer: value(f"layers.{layer}.{name}", i, j))
        inputs = evaluation_inputs(step, params, u, d // heads)
        derived = _matrix(evaluate(step, sizes, inputs, eps=eps, digits=digits)[step.output], n, d)
        differences += list(derived - reference_block("pre-ln", u, params, heads, eps, activation))
        u = fresh(f"layer{layer}", derived)
    final = symbolic_parameters(final_norm, sizes, lambda name, i, j: value(name, i, j))
    inputs = evaluation_inputs(final_norm, final, u, 1)
    derived = _matrix(evaluate(final_norm, sizes, inputs, eps=eps, digits=digits)[final_norm.output], n, d)
    differences += list(derived - layer_norm(u, final, "final_norm", eps))
    u = fresh("final", derived)
    head = {name: sp.Matrix(*shape, lambda i, j, name=name: value(name, i, j))
            for name, shape in (("head.W", (d, classes)), ("head.b", (classes, 1)))}
    readout = {"u": lambda i, l: u[i, l], "head_W": lambda k, o: head["head.W"][k, o],
               "head_b": lambda o: head["head.b"][o]}
    logits = evaluate(stage_program(head_stage), sizes, readout, digits=digits)[head_stage.output]
    expected = class_token_head(u, head)
    return differences + [logits[(o,)] - expected[0, o] for o in range(classes)]


def _symbolic(name, i, *rest):
    return sp.Symbol(f"{name}[{','.join(str(k) for k in (i, *rest))}]", real=True)


def _numbers(seed: str):
    generator = random.Random(seed)
    numbers: dict = {}

    def value(name, *index):
        if (name, index) not in numbers:
            numbers[(name, index)] = sp.Float(generator.uniform(-1, 1), _DIGITS)
        return numbers[(name, index)]

    return value


#: Tiny symbolic size: a 2×2 patch grid of 1×1 patches, 2 features; small numeric size.
SYMBOLIC = {"patch": 1, "channels": 1, "height": 2, "width": 2, "d": 2, "heads": 1, "hidden": 2, "layers": 1,
            "classes": 1}
NUMERIC = {"patch": 2, "channels": 2, "height": 2, "width": 4, "d": 8, "heads": 2, "hidden": 6, "layers": 2,
           "classes": 3}


def _symbolic_holds(model: NetworkProgram) -> tuple[bool, str]:
    # SymPy's cache, full of an earlier check's trees, compares each new tree with its equal-hash entries node by node:
    # ViT's wrong-stride control took 75 s after `check vit` in the same process, 9 s from an empty cache
    clear_cache()

    def fresh(stage, matrix):
        return sp.Matrix(*matrix.shape, lambda i, k: sp.Symbol(f"u_{stage}[{i},{k}]", real=True))

    difference = vit_difference(model, SYMBOLIC, _symbolic, EPSILON, fresh)
    failing = [position for position, entry in enumerate(difference) if not vanishes(entry)]
    return not failing, ("every entry of derived − reference expands to 0" if not failing
                         else f"entries {failing} of derived − reference (row-major, logits last) do not vanish")


def _numeric_error(model: NetworkProgram) -> sp.Float:
    difference = vit_difference(model, NUMERIC, _numbers(model.name), sp.Float("1e-6", _DIGITS),
                                lambda stage, matrix: matrix.evalf(_DIGITS), _DIGITS)
    return max(abs(sp.N(entry, _DIGITS)) for entry in difference)


class _StridedPatches(PatchEmbedding):
    """A wrongly derived embedding: patch corners every ``P + 1`` pixels (negative control)."""

    def positions(self):
        positions = super().positions()
        return {symbol: position.xreplace({PATCH: PATCH + 1}) for symbol, position in positions.items()}


def wrong_stride(model: NetworkProgram) -> NetworkProgram:
    embedding = _StridedPatches(model.spec.embedding.key)
    return model.with_stage(discretize_stage(embedding, {IMAGE: model.parts["embedding"][0].tensors[INPUT]}))


def wrong_scale(model: NetworkProgram) -> NetworkProgram:
    """Attention scores scaled by ``1/N_e`` instead of ``1/√N_e`` (negative control)."""
    wrong = {sp.Pow(HEAD_FEATURES.size, -sp.Rational(1, 2)): 1 / HEAD_FEATURES.size}
    records = [replace(record, evaluations=tuple(
        replace(evaluation, assignments=tuple(replace(a, rhs=a.rhs.xreplace(wrong)) for a in evaluation.assignments))
        for evaluation in record.evaluations)) for record in model.blocks["step"].records]
    return replace(model, blocks={**model.blocks, "step": replace(model.blocks["step"], records=records)})


def vit_checks(model: NetworkProgram) -> list[Check]:
    """Exact recovery of the vit model, symbolic and numeric, and its negative controls."""
    name = model.spec.name
    scheme = model.spec.scheme
    statement = (f"The derived {name} model (patch embedding, class node and position term, steps of "
                 f"'{scheme.name}' ({scheme.activation}){', the final projection' if model.spec.final_norm else ''}, "
                 "class-token head) equals the published "
                 "ViT with every parameter free")
    published = load_network("vit")
    equivariance = equivariance_check(f"{name}/translation-equivariance", name, model.parts["embedding"][0].assignments[0],
                                      X1.index, 1, PATCH)
    if network_fingerprint(model.spec) != network_fingerprint(published):  # another computation than the ViT's
        reason = (f"skipped: {name} steps '{model.spec.scheme.name}' ({model.spec.scheme.activation}), the published "
                  f"ViT '{published.scheme.name}' ({published.scheme.activation}) with a final LayerNorm; its semantics "
                  "check compares it with the evaluator of its own scheme")
        return [equivariance, *(Check(f"recovery/{name}/{method}", name, statement + ".", SKIPPED, True, reason)
                                for method in ("symbolic", "numeric"))]
    holds, detail = _symbolic_holds(model)
    error = _numeric_error(model)
    tolerance = sp.Float(10) ** (-40)
    controls = {"stride P + 1": _numeric_error(wrong_stride(model)), "score scale 1/N_e": _numeric_error(wrong_scale(model))}
    caught = all(value > tolerance for value in controls.values())
    return [
        equivariance,
        Check(f"recovery/{name}/symbolic", name,
              statement + ": exactly, stage by stage (each stage a function of a symbolic input), for a 2×2 patch grid (1×1 patches), 1 channel, 2 features, 1 head, d_ff = 2, "
              "1 step, 1 class, symbolic ε.", "symbolic", holds, detail),
        Check(f"recovery/{name}/numeric", name,
              statement + ": numerically in 50-digit arithmetic, a 1×2 grid of 2×2 patches, 2 channels, 8 features, "
              "2 heads, d_ff = 6, 2 steps, 3 classes, ε = 1e-6.", "numeric", bool(error < tolerance),
              f"max |derived − reference| = {sp.N(error, 3)}"),
        Check(f"{name}/negative-controls", name,
              "The numeric recovery check rejects a wrongly derived model: patch corners every P + 1 pixels "
              "(wrong stride), and attention scores scaled by 1/N_e (wrong scale).", "numeric", caught,
              "; ".join(f"{label}: max |derived − reference| = {sp.N(value, 3)}" for label, value in controls.items())),
    ]


def network_statement_checks(spec: NetworkSpec, groups: frozenset[str] = frozenset({"recovery", "adjoint"})
                             ) -> list[Check]:
    """The checks of a network in ``groups``, by its composition (a token network's: where its embedding and readout
    are ViT's): ``recovery``, its stages against the published network and its structure's statements; ``adjoint``,
    its derived adjoint against central differences."""
    from .network_adjoint import cvt_adjoint_checks, grid_adjoint_checks, network_adjoint_checks

    program = derive_network(spec)
    if program.composition == "cvt":
        from .cvt_checks import cvt_checks

        statements, adjoint = cvt_checks, cvt_adjoint_checks
    elif program.composition == "grid":
        from .grid_checks import grid_checks

        statements, adjoint = grid_checks, grid_adjoint_checks
    elif (spec.embedding.kind, spec.readout.kind) == ("patch-embedding", "class-token-head"):
        statements, adjoint = vit_checks, network_adjoint_checks
    else:
        return []
    return [*(statements(program) if "recovery" in groups else ()), *(adjoint(program) if "adjoint" in groups else ())]
