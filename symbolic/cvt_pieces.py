r"""CvT as the programs its module runs and reverse mode differentiates, the chaining included.

A CvT stage is its token embedding, ``N_s`` steps and, at the end, its outputs; each is one
program whose every assignment, the chaining between operators included, is in index
notation, so that reverse mode derives the whole adjoint:

- ``embedding``: the strided convolution, its grid as tokens (``t[N_2 p + q, l] = K[l, p, q]``),
  the projection onto ``S_1``; with the class node, ``u[0, l] = c_l`` and the grid after it
  (``u[1 + N_2 p + q, l]``);
- ``step``: the projection onto ``S_1``, its grid field (the token nodes after the class node,
  ``g[l, p, q] = n[o + N_2 p + q, l]``), the three convolutional projections (K and V on the
  key grid ``(f, h)``), the token concatenations (``q_in[0, l] = n[0, l]``, ``q_in[o + N_2 p
  + q, l] = B[l, p, q]``), attention, the residual sum ``u_1 = u_0 + Δt A``, the projection
  onto ``S_1``, the feed-forward field and ``u_2 = u_1 + Δt F``;
- ``grid``: the last step's tokens as the stage's grid (what the next stage convolves, and
  ``last_hidden_state``); ``node``: the class node (``cls_token_value``); ``readout``: the
  projection onto ``S_1`` of the class node and the linear head.

``o`` is 1 in a stage with the class node (variants ``*_cls``) and 0 without. The adjoints of
the layout assignments are the transposes (a split's is a concatenation, a concatenation's a
split); the class node's costate collects its three readers; the residual sums pass the
costate on and add the field's. The costate runs readout → node → stages (last first): steps
(last first) → embedding → the previous stage's ``grid``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import sympy as sp

from .domains import FEATURES, X, Y
from .cvt_operators import KEY
from .image import COLS, X1, X2
from .latex import equation
from .network_program import Piece
from .program import Assignment, Evaluation, Program, SubstepRecord, Tensor
from .stages import Stage, field_tensor, stage_record

__all__ = ["cvt_programs", "KEY_ROWS", "KEY_COLS"]

#: The key grid of K and V (stride ``stride_kv``): its sizes and indices.
KEY_ROWS, KEY_COLS = sp.Symbol("N^{k}_1", integer=True, positive=True), sp.Symbol("N^{k}_2", integer=True, positive=True)
_PK, _QK = sp.Idx("f", KEY_ROWS), sp.Idx("h", KEY_COLS)
_P, _Q, _L = X1.index, X2.index, Y.index
#: CvT's stages and residual sums by part (``symbolic.cvt``): the token embedding, one step, the readout.
Parts = Mapping[str, tuple]


def _record(title: str, assignments) -> SubstepRecord:
    return SubstepRecord(title, "", (Evaluation(title, "chaining", "", tuple(assignments)),), None)


def _on_key_grid(stage: Stage) -> Stage:
    """A K or V projection stage computed on the key grid ``(f, h)`` instead of ``(p, q)``."""
    moved = {_P: _PK, _Q: _QK}
    tensors = {name: replace(tensor, indices=tuple(index.xreplace(moved) for index in tensor.indices))
               for name, tensor in stage.tensors.items()}
    names = {name: tensor.latex for name, tensor in tensors.items()}
    assignments = tuple(Assignment(lhs, rhs, a.meaning, a.continuous, equation(lhs, rhs, names))
                        for a in stage.assignments for lhs, rhs in [(a.lhs.xreplace(moved), a.rhs.xreplace(moved))])
    return Stage(stage.operator, tensors, assignments)


class _Builder:
    """Assignments and arrays of one program; the chaining arrays are temporaries."""

    def __init__(self, name: str):
        self.name, self.tensors, self.records, self.sizes = name, {}, [], {}

    def stage(self, stage: Stage, chained: tuple[str, ...] = ()) -> None:
        """Add ``stage``; its inputs named in ``chained`` are arrays of this program, not inputs."""
        for key, tensor in stage.tensors.items():
            if key in chained:
                tensor = replace(tensor, role="temp")
            self.tensors.setdefault(key, tensor)
        self.records.append(stage_record(stage))
        self.sizes.update(getattr(stage.operator, "sizes", dict)())

    def array(self, name: str, latex: str, indices, role: str = "temp") -> sp.IndexedBase:
        self.tensors.setdefault(name, field_tensor(name, latex, indices, role))
        return sp.IndexedBase(name)

    def chain(self, title: str, rows) -> None:
        """``rows``: ``(lhs, rhs, meaning)``, each written as an assignment with its LaTeX."""
        names = {key: tensor.latex for key, tensor in self.tensors.items()}
        self.records.append(_record(title, (Assignment(lhs, rhs, meaning, quadrature=equation(lhs, rhs, names))
                                            for lhs, rhs, meaning in rows)))

    def piece(self, output: str, input_name: str) -> Piece:
        """The program with output ``output``, whose adjoint returns the costate of ``input_name``."""
        return Piece(Program(self.name, dict(self.tensors), list(self.records), output), input_name, dict(self.sizes))


def _grid_nodes(offset: int, rows=_P, cols=_Q, n_cols=COLS.size) -> sp.Expr:
    """The token node of grid point ``(p, q)``: after the class node (``offset``), row by row."""
    return offset + n_cols * rows + cols


def _embedding(name: str, parts: Parts, cls: bool) -> Piece:
    conv, norm = parts["embedding"]
    build = _Builder(f"{name}_embedding{'_cls' if cls else ''}")
    build.stage(conv)
    tokens = build.array("tokens", "t", (X.index, _L))
    build.chain("the grid as tokens", [(tokens[_grid_nodes(0), _L], sp.IndexedBase(conv.output)[_L, _P, _Q],
                                         "grid point (p, q) is token node N_2 p + q")])
    build.stage(norm, ("tokens",))
    if not cls:
        return build.piece(norm.output, "u0")
    build.tensors["cls"] = Tensor("cls", "c", (_L,), "param", "cls", (FEATURES,))
    node = sp.IndexedBase("cls")
    state = build.array("x0", "u^{(0)}", (X.index, _L))
    build.chain("the class node joins", [
        (state[0, _L], node[_L], "the class node is token node 0"),
        (state[_grid_nodes(1), _L], sp.IndexedBase(norm.output)[_grid_nodes(0), _L],
         "grid point (p, q) is token node 1 + N_2 p + q")])
    return build.piece("x0", "u0")


def _step(name: str, parts: Parts, cls: bool) -> Piece:
    offset = 1 if cls else 0
    norm1, *projections, attention, first, norm2, ffn, second = parts["step"]
    build = _Builder(f"{name}_step{'_cls' if cls else ''}")
    build.stage(norm1)
    normed = sp.IndexedBase(norm1.output)
    grid = build.array("grid", "g", (_L, _P, _Q))
    build.chain("the grid field of the tokens", [(grid[_L, _P, _Q], normed[_grid_nodes(offset), _L],
                                                   f"grid point (p, q) is token node {offset} + N_2 p + q")])
    projected = {}
    for conv, norm, letter in zip(projections[0::2], projections[1::2], "qkv"):
        if letter != "q":
            conv, norm = _on_key_grid(conv), _on_key_grid(norm)
        build.stage(conv, ("grid",))
        build.stage(norm)
        projected[letter] = norm.output
    rows = []
    for letter in "qkv":
        node = X if letter == "q" else KEY
        target = build.array(f"{letter}_in", f"{letter}_{{in}}", (node.index, _L))
        if cls:
            rows.append((target[0, _L], normed[0, _L], "the class node joins unconvolved"))
        position = _grid_nodes(offset) if letter == "q" else _grid_nodes(offset, _PK, _QK, KEY_COLS)
        indices = (_L, _P, _Q) if letter == "q" else (_L, _PK, _QK)
        rows.append((target[position, _L], sp.IndexedBase(projected[letter])[indices],
                     f"{'grid' if letter == 'q' else 'key grid'} point after the class node" if cls else
                     f"{'grid' if letter == 'q' else 'key grid'} point, row by row"))
    build.chain("queries on the token nodes; keys and values on the key nodes", rows)
    build.stage(attention, ("q_in", "k_in", "v_in"))
    build.array(first.target, "u_{1}", (X.index, _L))
    build.chain("residual sum", [(first.lhs, first.rhs, first.meaning)])
    build.stage(norm2, (first.target,))
    build.stage(ffn, (norm2.output,))
    build.array(second.target, "u_{2}", (X.index, _L))
    build.chain("residual sum", [(second.lhs, second.rhs, second.meaning)])
    return build.piece(second.target, "u0")


def _tokens_input(build: _Builder) -> sp.IndexedBase:
    return build.array("u", "u", (X.index, _L), "input")


def _grid(name: str, cls: bool) -> Piece:
    build = _Builder(f"{name}_grid{'_cls' if cls else ''}")
    tokens = _tokens_input(build)
    hidden = build.array("hidden", "g", (_L, _P, _Q))
    build.chain("the stage's grid", [(hidden[_L, _P, _Q], tokens[_grid_nodes(1 if cls else 0), _L],
                                      "grid point (p, q) of token node " + ("1 + " if cls else "") + "N_2 p + q")])
    return build.piece("hidden", "u")


def _node(name: str) -> Piece:
    build = _Builder(f"{name}_node")
    tokens = _tokens_input(build)
    node = build.array("node", "c", (X.index, _L))
    build.chain("the class node", [(node[0, _L], tokens[0, _L], "token node 0")])
    return build.piece("node", "u")


def _readout(name: str, parts: Parts) -> Piece:
    final, head = parts["readout"]
    build = _Builder(f"{name}_readout")
    build.stage(final)
    build.stage(head, (final.output,))
    return build.piece(head.output, "cls")


def cvt_programs(name: str, parts: Parts) -> dict[str, Piece]:
    """Every program of CvT's adjoint, in the order the forward runs them."""
    return {"embedding": _embedding(name, parts, False), "embedding_cls": _embedding(name, parts, True),
            "step": _step(name, parts, False), "step_cls": _step(name, parts, True), "grid": _grid(name, False),
            "grid_cls": _grid(name, True), "node": _node(name), "readout": _readout(name, parts)}
